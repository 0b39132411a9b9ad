-- find reads the job that holds the identity (owner, key): {now} when the
-- identity key names no job (or a job whose keys are gone), else {now, the
-- job's fields and body in JOB_FIELDS_BODY order, its attempts hash as a
-- flat array}. One step, one snapshot; it changes nothing: the caller
-- judges expiry and applies leases by now, as the other reads do.
--
-- KEYS: identity
-- ARGV: bucket prefix
--
-- The job's keys are named after the id stored under the identity key, in
-- the identity's bucket, as in reserve (see doc.go).
local now = fmt(now_us())
local id = redis.call('GET', KEYS[1])
if not id then
	return {now}
end
local jkey, akey = ARGV[1] .. 'j:' .. id, ARGV[1] .. 'a:' .. id
local fields = redis.call('HMGET', jkey, unpack(JOB_FIELDS_BODY))
if not fields[1] then
	return {now}
end
return {now, fields, redis.call('HGETALL', akey)}
