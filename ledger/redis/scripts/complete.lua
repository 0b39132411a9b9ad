-- complete offers an attempt's result to its job: compare-and-swap on the
-- version the attempt read, an empty result slot, an attempt still starting
-- or unknown, and its deadline not passed by the server's clock. A loser is
-- recorded as lost and its result dropped; a cancelled attempt stays
-- cancelled, a lost one keeps its reason. A repeat by the winner reports
-- that it won, with the job as it is now (fsm.Complete).
--
-- KEYS: job, attempts, leases, expiry
-- ARGV: bucket prefix, attempt id, version, status, header, body, size, stored
CTX.leases, CTX.expiry, CTX.channel = KEYS[3], KEYS[4], ARGV[1] .. 'jobs'
local now = now_us()
local J = load_current(KEYS[1], KEYS[2], now)
if not J then
	return {'not_found'}
end
local A = load_attempts(J)
local a = find(J, A, ARGV[2])
if not a then
	return {'not_found'}
end
if J.by == a.id then
	-- A repeat by the winner: its body may have been saved since (SaveBody).
	return job_answer('won', now, J, true)
end
if J.ver == tonumber(ARGV[3]) and J.by == '' and running(a) and now < a.dl then
	bump(J)
	win(J, a, ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], now)
	reindex(J, A)
	return job_answer('won', now, J, false)
end
if a.s ~= 'cancelled' and a.s ~= 'lost' then
	local reason = LATE_SETTLED
	if now >= a.dl then
		reason = LATE_DEADLINE
	end
	finish(J, a, 'lost', reason, now)
end
apply_leases(J, A, now) -- an unbeaten lost result leaves the job unknown
reindex(J, A)
return job_answer('lost', now, J, true)
