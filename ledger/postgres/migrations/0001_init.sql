-- onejob ledger, version 1: jobs, attempts, and the transitions of SPEC
-- section 1 as functions, so that each transition is one round trip and one
-- transaction. Objects are created in the ledger's schema (the connection's
-- search_path); notifications go to the channel "<schema>.jobs".

CREATE TABLE jobs (
	id                  uuid PRIMARY KEY,
	owner_hash          bytea       NOT NULL,
	key_hash            bytea       NOT NULL,
	fingerprint         bytea       NOT NULL,
	fingerprint_version integer     NOT NULL,
	state               text        NOT NULL CHECK (state IN ('pending', 'unknown', 'completed', 'failed')),
	version             bigint      NOT NULL,
	completed_by        uuid,
	attempt_count       integer     NOT NULL,
	retention           interval    NOT NULL,
	created_at          timestamptz NOT NULL,
	completed_at        timestamptz,
	expires_at          timestamptz,
	-- The latest deadline of the job's starting attempts: a pending job
	-- whose lease_until passed reads as unknown.
	lease_until         timestamptz,
	response_status     integer,
	response_header     bytea,
	response_body       bytea,
	response_size       bigint,
	response_stored     boolean     NOT NULL DEFAULT false,
	CONSTRAINT jobs_owner_key UNIQUE (owner_hash, key_hash)
);
CREATE INDEX jobs_expires_at ON jobs (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX jobs_state ON jobs (state, id);

CREATE TABLE attempts (
	id          uuid        PRIMARY KEY,
	job_id      uuid        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
	number      integer     NOT NULL,
	provider    text        NOT NULL,
	state       text        NOT NULL CHECK (state IN ('starting', 'succeeded', 'lost', 'failed', 'unknown', 'cancelled')),
	job_version bigint      NOT NULL,
	started_at  timestamptz NOT NULL,
	deadline    timestamptz NOT NULL,
	finished_at timestamptz,
	error       text,
	CONSTRAINT attempts_job_number UNIQUE (job_id, number)
);
CREATE INDEX attempts_live ON attempts (deadline) WHERE state = 'starting';
CREATE INDEX attempts_provider ON attempts (provider, job_id);

CREATE FUNCTION notify_job(p_job uuid) RETURNS void LANGUAGE sql AS $$
	SELECT pg_notify(current_schema() || '.jobs', p_job::text);
$$;

-- refresh_lease records the job's starting attempts whose deadline passed as
-- unknown, recomputes lease_until, and makes a pending job unknown when no
-- attempt is left to settle it. The caller holds the job's row lock.
CREATE FUNCTION refresh_lease(p_job uuid, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
	n integer;
BEGIN
	UPDATE attempts SET state = 'unknown', finished_at = deadline, error = 'lease expired'
	WHERE job_id = p_job AND state = 'starting' AND deadline <= p_now;
	GET DIAGNOSTICS n = ROW_COUNT;
	UPDATE jobs SET
		lease_until = (SELECT max(deadline) FROM attempts WHERE job_id = p_job AND state = 'starting'),
		state = CASE
			WHEN state = 'pending' AND completed_by IS NULL
				AND NOT EXISTS (SELECT 1 FROM attempts WHERE job_id = p_job AND state = 'starting')
				AND EXISTS (SELECT 1 FROM attempts WHERE job_id = p_job AND state = 'unknown')
			THEN 'unknown' ELSE state END
	WHERE id = p_job;
	IF n > 0 THEN
		PERFORM notify_job(p_job);
	END IF;
	RETURN n;
END $$;

-- reserve creates the job for (owner, key) with attempt 1, or reports what
-- exists, re-opening a failed job and replacing an expired one in place.
-- The UNIQUE constraint on (owner_hash, key_hash) decides who is first.
CREATE FUNCTION reserve(
	p_job uuid, p_attempt uuid, p_owner bytea, p_key bytea, p_fp bytea, p_fpv integer,
	p_provider text, p_lease_us bigint, p_retention_us bigint,
	OUT outcome text, OUT ts timestamptz,
	OUT job_id uuid, OUT job_state text, OUT job_version bigint, OUT completed_by uuid,
	OUT created_at timestamptz, OUT completed_at timestamptz, OUT expires_at timestamptz,
	OUT response_status integer, OUT response_header bytea, OUT response_body bytea,
	OUT response_size bigint, OUT response_stored boolean,
	OUT attempt_id uuid, OUT attempt_number integer, OUT attempt_provider text,
	OUT attempt_state text, OUT attempt_version bigint, OUT attempt_started timestamptz,
	OUT attempt_deadline timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	a attempts%ROWTYPE;
	lease interval := p_lease_us * interval '1 microsecond';
	keep interval := p_retention_us * interval '1 microsecond';
	locked boolean := false;
BEGIN
	LOOP
		ts := clock_timestamp();
		INSERT INTO jobs AS t (id, owner_hash, key_hash, fingerprint, fingerprint_version, state,
			version, attempt_count, retention, created_at, lease_until)
		VALUES (p_job, p_owner, p_key, p_fp, p_fpv, 'pending', 1, 1, keep, ts, ts + lease)
		ON CONFLICT (owner_hash, key_hash) DO NOTHING
		RETURNING t.* INTO j;
		IF FOUND THEN
			INSERT INTO attempts AS t VALUES (p_attempt, j.id, 1, p_provider, 'starting', 1, ts, ts + lease)
			RETURNING t.* INTO a;
			outcome := 'created';
			EXIT;
		END IF;

		-- The key is taken. Most answers need no lock: read first.
		SELECT * INTO j FROM jobs t WHERE t.owner_hash = p_owner AND t.key_hash = p_key;
		CONTINUE WHEN NOT FOUND; -- removed meanwhile: insert again
		ts := clock_timestamp();
		IF j.expires_at IS NULL OR j.expires_at > ts THEN
			IF j.fingerprint <> p_fp OR j.fingerprint_version <> p_fpv THEN
				outcome := 'mismatch';
				EXIT;
			ELSIF j.state = 'completed' OR j.completed_by IS NOT NULL THEN
				outcome := 'done';
				EXIT;
			ELSIF j.state = 'pending' AND j.lease_until > ts THEN
				outcome := 'in_flight';
				EXIT;
			ELSIF j.state = 'unknown' THEN
				outcome := 'unknown';
				EXIT;
			END IF;
		END IF;

		-- Failed, expired, or a lease ran out: change it under the row lock.
		SELECT * INTO j FROM jobs t WHERE t.id = j.id FOR UPDATE;
		CONTINUE WHEN NOT FOUND; -- removed or replaced meanwhile
		ts := clock_timestamp();
		IF j.expires_at IS NOT NULL AND j.expires_at <= ts THEN
			DELETE FROM attempts t WHERE t.job_id = j.id;
			UPDATE jobs t SET id = p_job, fingerprint = p_fp, fingerprint_version = p_fpv,
				state = 'pending', version = 1, completed_by = NULL, attempt_count = 1,
				retention = keep, created_at = ts, completed_at = NULL, expires_at = NULL,
				lease_until = ts + lease, response_status = NULL, response_header = NULL,
				response_body = NULL, response_size = NULL, response_stored = false
			WHERE t.id = j.id
			RETURNING t.* INTO j;
			INSERT INTO attempts AS t VALUES (p_attempt, j.id, 1, p_provider, 'starting', 1, ts, ts + lease)
			RETURNING t.* INTO a;
			outcome := 'created';
			EXIT;
		END IF;
		IF j.fingerprint <> p_fp OR j.fingerprint_version <> p_fpv THEN
			outcome := 'mismatch';
			EXIT;
		END IF;
		PERFORM refresh_lease(j.id, ts);
		SELECT * INTO j FROM jobs t WHERE t.id = j.id;
		IF j.state = 'failed' AND j.completed_by IS NULL THEN
			UPDATE jobs t SET state = 'pending', version = t.version + 1, attempt_count = t.attempt_count + 1,
				completed_at = NULL, expires_at = NULL, lease_until = ts + lease
			WHERE t.id = j.id
			RETURNING t.* INTO j;
			INSERT INTO attempts AS t VALUES (p_attempt, j.id, j.attempt_count, p_provider, 'starting',
				j.version, ts, ts + lease)
			RETURNING t.* INTO a;
			outcome := 'reopened';
		ELSIF j.state = 'completed' OR j.completed_by IS NOT NULL THEN
			outcome := 'done';
		ELSIF j.state = 'pending' AND j.lease_until > ts THEN
			outcome := 'in_flight';
		ELSE
			outcome := 'unknown';
		END IF;
		EXIT;
	END LOOP;

	job_id := j.id; job_state := j.state; job_version := j.version; created_at := j.created_at;
	IF outcome = 'mismatch' THEN
		RETURN; -- never the other request's answer
	END IF;
	completed_by := j.completed_by; completed_at := j.completed_at; expires_at := j.expires_at;
	IF outcome = 'done' THEN
		response_status := j.response_status; response_header := j.response_header;
		response_body := j.response_body; response_size := j.response_size;
		response_stored := j.response_stored;
		RETURN;
	END IF;
	IF outcome IN ('in_flight', 'unknown') THEN
		IF j.state = 'pending' AND j.lease_until <= ts THEN
			job_state := 'unknown';
		END IF;
		SELECT * INTO a FROM attempts t
		WHERE t.job_id = j.id AND t.state IN ('starting', 'unknown')
		ORDER BY (t.state = 'starting' AND t.deadline > ts) DESC, t.deadline DESC
		LIMIT 1;
	END IF;
	IF a.id IS NOT NULL THEN
		attempt_id := a.id; attempt_number := a.number; attempt_provider := a.provider;
		attempt_state := CASE WHEN a.state = 'starting' AND a.deadline <= ts THEN 'unknown' ELSE a.state END;
		attempt_version := a.job_version; attempt_started := a.started_at; attempt_deadline := a.deadline;
	END IF;
END $$;

-- complete offers an attempt's result to its job: compare-and-swap on the
-- version the attempt read, an empty result slot and the attempt's deadline.
-- A loser is recorded as lost and its result dropped.
CREATE FUNCTION complete(
	p_job uuid, p_attempt uuid, p_version bigint,
	p_status integer, p_header bytea, p_body bytea, p_size bigint, p_stored boolean,
	OUT outcome text, OUT job_state text, OUT job_version bigint, OUT completed_by uuid,
	OUT completed_at timestamptz, OUT expires_at timestamptz,
	OUT response_status integer, OUT response_header bytea, OUT response_body bytea,
	OUT response_size bigint, OUT response_stored boolean)
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	ts timestamptz := clock_timestamp();
BEGIN
	UPDATE jobs t SET state = 'completed', version = t.version + 1, completed_by = p_attempt,
		completed_at = ts, expires_at = ts + t.retention, lease_until = NULL,
		response_status = p_status, response_header = p_header, response_body = p_body,
		response_size = p_size, response_stored = p_stored
	WHERE t.id = p_job AND t.version = p_version AND t.completed_by IS NULL
		AND (t.expires_at IS NULL OR t.expires_at > ts)
		AND EXISTS (SELECT 1 FROM attempts x WHERE x.id = p_attempt AND x.job_id = p_job
			AND x.state IN ('starting', 'unknown') AND x.deadline > ts)
	RETURNING t.* INTO j;
	IF FOUND THEN
		-- The job is completed: its lease no longer matters (reads apply
		-- the attempts' own deadlines), so no refresh_lease here.
		UPDATE attempts t SET state = 'succeeded', finished_at = ts WHERE t.id = p_attempt;
		PERFORM notify_job(p_job);
		outcome := 'won';
	ELSE
		SELECT * INTO j FROM jobs t WHERE t.id = p_job FOR UPDATE;
		IF NOT FOUND OR (j.expires_at IS NOT NULL AND j.expires_at <= ts)
			OR NOT EXISTS (SELECT 1 FROM attempts x WHERE x.id = p_attempt AND x.job_id = p_job) THEN
			outcome := 'not_found';
			RETURN;
		END IF;
		UPDATE attempts t SET state = 'lost', finished_at = ts,
			error = CASE WHEN t.deadline <= ts THEN 'result arrived after attempt_deadline'
				ELSE 'result arrived after the job was settled' END
		WHERE t.id = p_attempt AND t.state <> 'succeeded';
		PERFORM refresh_lease(p_job, ts);
		SELECT * INTO j FROM jobs t WHERE t.id = p_job;
		outcome := 'lost';
	END IF;
	job_state := j.state; job_version := j.version; completed_by := j.completed_by;
	completed_at := j.completed_at; expires_at := j.expires_at;
	IF j.completed_by IS NOT NULL THEN
		response_status := j.response_status; response_header := j.response_header;
		response_body := j.response_body; response_size := j.response_size;
		response_stored := j.response_stored;
	END IF;
END $$;

-- lock_job locks a job that exists and has not expired, or returns NULL.
CREATE FUNCTION lock_job(p_job uuid, p_now timestamptz) RETURNS jobs
LANGUAGE sql AS $$
	SELECT * FROM jobs WHERE id = p_job AND (expires_at IS NULL OR expires_at > p_now) FOR UPDATE;
$$;

-- fail records a definitive failure of an attempt, then starts the next
-- attempt (failover) or, when nothing else runs, fails the job.
CREATE FUNCTION fail(
	p_job uuid, p_attempt uuid, p_reason text,
	p_next uuid, p_next_provider text, p_next_lease_us bigint,
	OUT outcome text, OUT attempt_number integer, OUT attempt_version bigint,
	OUT attempt_started timestamptz, OUT attempt_deadline timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	ts timestamptz;
	blocked boolean;
BEGIN
	SELECT * INTO j FROM lock_job(p_job, clock_timestamp());
	IF j.id IS NULL THEN
		outcome := 'not_found';
		RETURN;
	END IF;
	ts := clock_timestamp();
	PERFORM refresh_lease(p_job, ts);
	-- An unknown attempt may still report a definitive failure until its
	-- deadline, but never fail over.
	UPDATE attempts t SET state = 'failed', error = p_reason, finished_at = ts
	WHERE t.id = p_attempt AND t.job_id = p_job
		AND (t.state = 'starting' OR (t.state = 'unknown' AND t.deadline > ts AND p_next IS NULL));
	IF NOT FOUND THEN
		outcome := CASE WHEN EXISTS (SELECT 1 FROM attempts x WHERE x.id = p_attempt AND x.job_id = p_job)
			THEN 'stale' ELSE 'not_found' END;
		RETURN;
	END IF;
	SELECT * INTO j FROM jobs t WHERE t.id = p_job;
	blocked := j.completed_by IS NOT NULL OR j.state IN ('completed', 'failed')
		OR EXISTS (SELECT 1 FROM attempts x WHERE x.job_id = p_job AND x.state IN ('starting', 'unknown'));
	IF blocked THEN
		PERFORM refresh_lease(p_job, ts);
		outcome := CASE WHEN p_next IS NULL THEN 'ok' ELSE 'blocked' END;
	ELSIF p_next IS NOT NULL THEN
		UPDATE jobs t SET state = 'pending', attempt_count = t.attempt_count + 1,
			lease_until = ts + p_next_lease_us * interval '1 microsecond'
		WHERE t.id = p_job
		RETURNING t.* INTO j;
		INSERT INTO attempts VALUES (p_next, p_job, j.attempt_count, p_next_provider, 'starting',
			j.version, ts, ts + p_next_lease_us * interval '1 microsecond');
		outcome := 'next';
		attempt_number := j.attempt_count; attempt_version := j.version;
		attempt_started := ts; attempt_deadline := ts + p_next_lease_us * interval '1 microsecond';
	ELSE
		UPDATE jobs t SET state = 'failed', completed_at = ts, expires_at = ts + t.retention, lease_until = NULL
		WHERE t.id = p_job;
		PERFORM notify_job(p_job);
		outcome := 'ok';
	END IF;
END $$;

-- mark_unknown records that an attempt's outcome is unknown; the job becomes
-- unknown unless a result won. The version is kept.
CREATE FUNCTION mark_unknown(p_job uuid, p_attempt uuid, p_reason text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	s text;
	ts timestamptz;
BEGIN
	SELECT * INTO j FROM lock_job(p_job, clock_timestamp());
	IF j.id IS NULL THEN
		RETURN 'not_found';
	END IF;
	ts := clock_timestamp();
	SELECT state INTO s FROM attempts WHERE id = p_attempt AND job_id = p_job;
	IF NOT FOUND THEN
		RETURN 'not_found';
	ELSIF s = 'starting' THEN
		UPDATE attempts SET state = 'unknown', error = p_reason, finished_at = ts WHERE id = p_attempt;
	ELSIF s <> 'unknown' THEN
		RETURN 'stale';
	END IF;
	UPDATE jobs t SET state = CASE WHEN t.state = 'pending' AND t.completed_by IS NULL THEN 'unknown' ELSE t.state END
	WHERE t.id = p_job;
	PERFORM refresh_lease(p_job, ts);
	PERFORM notify_job(p_job);
	RETURN 'ok';
END $$;

-- hedge starts a concurrent attempt on a pending job, keeping its version.
CREATE FUNCTION hedge(p_job uuid, p_version bigint, p_attempt uuid, p_provider text, p_lease_us bigint,
	OUT outcome text, OUT attempt_number integer, OUT attempt_started timestamptz,
	OUT attempt_deadline timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	ts timestamptz;
BEGIN
	SELECT * INTO j FROM lock_job(p_job, clock_timestamp());
	IF j.id IS NULL THEN
		outcome := 'not_found';
		RETURN;
	END IF;
	ts := clock_timestamp();
	PERFORM refresh_lease(p_job, ts);
	SELECT * INTO j FROM jobs t WHERE t.id = p_job;
	IF j.state <> 'pending' OR j.completed_by IS NOT NULL OR j.version <> p_version THEN
		outcome := 'stale';
		RETURN;
	END IF;
	attempt_started := ts;
	attempt_deadline := ts + p_lease_us * interval '1 microsecond';
	UPDATE jobs t SET attempt_count = t.attempt_count + 1, lease_until = greatest(t.lease_until, attempt_deadline)
	WHERE t.id = p_job
	RETURNING t.attempt_count INTO attempt_number;
	INSERT INTO attempts VALUES (p_attempt, p_job, attempt_number, p_provider, 'starting',
		j.version, ts, attempt_deadline);
	outcome := 'ok';
END $$;

-- resolve settles a job out of band: cancel, or complete with an admin
-- attempt. Running attempts become cancelled and can only lose.
CREATE FUNCTION resolve(p_job uuid, p_cancel boolean, p_admin uuid,
	p_status integer, p_header bytea, p_body bytea)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	ts timestamptz;
BEGIN
	SELECT * INTO j FROM lock_job(p_job, clock_timestamp());
	IF j.id IS NULL THEN
		RETURN 'not_found';
	END IF;
	IF j.state = 'completed' OR j.completed_by IS NOT NULL THEN
		RETURN 'completed';
	END IF;
	ts := clock_timestamp();
	PERFORM refresh_lease(p_job, ts);
	UPDATE attempts SET state = 'cancelled', finished_at = ts, error = 'resolved by an operator'
	WHERE job_id = p_job AND state IN ('starting', 'unknown');
	IF p_cancel THEN
		UPDATE jobs t SET state = 'failed', version = t.version + 1, completed_at = ts,
			expires_at = ts + t.retention, lease_until = NULL
		WHERE t.id = p_job;
	ELSE
		UPDATE jobs t SET state = 'completed', version = t.version + 1, completed_by = p_admin,
			attempt_count = t.attempt_count + 1, completed_at = ts, expires_at = ts + t.retention,
			lease_until = NULL, response_status = p_status, response_header = p_header,
			response_body = p_body, response_size = octet_length(p_body), response_stored = true
		WHERE t.id = p_job
		RETURNING t.* INTO j;
		INSERT INTO attempts VALUES (p_admin, p_job, j.attempt_count, 'admin', 'succeeded',
			j.version, ts, ts, ts, NULL);
	END IF;
	PERFORM notify_job(p_job);
	RETURN 'ok';
END $$;

-- sweep records expired leases as unknown and removes up to p_limit expired
-- jobs (with their attempts).
CREATE FUNCTION sweep(p_limit integer, OUT unknown integer, OUT removed integer)
LANGUAGE plpgsql AS $$
DECLARE
	v_job uuid;
	ts timestamptz := clock_timestamp();
BEGIN
	unknown := 0;
	FOR v_job IN
		SELECT t.id FROM jobs t
		WHERE t.id IN (SELECT DISTINCT x.job_id FROM attempts x WHERE x.state = 'starting' AND x.deadline <= ts LIMIT p_limit)
		FOR UPDATE SKIP LOCKED
	LOOP
		unknown := unknown + refresh_lease(v_job, ts);
	END LOOP;
	WITH gone AS (
		DELETE FROM jobs t WHERE t.id IN (
			SELECT x.id FROM jobs x WHERE x.expires_at <= ts LIMIT p_limit FOR UPDATE SKIP LOCKED)
		RETURNING 1)
	SELECT count(*) INTO removed FROM gone;
END $$;
