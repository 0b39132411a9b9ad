-- mark_unknown records that an attempt's outcome is unknown, and the job's
-- unless a result already won. The version is kept (fsm.MarkUnknown).
--
-- KEYS: job, attempts, leases
-- ARGV: bucket prefix, attempt id, reason
CTX.leases, CTX.channel = KEYS[3], ARGV[1] .. 'jobs'
local now = now_us()
local J = load_current(KEYS[1], KEYS[2], now)
if not J then
	return 'not_found'
end
local A = load_attempts(J)
local a = find(J, A, ARGV[2])
if not a then
	return 'not_found'
end
if a.s == 'starting' then
	finish(J, a, 'unknown', ARGV[3], now)
elseif a.s ~= 'unknown' then
	return 'stale'
end
if J.state == 'pending' and J.by == '' then
	set_state(J, 'unknown')
end
reindex(J, A)
return 'ok'
