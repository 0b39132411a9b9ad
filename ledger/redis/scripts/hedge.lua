-- hedge starts a concurrent attempt for a pending job, keeping its version
-- (fsm.Hedge).
--
-- KEYS: job, attempts, leases
-- ARGV: prefix, version, attempt id, provider, lease us
CTX.leases, CTX.channel = KEYS[3], ARGV[1] .. 'jobs'
local now = now_us()
local J = load_job(KEYS[1], KEYS[2])
if not J or expired(J, now) then
	return {'not_found'}
end
local A = load_attempts(J)
apply_leases(J, A, now)
if J.state ~= 'pending' or J.by ~= '' or J.ver ~= tonumber(ARGV[2]) then
	reindex(J, A)
	return {'stale'}
end
local a = add_attempt(J, A, ARGV[3], ARGV[4], tonumber(ARGV[5]), now)
reindex(J, A)
return {'ok', fmt(now), fmt(a.n), a.v, fmt(a.dl)}
