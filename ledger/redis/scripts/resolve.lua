-- resolve settles a job out of band: cancel (failed, its starting and
-- unknown attempts cancelled), or complete with an attempt whose provider is
-- "admin" and whose id the caller chose. A repeat of a completion (the same
-- attempt id) changes nothing; so does a cancel of a job already failed with
-- nothing starting or unknown (fsm.Resolve).
--
-- KEYS: job, attempts, leases, expiry
-- ARGV: bucket prefix, cancel ('1' or '0'), admin attempt id, status, header, body
CTX.leases, CTX.expiry, CTX.channel = KEYS[3], KEYS[4], ARGV[1] .. 'jobs'
local now = now_us()
local J = load_current(KEYS[1], KEYS[2], now)
if not J then
	return {'not_found'}
end
local A = load_attempts(J)
apply_leases(J, A, now)
local cancel = ARGV[2] == '1'
local repeated = not cancel and J.by ~= '' and J.by == ARGV[3]
if not repeated and (J.by ~= '' or J.state == 'completed') then
	reindex(J, A)
	return {'completed'}
end
if not repeated and not (cancel and J.state == 'failed' and not has_running(J, A)) then
	for i = 1, J.n do
		if running(A[i]) then
			finish(J, A[i], 'cancelled', RESOLVED, now)
		end
	end
	bump(J)
	if cancel then
		settle(J, 'failed', now)
	else
		local a = add_attempt(J, A, ARGV[3], 'admin', '', 0, now)
		win(J, a, ARGV[4], ARGV[5], ARGV[6], fmt(string.len(ARGV[6])), '1', now)
	end
end
reindex(J, A)
return job_answer('ok', now, J, true)
