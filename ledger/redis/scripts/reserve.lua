-- reserve creates the job for (owner, key) with its first attempt, or
-- reports what exists: a mismatch, a completed job, an attempt in flight or
-- unknown. A failed job is re-opened with the given attempt; an expired (or
-- vanished) job is replaced in place: the identity key then names the given
-- job id. A repeat finds the given attempt in the job and answers created
-- (attempt 1) or reopened again, with the attempt as it is now
-- (fsm.Reserve). The reply is {outcome, now, job (job_answer), attempt
-- number}, a mismatch's {outcome, now, what the job may say}, and a new
-- job's {'created', now} alone.
--
-- KEYS: identity, new job, new job's attempts, idx, leases, expiry
-- ARGV: bucket prefix, job id, attempt id, owner hash, key hash, identity (hex),
--       fingerprint, fingerprint version, provider, lease us, retention us,
--       fingerprint scheme, scope
--
-- The existing job's keys are named after the id stored under the identity
-- key, in the identity's bucket: the one place a script touches keys it was
-- not given, always in the slot of the keys it was given (see doc.go).
local prefix = ARGV[1] -- the bucket's
CTX.leases, CTX.expiry, CTX.channel = KEYS[5], KEYS[6], prefix .. 'jobs'
local now = now_us()
local lease = tonumber(ARGV[10])

local id = redis.call('GET', KEYS[1])
if id then
	local J = load_current(prefix .. 'j:' .. id, prefix .. 'a:' .. id, now)
	if J then
		if J.fpv ~= ARGV[8] or J.fp ~= ARGV[7] then
			-- How the job's fingerprint was made, never its answer.
			return {'mismatch', fmt(now), {J.id, J.state, J.created, J.fpv, J.fps or ''}}
		end
		local A = load_attempts(J)
		apply_leases(J, A, now)
		local outcome, num = nil, 0
		local mine = find(J, A, ARGV[3])
		if mine then
			-- A repeat: this call's attempt exists, as the first call left
			-- it or as it went on since.
			num = mine.n
			outcome = 'created'
			if num > 1 then
				outcome = 'reopened'
			end
		elseif J.state == 'completed' or J.by ~= '' then
			outcome = 'done'
		elseif J.state == 'failed' then
			bump(J)
			unsettle(J)
			set_state(J, 'pending')
			num = add_attempt(J, A, ARGV[3], ARGV[9], ARGV[13], lease, now).n
			outcome = 'reopened'
		elseif J.state == 'pending' and has_live(J, A, nil) then
			outcome = 'in_flight'
		else
			outcome = 'unknown'
		end
		reindex(J, A)
		local reply = job_answer(outcome, now, J, true)
		reply[5] = num
		return reply
	end
	-- Gone or expired: remove what is left, and create the job anew (a
	-- repeat of the call that created the expired job creates it again,
	-- as the first call would now).
	redis.call('DEL', prefix .. 'j:' .. id, prefix .. 'a:' .. id)
	redis.call('ZREM', KEYS[4], id)
	redis.call('ZREM', CTX.leases, id)
	redis.call('ZREM', CTX.expiry, id .. '|' .. ARGV[6])
	redis.call(PUBLISH, CTX.channel, id)
end

if redis.call('EXISTS', KEYS[2]) == 1 then
	-- The caller chose an id another key's job holds: never merge them.
	return redis.error_reply('job id ' .. ARGV[2] .. ' is taken by another key')
end
redis.call('DEL', KEYS[3]) -- attempts of a job whose hash is gone
local J = {jkey = KEYS[2], akey = KEYS[3], id = ARGV[2], ident = ARGV[6], ver = 1, n = 0,
	state = 'pending', by = '', ret = tonumber(ARGV[11])}
J.state0 = J.state
redis.call('HSET', J.jkey, 'id', J.id, 'owner', ARGV[4], 'key', ARGV[5], 'ident', J.ident,
	'fp', ARGV[7], 'fpv', ARGV[8], 'fps', ARGV[12], 'state', 'pending', 'ver', '1', 'by', '', 'ret', ARGV[11],
	'created', fmt(now), 'n', '0')
redis.call('SET', KEYS[1], J.id)
redis.call('ZADD', KEYS[4], '0', J.id)
local A = {}
add_attempt(J, A, ARGV[3], ARGV[9], ARGV[13], lease, now)
reindex(J, A)
-- The job is what the call described, at this time: the caller makes it
-- from its own parameters (createdJob), nothing is read back.
return {'created', fmt(now)}
