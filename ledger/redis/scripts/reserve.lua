-- reserve creates the job for (owner, key) with attempt 1, or reports what
-- exists: a mismatch, a completed job, an attempt in flight or unknown. A
-- failed job is re-opened with a new attempt; an expired (or vanished) job
-- is replaced in place: the identity key then names a new job id.
--
-- KEYS: identity, new job, new job's attempts, idx, leases, expiry
-- ARGV: prefix, job id, attempt id, owner hash, key hash, identity (hex),
--       fingerprint, fingerprint version, provider, lease us, retention us
--
-- The existing job's keys are named after the id stored under the identity
-- key: the one place a script touches keys it was not given (see doc.go).
local prefix = ARGV[1]
CTX.leases, CTX.expiry, CTX.channel = KEYS[5], KEYS[6], prefix .. 'jobs'
local now = now_us()
local lease = tonumber(ARGV[10])

local id = redis.call('GET', KEYS[1])
if id then
	local J = load_job(prefix .. 'j:' .. id, prefix .. 'a:' .. id)
	if J and not expired(J, now) then
		if J.fpv ~= ARGV[8] or J.fp ~= ARGV[7] then
			return {'mismatch', fmt(now), {J.id, J.state, J.created}}
		end
		local A = load_attempts(J)
		apply_leases(J, A, now)
		local outcome, num = nil, 0
		if J.state == 'completed' or J.by ~= '' then
			outcome = 'done'
		elseif J.state == 'failed' then
			J.ver = J.ver + 1
			J.expn = nil
			redis.call('HSET', J.jkey, 'state', 'pending', 'ver', fmt(J.ver))
			J.state = 'pending'
			redis.call('HDEL', J.jkey, 'done', 'exp')
			redis.call('PERSIST', J.jkey)
			redis.call('PERSIST', J.akey)
			redis.call('ZREM', CTX.expiry, expiry_member(J))
			num = add_attempt(J, A, ARGV[3], ARGV[9], lease, now).n
			outcome = 'reopened'
		elseif J.state == 'pending' and has_live(J, A, nil) then
			outcome = 'in_flight'
		else
			outcome = 'unknown'
		end
		reindex(J, A)
		return {outcome, fmt(now), job_reply(J, true), redis.call('HGETALL', J.akey), num}
	end
	-- Gone or expired: remove what is left, and create the job anew.
	redis.call('DEL', prefix .. 'j:' .. id, prefix .. 'a:' .. id)
	redis.call('ZREM', KEYS[4], id)
	redis.call('ZREM', CTX.leases, id)
	redis.call('ZREM', CTX.expiry, id .. '|' .. ARGV[6])
	redis.call('PUBLISH', CTX.channel, id)
end

local J = {jkey = KEYS[2], akey = KEYS[3], id = ARGV[2], ident = ARGV[6], ver = 1, n = 0,
	state = 'pending', by = '', ret = tonumber(ARGV[11])}
J.state0 = J.state
redis.call('HSET', J.jkey, 'id', J.id, 'owner', ARGV[4], 'key', ARGV[5], 'ident', J.ident,
	'fp', ARGV[7], 'fpv', ARGV[8], 'state', 'pending', 'ver', '1', 'by', '', 'ret', ARGV[11],
	'created', fmt(now), 'n', '0')
redis.call('SET', KEYS[1], J.id)
redis.call('ZADD', KEYS[4], '0', J.id)
local A = {}
add_attempt(J, A, ARGV[3], ARGV[9], lease, now)
reindex(J, A)
return {'created', fmt(now), job_reply(J, false), redis.call('HGETALL', J.akey), 1}
