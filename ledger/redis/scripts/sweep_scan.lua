-- sweep_scan finds up to limit jobs with a lease that ran out and up to
-- limit jobs whose retention passed, by the server's clock.
--
-- KEYS: leases, expiry
-- ARGV: limit
local now = fmt(now_us())
return {
	redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', '0', ARGV[1]),
	redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', '0', ARGV[1]),
}
