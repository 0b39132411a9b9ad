-- purge removes the jobs it is given that belong to the owner and are
-- settled (completed or failed, leases applied) but for an answer still
-- streaming (its body not saved, the lease of the attempt that sends it
-- running: ledger.Purgeable), with their attempts,
-- their index entries and their identity key if it still names them; it
-- records expired leases of the others, which it keeps. A job already gone
-- leaves the index. When it removed any, it publishes the purge's notice
-- (ledger.PurgeNotice): every instance forgets the owner's answers it kept
-- in memory. It returns the number of jobs removed and kept.
--
-- KEYS: idx, leases, expiry, then job, attempts and identity for each job
-- ARGV: bucket prefix, owner hash, the notice, the job ids
CTX.leases, CTX.expiry, CTX.channel = KEYS[2], KEYS[3], ARGV[1] .. 'jobs'
local now = now_us()
local removed, kept = 0, 0
local k = 4
for i = 4, #ARGV do
	local id = ARGV[i]
	local jkey, akey, ikey = KEYS[k], KEYS[k + 1], KEYS[k + 2]
	k = k + 3
	local J = load_job(jkey, akey)
	if not J then
		redis.call('ZREM', KEYS[1], id)
		redis.call('ZREM', CTX.leases, id)
	elseif J.owner == ARGV[2] then
		local streaming = false
		if not expired(J, now) then
			local A = load_attempts(J)
			apply_leases(J, A, now)
			reindex(J, A)
			local size = tonumber(J.size)
			if J.by ~= '' and J.stored ~= '1' and size and size < 0 then
				local w = find(J, A, J.by)
				streaming = w ~= nil and now < tonumber(w.dl)
			end
		end
		if (J.state == 'completed' or J.state == 'failed') and not streaming then
			redis.call('DEL', jkey, akey)
			redis.call('ZREM', KEYS[1], id)
			redis.call('ZREM', CTX.leases, id)
			redis.call('ZREM', CTX.expiry, expiry_member(J))
			if redis.call('GET', ikey) == id then
				redis.call('DEL', ikey)
			end
			removed = removed + 1
		else
			kept = kept + 1
		end
	end
end
if removed > 0 then
	redis.call(PUBLISH, CTX.channel, ARGV[3])
end
return {removed, kept}
