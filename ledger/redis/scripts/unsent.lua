-- unsent records that an attempt was never sent: it becomes failed, even
-- after it became unknown (by its lease, or by a timeout that ended before
-- its dial failed); the job becomes failed when nothing else settled or
-- blocks it.
-- An attempt already failed is a repeat (fsm.Unsent).
--
-- KEYS: job, attempts, leases, expiry
-- ARGV: bucket prefix, attempt id, reason (ledger.ReasonUnsent)
CTX.leases, CTX.expiry, CTX.channel = KEYS[3], KEYS[4], ARGV[1] .. 'jobs'
local now = now_us()
local J = load_current(KEYS[1], KEYS[2], now)
if not J then
	return 'not_found'
end
local A = load_attempts(J)
apply_leases(J, A, now)
local a = find(J, A, ARGV[2])
local reply = 'ok'
if not a then
	reply = 'not_found'
elseif a.s == 'failed' then
	reply = 'ok' -- a repeat, or a failure recorded otherwise: either way not sent
elseif a.s == 'starting' or a.s == 'unknown' then
	finish(J, a, 'failed', ARGV[3], now)
	after_failure(J, A, a, nil, now)
else
	reply = 'stale'
end
reindex(J, A)
return reply
