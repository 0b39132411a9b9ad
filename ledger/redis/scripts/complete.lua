-- complete offers an attempt's result to its job: compare-and-swap on the
-- version the attempt read, an empty result slot, an attempt still starting
-- or unknown, and its deadline not passed by the server's clock. A loser is
-- recorded as lost and its result dropped (fsm.Complete).
--
-- KEYS: job, attempts, leases, expiry
-- ARGV: prefix, attempt id, version, status, header, body, size, stored
CTX.leases, CTX.expiry, CTX.channel = KEYS[3], KEYS[4], ARGV[1] .. 'jobs'
local now = now_us()
local J = load_job(KEYS[1], KEYS[2])
if not J or expired(J, now) then
	return {'not_found'}
end
local A = load_attempts(J)
local a = find(J, A, ARGV[2])
if not a then
	return {'not_found'}
end
local live = a.s == 'starting' or a.s == 'unknown'
if J.ver == tonumber(ARGV[3]) and J.by == '' and live and now < a.dl then
	J.ver, J.by = J.ver + 1, a.id
	redis.call('HSET', J.jkey, 'ver', fmt(J.ver), 'by', a.id, 'status', ARGV[4], 'hdr', ARGV[5],
		'body', ARGV[6], 'size', ARGV[7], 'stored', ARGV[8])
	settle(J, 'completed', now)
	finish(J, a, 'succeeded', '', now)
	reindex(J, A)
	return {'won', fmt(now), job_reply(J, false), redis.call('HGETALL', J.akey)}
end
if a.s ~= 'succeeded' then
	local reason = 'result arrived after the job was settled'
	if now >= a.dl then
		reason = 'result arrived after attempt_deadline'
	end
	finish(J, a, 'lost', reason, now)
end
apply_leases(J, A, now) -- a result after the deadline leaves the job unknown
reindex(J, A)
return {'lost', fmt(now), job_reply(J, true), redis.call('HGETALL', J.akey)}
