-- lookup claims or settles a reconciler's lookup of an unknown attempt,
-- recorded in the attempt's fields lt (tries), ls (last status), la (last
-- at), ln (next at), ld ("1": a lookup settled the attempt), lh (holder)
-- and lu (the end of the holder's lease; absent once released).
--
-- A claim leases the attempt to the holder until now+lease: the attempt
-- must be unknown, its deadline and its next lookup's time passed, and no
-- lease running; a repeat by the holder while its lease runs succeeds
-- again (fsm.ClaimLookup). A settlement by the holder records the lookup
-- and releases the lease, while the attempt is unknown and the lease runs:
-- a found answer completes the job with it (or, when a result won
-- meanwhile, the attempt is lost), an absent one fails the attempt and
-- then the job when nothing else blocks it, anything else leaves the
-- attempt unknown until now+retry. A settlement whose lease was released
-- already is a repeat (fsm.SettleLookup). Both answer with the job as it is
-- now.
--
-- KEYS: job, attempts, leases, expiry
-- ARGV: bucket prefix, 'claim' or 'settle', attempt id, holder, then
--       for a claim: lease us;
--       for a settlement: lookup status, 'found', 'absent' or 'retry',
--       retry us, reason (ledger.ReasonAbsent), and the found answer's
--       status, header, body
CTX.leases, CTX.expiry, CTX.channel = KEYS[3], KEYS[4], ARGV[1] .. 'jobs'
local now = now_us()
local J, A = load_leased(KEYS[1], KEYS[2], now)
if not J then
	return {'not_found'}
end
local a = find(J, A, ARGV[3])
local holder = ARGV[4]
local outcome = 'ok'
if not a then
	outcome = 'not_found'
elseif ARGV[2] == 'claim' then
	local held = tonumber(a.lu) ~= nil and now < tonumber(a.lu)
	if not (held and a.lh == holder and a.s == 'unknown') then
		if held or a.s ~= 'unknown' or now < a.dl or now < (tonumber(a.ln) or 0) then
			outcome = 'stale'
		else
			redis.call('HSET', J.akey, a.n .. ':lh', holder, a.n .. ':lu', fmt(now + tonumber(ARGV[5])))
		end
	end
elseif (a.lh or '') ~= holder or not (a.lu or a.la) then
	outcome = 'stale' -- not this holder's, or never claimed
elseif a.lu then -- else a repeat: this holder's lookup was recorded
	if a.s ~= 'unknown' or now >= tonumber(a.lu) then
		outcome = 'stale'
	else
		local found = ARGV[6]
		redis.call('HSET', J.akey, a.n .. ':lt', fmt((tonumber(a.lt) or 0) + 1), a.n .. ':ls', ARGV[5],
			a.n .. ':la', fmt(now))
		redis.call('HDEL', J.akey, a.n .. ':lu')
		if found ~= 'retry' then
			redis.call('HSET', J.akey, a.n .. ':ld', '1')
		end
		if found == 'found' and J.by == '' then
			bump(J)
			local body = ARGV[11]
			win(J, a, ARGV[9], ARGV[10], body, fmt(#body), '1', now)
		elseif found == 'found' then
			finish(J, a, 'lost', "the provider's lookup found it acted after another result had won", now)
		elseif found == 'absent' then
			finish(J, a, 'failed', ARGV[8], now)
			after_failure(J, A, a, nil, now)
		else
			redis.call('HSET', J.akey, a.n .. ':ln', fmt(now + tonumber(ARGV[7])))
		end
	end
end
reindex(J, A)
if outcome ~= 'ok' then
	return {outcome}
end
return job_answer('ok', now, J, true)
