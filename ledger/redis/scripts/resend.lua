-- resend starts a re-send to a provider that deduplicates, reconciling an
-- attempt that blocks the job: only while no result won, nothing is
-- starting and the job is at the given version; the job is pending again
-- (fsm.Resend). A repeat (the attempt exists) answers with it as it is now.
--
-- KEYS: job, attempts, leases
-- ARGV: prefix, version, attempt id, provider, lease us, reconciled attempt id
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
else
	local ref = find(J, A, ARGV[6])
	if not ref then
		return {'not_found'}
	end
	if settled(J) or J.ver ~= tonumber(ARGV[2]) or not (ref.s == 'unknown' or (ref.s == 'lost' and blocks(J, ref)))
		or has_live(J, A, '') then
		reply = {'stale'}
	else
		a = add_attempt(J, A, ARGV[3], ARGV[4], tonumber(ARGV[5]), now)
		redis.call('HSET', J.akey, a.n .. ':rs', '1')
		J.state = 'pending'
		redis.call('HSET', J.jkey, 'state', 'pending')
		reply = {'ok', fmt(now), attempt_reply(J, a)}
	end
end
reindex(J, A)
return reply
