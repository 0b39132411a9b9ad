-- hedge starts a concurrent attempt for a pending job, keeping its version.
-- A repeat (the attempt exists) answers with it as it is now (fsm.Hedge).
--
-- KEYS: job, attempts, leases
-- ARGV: bucket prefix, version, attempt id, provider, lease us
CTX.leases, CTX.channel = KEYS[3], ARGV[1] .. 'jobs'
local now = now_us()
local J = load_current(KEYS[1], KEYS[2], now)
if not J then
	return {'not_found'}
end
local A = load_attempts(J)
apply_leases(J, A, now)
local a = find(J, A, ARGV[3])
local reply
if a then
	reply = {'ok', fmt(now), attempt_reply(J, a)}
elseif J.state ~= 'pending' or J.by ~= '' or J.ver ~= tonumber(ARGV[2]) then
	reply = {'stale'}
else
	a = add_attempt(J, A, ARGV[3], ARGV[4], tonumber(ARGV[5]), now)
	reply = {'ok', fmt(now), attempt_reply(J, a)}
end
reindex(J, A)
return reply
