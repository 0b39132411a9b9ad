-- start starts a concurrent attempt beside the job's others, keeping its
-- version: a hedge (no reconciled attempt given) beside a starting attempt
-- of a pending job (fsm.Hedge), or a re-send (the reconciled attempt's id
-- given) to a provider that deduplicates, after an attempt that blocks the
-- job, while no result won and nothing is starting; the job is then
-- pending again (fsm.Resend). A repeat (the attempt exists) answers with it
-- as it is now.
--
-- KEYS: job, attempts, leases, expiry
-- ARGV: bucket prefix, version, attempt id, provider, lease us, reconciled attempt id or '',
--       scope
CTX.leases, CTX.expiry, CTX.channel = KEYS[3], KEYS[4], ARGV[1] .. 'jobs'
local now = now_us()
local J = load_current(KEYS[1], KEYS[2], now)
if not J then
	return {'not_found'}
end
local A = load_attempts(J)
apply_leases(J, A, now)
local a = find(J, A, ARGV[3])
if not a then
	local resend = ARGV[6] ~= ''
	local allowed
	if resend then
		local ref = find(J, A, ARGV[6])
		if not ref then
			return {'not_found'}
		end
		allowed = not settled(J) and (ref.s == 'unknown' or (ref.s == 'lost' and blocks(J, ref)))
			and not has_live(J, A, '')
	else
		allowed = J.state == 'pending' and J.by == ''
	end
	if not allowed or J.ver ~= tonumber(ARGV[2]) then
		return {'stale'}
	end
	a = add_attempt(J, A, ARGV[3], ARGV[4], ARGV[7], tonumber(ARGV[5]), now)
	if resend then
		redis.call('HSET', J.akey, a.n .. ':rs', '1')
		J.state = 'pending'
		redis.call('HSET', J.jkey, 'state', 'pending')
	end
end
reindex(J, A)
return {'ok', fmt(now), attempt_reply(J, a)}
