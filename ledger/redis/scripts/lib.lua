-- lib.lua: helpers shared by every transition script; scripts.go prepends
-- it (after the generated JOB_FIELDS line) to each script. The rules follow
-- ledger/internal/fsm exactly. Times are microseconds since the epoch by the
-- server's clock (TIME); numbers are written back with fmt so that Lua never
-- prints them in exponent notation.

if redis.replicate_commands then
	redis.replicate_commands() -- scripts call TIME before they write (Redis < 5)
end

-- CTX holds the keys and names a script shares with these helpers.
local CTX = {}

local function now_us()
	local t = redis.call('TIME')
	return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function fmt(n)
	return string.format('%.0f', n)
end

-- load_job reads a job's fields (not its body) into a table, or nil.
local function load_job(jkey, akey)
	local vals = redis.call('HMGET', jkey, unpack(JOB_FIELDS))
	if not vals[1] then
		return nil
	end
	local J = {}
	for i, f in ipairs(JOB_FIELDS) do
		J[f] = vals[i]
	end
	J.jkey, J.akey = jkey, akey
	J.ver = tonumber(J.ver)
	J.n = tonumber(J.n)
	J.ret = tonumber(J.ret)
	if not J.by then
		J.by = ''
	end
	if J.exp then
		J.expn = tonumber(J.exp)
	end
	J.state0 = J.state
	return J
end

-- expired: the job's retention has passed. Its keys expire at the next
-- millisecond or later (settle), and Redis judges key expiry by the time the
-- script started, never later than TIME: a job found unexpired here keeps
-- its keys until the script ends.
local function expired(J, now)
	return J.expn ~= nil and now >= J.expn
end

-- load_attempts reads the job's attempts into an array indexed by number.
local function load_attempts(J)
	local flat = redis.call('HGETALL', J.akey)
	local A = {}
	for i = 1, J.n do
		A[i] = {n = i}
	end
	for i = 1, #flat, 2 do
		local f = flat[i]
		local c = string.find(f, ':', 1, true)
		local a = A[tonumber(string.sub(f, 1, c - 1))]
		if a then
			a[string.sub(f, c + 1)] = flat[i + 1]
		end
	end
	for i = 1, J.n do
		A[i].dl = tonumber(A[i].dl)
	end
	return A
end

local function find(J, A, id)
	for i = 1, J.n do
		if A[i].id == id then
			return A[i]
		end
	end
	return nil
end

-- finish sets an attempt's state, error and finished time.
local function finish(J, a, state, reason, at)
	a.s, a.e = state, reason
	redis.call('HSET', J.akey, a.n .. ':s', state, a.n .. ':e', reason, a.n .. ':t1', fmt(at))
end

local function set_state(J, state)
	J.state = state
	redis.call('HSET', J.jkey, 'state', state)
end

-- has_live: an attempt other than except is starting.
local function has_live(J, A, except)
	for i = 1, J.n do
		if A[i].id ~= except and A[i].s == 'starting' then
			return true
		end
	end
	return false
end

-- has_active: an attempt other than except is starting or unknown.
local function has_active(J, A, except)
	for i = 1, J.n do
		local s = A[i].s
		if A[i].id ~= except and (s == 'starting' or s == 'unknown') then
			return true
		end
	end
	return false
end

-- acted: an attempt may have acted without a result kept (unknown, or its
-- result came too late: lost).
local function acted(J, A)
	for i = 1, J.n do
		if A[i].s == 'unknown' or A[i].s == 'lost' then
			return true
		end
	end
	return false
end

-- apply_leases records starting attempts whose deadline passed as unknown,
-- and the job as unknown when nothing else can settle it (fsm.ApplyLeases).
local function apply_leases(J, A, now)
	local n = 0
	for i = 1, J.n do
		local a = A[i]
		if a.s == 'starting' and now >= a.dl then
			finish(J, a, 'unknown', 'lease expired', a.dl)
			n = n + 1
		end
	end
	if J.state == 'pending' and J.by == '' and not has_live(J, A, nil) and acted(J, A) then
		set_state(J, 'unknown')
	end
	return n
end

-- add_attempt starts a new attempt at the job's current version.
local function add_attempt(J, A, id, provider, lease, now)
	local n = J.n + 1
	local a = {n = n, id = id, p = provider, s = 'starting', v = fmt(J.ver), dl = now + lease}
	A[n] = a
	J.n = n
	redis.call('HSET', J.akey, n .. ':id', id, n .. ':p', provider, n .. ':s', 'starting',
		n .. ':v', a.v, n .. ':t0', fmt(now), n .. ':dl', fmt(a.dl), n .. ':e', '')
	redis.call('HSET', J.jkey, 'n', fmt(n))
	return a
end

-- expiry_member names the job in the expiry index: its id and identity, so
-- that the sweeper can remove the identity key once the job is gone.
local function expiry_member(J)
	return J.id .. '|' .. J.ident
end

-- settle completes or fails the job: its keys expire after its retention.
local function settle(J, state, now)
	local exp = now + J.ret
	J.state, J.expn = state, exp
	redis.call('HSET', J.jkey, 'state', state, 'done', fmt(now), 'exp', fmt(exp))
	local at = fmt(math.ceil(exp / 1000))
	redis.call('PEXPIREAT', J.jkey, at)
	redis.call('PEXPIREAT', J.akey, at)
	redis.call('ZADD', CTX.expiry, fmt(exp), expiry_member(J))
end

-- reindex keeps the job's entry in the lease index at the earliest deadline
-- of its starting attempts, and wakes waiters when the job's state changed.
local function reindex(J, A)
	local m = nil
	for i = 1, J.n do
		if A[i].s == 'starting' and (m == nil or A[i].dl < m) then
			m = A[i].dl
		end
	end
	if m then
		redis.call('ZADD', CTX.leases, fmt(m), J.id)
	else
		redis.call('ZREM', CTX.leases, J.id)
	end
	if J.state ~= J.state0 then
		redis.call('PUBLISH', CTX.channel, J.id)
		J.state0 = J.state
	end
end

-- job_reply returns the job's fields in JOB_FIELDS order, then its body when
-- asked for.
local function job_reply(J, with_body)
	if with_body then
		return redis.call('HMGET', J.jkey, unpack(JOB_FIELDS_BODY))
	end
	return redis.call('HMGET', J.jkey, unpack(JOB_FIELDS))
end
