-- resolve settles a job out of band: cancel (failed, its starting and
-- unknown attempts cancelled), or complete with an attempt whose provider is
-- "admin" (fsm.Resolve).
--
-- KEYS: job, attempts, leases, expiry
-- ARGV: prefix, cancel ('1' or '0'), admin attempt id, status, header, body
CTX.leases, CTX.expiry, CTX.channel = KEYS[3], KEYS[4], ARGV[1] .. 'jobs'
local now = now_us()
local J = load_job(KEYS[1], KEYS[2])
if not J or expired(J, now) then
	return {'not_found'}
end
local A = load_attempts(J)
apply_leases(J, A, now)
if J.by ~= '' or J.state == 'completed' then
	reindex(J, A)
	return {'completed'}
end
for i = 1, J.n do
	if A[i].s == 'starting' or A[i].s == 'unknown' then
		finish(J, A[i], 'cancelled', 'resolved by an operator', now)
	end
end
J.ver = J.ver + 1
redis.call('HSET', J.jkey, 'ver', fmt(J.ver))
if ARGV[2] == '1' then
	settle(J, 'failed', now)
else
	local a = add_attempt(J, A, ARGV[3], 'admin', 0, now)
	finish(J, a, 'succeeded', '', now)
	J.by = a.id
	redis.call('HSET', J.jkey, 'by', a.id, 'status', ARGV[4], 'hdr', ARGV[5], 'body', ARGV[6],
		'size', fmt(string.len(ARGV[6])), 'stored', '1')
	settle(J, 'completed', now)
end
reindex(J, A)
return {'ok', fmt(now), job_reply(J, true), redis.call('HGETALL', J.akey)}
