-- sweep records the expired leases of the jobs sweep_scan found as unknown,
-- and removes the expired jobs it found from the indexes, with whatever of
-- their keys has not expired yet and their identity key if it still names
-- them. It returns the number of attempts recorded unknown and of jobs
-- removed.
--
-- KEYS: idx, leases, expiry, then job and attempts for each lease job, then
--       job, attempts and identity for each expired job
-- ARGV: bucket prefix, number of lease jobs, number of expired jobs, the lease job
--       ids, the expiry members (job id '|' identity)
CTX.leases, CTX.expiry, CTX.channel = KEYS[2], KEYS[3], ARGV[1] .. 'jobs'
local now = now_us()
local nl, ne = tonumber(ARGV[2]), tonumber(ARGV[3])
local unknown, removed = 0, 0
local k = 4
for i = 1, nl do
	local J = load_current(KEYS[k], KEYS[k + 1], now)
	k = k + 2
	if not J then
		redis.call('ZREM', CTX.leases, ARGV[3 + i])
	else
		local A = load_attempts(J)
		unknown = unknown + apply_leases(J, A, now)
		reindex(J, A)
	end
end
for i = 1, ne do
	local m = ARGV[3 + nl + i]
	local jkey, akey, ikey = KEYS[k], KEYS[k + 1], KEYS[k + 2]
	k = k + 3
	local score = redis.call('ZSCORE', CTX.expiry, m)
	if score and tonumber(score) <= now then
		local id = string.sub(m, 1, string.find(m, '|', 1, true) - 1)
		if not load_current(jkey, akey, now) then
			redis.call('DEL', jkey, akey)
			redis.call('ZREM', KEYS[1], id)
			redis.call('ZREM', CTX.leases, id)
			if redis.call('GET', ikey) == id then
				redis.call('DEL', ikey)
			end
			removed = removed + 1
		end
		redis.call('ZREM', CTX.expiry, m)
	end
end
return {unknown, removed}
