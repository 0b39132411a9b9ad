-- save_body stores the body of the answer the attempt already won with
-- (fsm.SaveBody), and wakes the waiters: a duplicate on another instance
-- waits for a streamed answer's end to replay it.
--
-- KEYS: job
-- ARGV: attempt id, body, size, stored, bucket prefix
local now = now_us()
local J = load_current(KEYS[1], '', now)
if not J then
	return 'not_found'
end
if J.by ~= ARGV[1] or not J.status then
	return 'stale'
end
redis.call('HSET', J.jkey, 'body', ARGV[2], 'size', ARGV[3], 'stored', ARGV[4])
redis.call(PUBLISH, ARGV[5] .. 'jobs', J.id)
return 'ok'
