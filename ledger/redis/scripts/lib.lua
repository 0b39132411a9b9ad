-- lib.lua: helpers shared by every transition script; scripts.go prepends
-- it (after the generated constants: JOB_FIELDS, JOB_FIELDS_BODY,
-- ATTEMPT_FIELDS, LEASE_EXPIRED, and PUBLISH: the command that wakes
-- waiters, PUBLISH on a single server, SPUBLISH on a cluster) to each
-- script. Every key a script touches is in one bucket (see doc.go), whose
-- key prefix ("bucket prefix") is the first ARGV of the scripts that name
-- keys or the channel themselves. The rules follow
-- ledger/internal/fsm exactly, and live here once. Times are microseconds since the epoch by the
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

-- fmt writes a whole number: every number the scripts keep is one, below
-- 2^53 (where a Lua number is exact). As an integer ('%d'), not a float
-- ('%.0f'): half the time, as a float's digits are slow to print.
local function fmt(n)
	return string.format('%d', n)
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

-- load_current reads a job that exists and has not expired, or nil.
local function load_current(jkey, akey, now)
	local J = load_job(jkey, akey)
	if not J or expired(J, now) then
		return nil
	end
	return J
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

-- running: attempt a is starting or unknown (it may still act, or win).
local function running(a)
	return a.s == 'starting' or a.s == 'unknown'
end

-- has_running: an attempt is starting or unknown.
local function has_running(J, A)
	for i = 1, J.n do
		if running(A[i]) then
			return true
		end
	end
	return false
end

-- blocks: attempt a blocks new attempts (SPEC rule 1): it is starting or
-- unknown, or it is lost while no attempt has won and no operator settled
-- the job since it started (a cancel, and the re-open it allows, increment
-- the version). A cancelled attempt never blocks (fsm.Blocks).
local function blocks(J, a)
	if running(a) then
		return true
	end
	return a.s == 'lost' and J.by == '' and tonumber(a.v) == J.ver
end

-- blocks_any: an attempt other than except blocks new attempts.
local function blocks_any(J, A, except)
	for i = 1, J.n do
		if A[i].id ~= except and blocks(J, A[i]) then
			return true
		end
	end
	return false
end

-- settled: the job has a result or was failed; no attempt can start or win.
local function settled(J)
	return J.by ~= '' or J.state == 'completed' or J.state == 'failed'
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

-- unsettle keeps a settled job that is open again (re-opened, or unknown)
-- from expiring.
local function unsettle(J)
	J.expn = nil
	redis.call('HDEL', J.jkey, 'done', 'exp')
	redis.call('PERSIST', J.jkey)
	redis.call('PERSIST', J.akey)
	redis.call('ZREM', CTX.expiry, expiry_member(J))
end

-- apply_leases records starting attempts whose deadline passed as unknown,
-- and the job as unknown when nothing else can settle it: a pending job
-- with nothing starting, or a failed one that a late result showed a
-- provider acted for, which expires no more (fsm.ApplyLeases).
local function apply_leases(J, A, now)
	local n = 0
	for i = 1, J.n do
		local a = A[i]
		if a.s == 'starting' and now >= a.dl then
			finish(J, a, 'unknown', LEASE_EXPIRED, a.dl)
			n = n + 1
		end
	end
	local open = J.state == 'pending' or J.state == 'failed'
	if open and J.by == '' and not has_live(J, A, nil) and blocks_any(J, A, nil) then
		if J.state == 'failed' then
			unsettle(J)
		end
		set_state(J, 'unknown')
	end
	return n
end

-- load_leased reads a job that exists and has not expired, with its
-- attempts, and records the leases that ran out by now: the opening of a
-- transition. It returns nil when the job is gone.
local function load_leased(jkey, akey, now)
	local J = load_current(jkey, akey, now)
	if not J then
		return nil
	end
	local A = load_attempts(J)
	apply_leases(J, A, now)
	return J, A
end

-- add_attempt starts a new attempt at the job's current version, under
-- the handler scope scope ('' for none).
local function add_attempt(J, A, id, provider, scope, lease, now)
	local n = J.n + 1
	local a = {n = n, id = id, p = provider, s = 'starting', v = fmt(J.ver), dl = now + lease}
	A[n] = a
	J.n = n
	redis.call('HSET', J.akey, n .. ':id', id, n .. ':p', provider, n .. ':s', 'starting',
		n .. ':v', a.v, n .. ':t0', fmt(now), n .. ':dl', fmt(a.dl), n .. ':e', '')
	if scope ~= '' then
		redis.call('HSET', J.akey, n .. ':sc', scope)
	end
	redis.call('HSET', J.jkey, 'n', fmt(n))
	return a
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
		redis.call(PUBLISH, CTX.channel, J.id)
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

-- job_answer is a script's reply that carries the job as it is now:
-- {outcome, now, job fields (and body), attempts as a flat hash}.
local function job_answer(outcome, now, J, with_body)
	return {outcome, fmt(now), job_reply(J, with_body), redis.call('HGETALL', J.akey)}
end

-- attempt_reply returns attempt a as it is now: its number, then its fields
-- in ATTEMPT_FIELDS order (false where absent).
local function attempt_reply(J, a)
	local f = {}
	for i, name in ipairs(ATTEMPT_FIELDS) do
		f[i] = a.n .. ':' .. name
	end
	local r = redis.call('HMGET', J.akey, unpack(f))
	table.insert(r, 1, fmt(a.n))
	return r
end

-- bump increments the job's version.
local function bump(J)
	J.ver = J.ver + 1
	redis.call('HSET', J.jkey, 'ver', fmt(J.ver))
end

-- win gives the result slot to attempt a with this answer: the job
-- completes, the attempt succeeds. The caller bumped the version.
local function win(J, a, status, hdr, body, size, stored, now)
	J.by = a.id
	redis.call('HSET', J.jkey, 'by', a.id, 'status', status, 'hdr', hdr, 'body', body,
		'size', size, 'stored', stored)
	settle(J, 'completed', now)
	finish(J, a, 'succeeded', '', now)
end

-- after_failure starts the next attempt (next: {id, provider, scope, lease}), or
-- fails the job, once attempt a failed; when something blocks, the job is
-- left unknown if nothing else runs (fsm.afterFailure). It returns the
-- reply: {'next', now, attempt}, {'blocked'} or {'ok'}.
local function after_failure(J, A, a, next, now)
	if settled(J) or blocks_any(J, A, a.id) then
		apply_leases(J, A, now)
		if next then
			return {'blocked'}
		end
		return {'ok'}
	end
	if next then
		if J.state ~= 'pending' then
			set_state(J, 'pending')
		end
		local n = add_attempt(J, A, next.id, next.provider, next.scope, next.lease, now)
		return {'next', fmt(now), attempt_reply(J, n)}
	end
	settle(J, 'failed', now)
	return {'ok'}
end
