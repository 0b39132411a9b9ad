-- fail records a definitive failure of an attempt, then starts the next
-- attempt (failover) or, when nothing else is starting or unknown, fails the
-- job. An unknown attempt may still fail definitively before its deadline,
-- but never fail over (fsm.Fail).
--
-- KEYS: job, attempts, leases, expiry
-- ARGV: prefix, attempt id, reason, next ('1' or '0'), next id, next
--       provider, next lease us
CTX.leases, CTX.expiry, CTX.channel = KEYS[3], KEYS[4], ARGV[1] .. 'jobs'
local now = now_us()
local J = load_job(KEYS[1], KEYS[2])
if not J or expired(J, now) then
	return {'not_found'}
end
local A = load_attempts(J)
apply_leases(J, A, now)
local a = find(J, A, ARGV[2])
if not a then
	reindex(J, A)
	return {'not_found'}
end
local next = ARGV[4] == '1'
local late = a.s == 'unknown' and now < a.dl and not next
if a.s ~= 'starting' and not late then
	reindex(J, A)
	return {'stale'}
end
finish(J, a, 'failed', ARGV[3], now)
local blocked = J.by ~= '' or J.state == 'completed' or J.state == 'failed' or has_active(J, A, a.id)
local reply = {'ok'}
if blocked then
	if next then
		reply = {'blocked'}
	end
elseif next then
	if J.state ~= 'pending' then
		set_state(J, 'pending')
	end
	local n = add_attempt(J, A, ARGV[5], ARGV[6], tonumber(ARGV[7]), now)
	reply = {'next', fmt(now), fmt(n.n), n.v, fmt(n.dl)}
else
	settle(J, 'failed', now)
end
reindex(J, A)
return reply
