-- fail records a definitive failure of an attempt, then starts the next
-- attempt (failover) or, when nothing else blocks, fails the job. An unknown
-- attempt may still fail definitively before its deadline, but never fail
-- over. A repeat (the attempt already failed) answers with the next attempt
-- the first call started, as it is now, or blocked if it started none
-- (fsm.Fail).
--
-- KEYS: job, attempts, leases, expiry
-- ARGV: bucket prefix, attempt id, reason, next ('1' or '0'), next id, next
--       provider, next lease us, next scope
CTX.leases, CTX.expiry, CTX.channel = KEYS[3], KEYS[4], ARGV[1] .. 'jobs'
local now = now_us()
local J = load_current(KEYS[1], KEYS[2], now)
if not J then
	return {'not_found'}
end
local A = load_attempts(J)
apply_leases(J, A, now)
local next = nil
if ARGV[4] == '1' then
	next = {id = ARGV[5], provider = ARGV[6], scope = ARGV[8], lease = tonumber(ARGV[7])}
end
local a = find(J, A, ARGV[2])
local reply
if not a then
	reply = {'not_found'}
elseif a.s == 'failed' then
	-- A repeat (fsm.repeatedFailure).
	reply = {'ok'}
	if next then
		local n = find(J, A, next.id)
		if n then
			reply = {'next', fmt(now), attempt_reply(J, n)}
		else
			reply = {'blocked'}
		end
	end
elseif a.s ~= 'starting' and not (a.s == 'unknown' and now < a.dl and not next) then
	reply = {'stale'}
else
	finish(J, a, 'failed', ARGV[3], now)
	reply = after_failure(J, A, a, next, now)
end
reindex(J, A)
return reply
