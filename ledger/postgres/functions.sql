-- onejob ledger functions: the transitions of SPEC section 1, one function
-- call (one round trip, one transaction) each, implementing exactly the
-- rules of ledger/internal/fsm. This file is the one current definition.
--
-- It is applied once per functions version (functionsVersion in
-- postgres.go), into a schema of its own, {{fn}}, next to the ledger's
-- tables: gateways of an earlier release keep calling the functions that
-- migrations 0001 and 0002 created in the ledger's schema, while this
-- release's connections put {{fn}} first in their search_path. Table names
-- are unqualified (the search_path finds the ledger's tables); calls
-- between these functions name {{fn}}, and notifications go to the
-- ledger's channel {{channel}}, which old and new gateways share. The
-- reasons the ledger records itself and the operator's provider name are
-- Go's (placeholders named after the Go constants, replaced by their
-- quoted values); the
-- states are spelled as in Go, which the differential test holds them to
-- (ledger/ledgertest/differential).
--
-- Every transition is idempotent by the ids the gateway chose (job id,
-- attempt ids): applied twice, it has the effect of once and returns what
-- the first application returned.
--
-- Changing this file means a new functions version: CREATE OR REPLACE
-- cannot change a function's result columns, and running gateways keep
-- calling the version they started with.

-- ledger_clock is the ledger's clock: the server's, read afresh at every
-- call (clock_timestamp(), not the transaction's start). Every transition
-- and read takes the time from here, so that the differential test can
-- run them on a clock of its own (ledger/ledgertest/differential).
CREATE FUNCTION {{fn}}.ledger_clock() RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
	SELECT clock_timestamp();
$$;

CREATE FUNCTION {{fn}}.notify_job(p_job uuid) RETURNS void LANGUAGE sql AS $$
	SELECT pg_notify({{channel}}, p_job::text);
$$;

-- announce tells the listeners that job p_job changed, in a transaction of
-- its own that does not wait for its commit to reach the disk. A NOTIFY
-- commits under a lock on the notification queue held until its commit is
-- flushed, so a transition that notified inside its own durable transaction
-- made every other notifying commit wait for that flush: completions
-- committed one at a time (complete took 24 ms, reserve 4 ms, at 1,000
-- fresh requests a second). complete leaves the notification to this call,
-- which the gateway makes once complete returns; a notification is never
-- durable anyway (a listener that reconnects reads its jobs again).
CREATE FUNCTION {{fn}}.announce(p_job uuid) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	PERFORM set_config('synchronous_commit', 'off', true);
	PERFORM {{fn}}.notify_job(p_job);
END $$;

-- lock_job locks a job that exists and has not expired; NULL otherwise.
CREATE FUNCTION {{fn}}.lock_job(p_job uuid, p_now timestamptz) RETURNS jobs
LANGUAGE sql AS $$
	SELECT * FROM jobs WHERE id = p_job AND (expires_at IS NULL OR expires_at > p_now) FOR UPDATE;
$$;

-- open_job opens a transition of job p_job: it locks the job if it exists
-- and has not expired (j.id is NULL otherwise), reads the ledger's clock
-- once the lock is held (ts), records the leases that ran out by then
-- (refresh_lease, fsm.ApplyLeases) and returns the job as it then is.
CREATE FUNCTION {{fn}}.open_job(p_job uuid, OUT j jobs, OUT ts timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
	SELECT * INTO j FROM {{fn}}.lock_job(p_job, {{fn}}.ledger_clock());
	IF j.id IS NULL THEN
		RETURN;
	END IF;
	ts := {{fn}}.ledger_clock();
	PERFORM {{fn}}.refresh_lease(p_job, ts);
	SELECT * INTO j FROM jobs t WHERE t.id = p_job;
END $$;

-- blocks reports whether attempt a of job j blocks new attempts
-- (ledger.Job.BlockedBy, docs/contract.md rule 1): it is starting or
-- unknown, or lost while no result won and no operator settled the job
-- since it started (its job_version is the job's version).
CREATE FUNCTION {{fn}}.blocks(j jobs, a attempts) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
	SELECT a.state IN ('starting', 'unknown')
		OR (a.state = 'lost' AND j.completed_by IS NULL AND a.job_version = j.version);
$$;

-- refresh_lease records the job's starting attempts whose deadline passed as
-- unknown (fsm.ApplyLeases), recomputes lease_until, and makes the job
-- unknown when nothing is starting and an attempt blocks new ones: it is
-- unknown, or lost while no result won and no operator settled the job
-- since it started (its job_version is the job's version). That holds for
-- a pending job, and for a failed one whose attempt's late result showed
-- that its provider acted after all: it expires no more. The caller holds
-- the job's row lock.
CREATE FUNCTION {{fn}}.refresh_lease(p_job uuid, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
	n integer;
	was text;
	stuck boolean;
	now_state text;
BEGIN
	UPDATE attempts SET state = 'unknown', finished_at = deadline, error = {{ReasonLeaseExpired}}
	WHERE job_id = p_job AND state = 'starting' AND deadline <= p_now;
	GET DIAGNOSTICS n = ROW_COUNT;
	SELECT t.state, t.state IN ('pending', 'failed') AND t.completed_by IS NULL
		AND NOT EXISTS (SELECT 1 FROM attempts x WHERE x.job_id = p_job AND x.state = 'starting')
		AND EXISTS (SELECT 1 FROM attempts x WHERE x.job_id = p_job AND {{fn}}.blocks(t, x))
	INTO was, stuck FROM jobs t WHERE t.id = p_job;
	UPDATE jobs t SET
		lease_until = (SELECT max(x.deadline) FROM attempts x WHERE x.job_id = p_job AND x.state = 'starting'),
		state = CASE WHEN stuck THEN 'unknown' ELSE t.state END,
		completed_at = CASE WHEN stuck THEN NULL ELSE t.completed_at END,
		expires_at = CASE WHEN stuck THEN NULL ELSE t.expires_at END
	WHERE t.id = p_job
	RETURNING t.state INTO now_state;
	IF n > 0 OR was IS DISTINCT FROM now_state THEN
		PERFORM {{fn}}.notify_job(p_job);
	END IF;
	RETURN n;
END $$;

-- reserve creates the job p_job for (owner, key) with attempt p_attempt, or
-- reports what exists, re-opening a failed job with p_attempt and replacing
-- an expired one in place by p_job. The UNIQUE constraint on (owner_hash,
-- key_hash) decides who is first. A repeat finds p_attempt in the job and
-- answers 'created' (attempt 1) or 'reopened' again, with the attempt as it
-- is now.
CREATE FUNCTION {{fn}}.reserve(
	p_job uuid, p_attempt uuid, p_owner bytea, p_key bytea, p_fp bytea, p_fpv integer, p_fps text,
	p_provider text, p_scope text, p_lease_us bigint, p_retention_us bigint,
	OUT outcome text, OUT ts timestamptz,
	OUT job_id uuid, OUT job_state text, OUT job_version bigint, OUT completed_by uuid,
	OUT created_at timestamptz, OUT completed_at timestamptz, OUT expires_at timestamptz,
	OUT response_status integer, OUT response_header bytea, OUT response_body bytea,
	OUT response_size bigint, OUT response_stored boolean,
	OUT attempt_id uuid, OUT attempt_number integer, OUT attempt_provider text,
	OUT attempt_state text, OUT attempt_version bigint, OUT attempt_started timestamptz,
	OUT attempt_deadline timestamptz, OUT fp_version integer, OUT fp_scheme text)
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	a attempts%ROWTYPE;
	lease interval := p_lease_us * interval '1 microsecond';
	keep interval := p_retention_us * interval '1 microsecond';
BEGIN
	LOOP
		ts := {{fn}}.ledger_clock();
		-- No conflict target: a repeat of this call, running concurrently,
		-- conflicts on the id as well as on (owner, key).
		INSERT INTO jobs AS t (id, owner_hash, key_hash, fingerprint, fingerprint_version,
			fingerprint_scheme, state, version, attempt_count, retention, created_at, lease_until)
		VALUES (p_job, p_owner, p_key, p_fp, p_fpv, p_fps, 'pending', 1, 1, keep, ts, ts + lease)
		ON CONFLICT DO NOTHING
		RETURNING t.* INTO j;
		IF FOUND THEN
			INSERT INTO attempts AS t (id, job_id, number, provider, scope, state, job_version, started_at, deadline)
			VALUES (p_attempt, j.id, 1, p_provider, p_scope, 'starting', 1, ts, ts + lease)
			ON CONFLICT DO NOTHING
			RETURNING t.* INTO a;
			IF NOT FOUND THEN
				RAISE EXCEPTION 'onejob: attempt id % is taken', p_attempt USING ERRCODE = 'unique_violation';
			END IF;
			outcome := 'created';
			EXIT;
		END IF;

		-- The key is taken. Most answers need no lock: read first.
		SELECT * INTO j FROM jobs t WHERE t.owner_hash = p_owner AND t.key_hash = p_key;
		IF NOT FOUND THEN
			IF EXISTS (SELECT 1 FROM jobs t WHERE t.id = p_job) THEN
				RAISE EXCEPTION 'onejob: job id % is taken by another key', p_job USING ERRCODE = 'unique_violation';
			END IF;
			CONTINUE; -- removed meanwhile: insert again
		END IF;
		ts := {{fn}}.ledger_clock();
		IF j.expires_at IS NULL OR j.expires_at > ts THEN
			IF j.fingerprint <> p_fp OR j.fingerprint_version <> p_fpv THEN
				outcome := 'mismatch';
				EXIT;
			END IF;
			SELECT * INTO a FROM attempts t WHERE t.id = p_attempt AND t.job_id = j.id;
			IF FOUND THEN
				-- A repeat of this call running at once may have re-opened the
				-- job between the two reads: read the job again, after its
				-- attempt, so the answer is never a failed job re-opened.
				SELECT * INTO j FROM jobs t WHERE t.id = j.id;
				CONTINUE WHEN NOT FOUND; -- replaced meanwhile: start again
				outcome := CASE WHEN a.number = 1 THEN 'created' ELSE 'reopened' END;
				EXIT;
			END IF;
			IF j.state = 'completed' OR j.completed_by IS NOT NULL THEN
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
		ts := {{fn}}.ledger_clock();
		IF j.expires_at IS NOT NULL AND j.expires_at <= ts THEN
			DELETE FROM attempts t WHERE t.job_id = j.id;
			UPDATE jobs t SET id = p_job, fingerprint = p_fp, fingerprint_version = p_fpv,
				fingerprint_scheme = p_fps, state = 'pending', version = 1, completed_by = NULL, attempt_count = 1,
				retention = keep, created_at = ts, completed_at = NULL, expires_at = NULL,
				lease_until = ts + lease, response_status = NULL, response_header = NULL,
				response_body = NULL, response_size = NULL, response_stored = false
			WHERE t.id = j.id
			RETURNING t.* INTO j;
			INSERT INTO attempts AS t (id, job_id, number, provider, scope, state, job_version, started_at, deadline)
			VALUES (p_attempt, j.id, 1, p_provider, p_scope, 'starting', 1, ts, ts + lease)
			ON CONFLICT DO NOTHING
			RETURNING t.* INTO a;
			IF NOT FOUND THEN
				RAISE EXCEPTION 'onejob: attempt id % is taken', p_attempt USING ERRCODE = 'unique_violation';
			END IF;
			outcome := 'created';
			EXIT;
		END IF;
		IF j.fingerprint <> p_fp OR j.fingerprint_version <> p_fpv THEN
			outcome := 'mismatch';
			EXIT;
		END IF;
		PERFORM {{fn}}.refresh_lease(j.id, ts);
		SELECT * INTO j FROM jobs t WHERE t.id = j.id;
		-- A repeat of this call may have re-opened the job meanwhile.
		SELECT * INTO a FROM attempts t WHERE t.id = p_attempt AND t.job_id = j.id;
		IF FOUND THEN
			outcome := CASE WHEN a.number = 1 THEN 'created' ELSE 'reopened' END;
		ELSIF j.state = 'completed' OR j.completed_by IS NOT NULL THEN
			outcome := 'done';
		ELSIF j.state = 'failed' THEN
			INSERT INTO attempts AS t (id, job_id, number, provider, scope, state, job_version, started_at, deadline)
			VALUES (p_attempt, j.id, j.attempt_count + 1, p_provider, p_scope, 'starting',
				j.version + 1, ts, ts + lease)
			ON CONFLICT DO NOTHING
			RETURNING t.* INTO a;
			IF NOT FOUND THEN
				RAISE EXCEPTION 'onejob: attempt id % is taken', p_attempt USING ERRCODE = 'unique_violation';
			END IF;
			UPDATE jobs t SET state = 'pending', version = t.version + 1, attempt_count = t.attempt_count + 1,
				completed_at = NULL, expires_at = NULL, lease_until = ts + lease
			WHERE t.id = j.id
			RETURNING t.* INTO j;
			outcome := 'reopened';
		ELSIF j.state = 'pending' AND j.lease_until > ts THEN
			outcome := 'in_flight';
		ELSE
			outcome := 'unknown';
		END IF;
		EXIT;
	END LOOP;

	job_id := j.id; job_state := j.state; job_version := j.version; created_at := j.created_at;
	fp_version := j.fingerprint_version; fp_scheme := j.fingerprint_scheme;
	IF outcome = 'mismatch' THEN
		RETURN; -- how its fingerprint was made, never the other request's answer
	END IF;
	completed_by := j.completed_by; completed_at := j.completed_at; expires_at := j.expires_at;
	IF j.completed_by IS NOT NULL THEN
		response_status := j.response_status; response_header := j.response_header;
		response_body := j.response_body; response_size := j.response_size;
		response_stored := j.response_stored;
	END IF;
	IF outcome = 'done' THEN
		RETURN;
	END IF;
	-- Leases as the ledger's clock reads them now (fsm.ApplyLeases).
	IF j.state = 'pending' AND j.completed_by IS NULL AND j.lease_until <= ts THEN
		job_state := 'unknown';
	END IF;
	IF outcome IN ('in_flight', 'unknown') THEN
		-- The attempt that blocks new ones (fsm.Blocking): the live one with
		-- the latest deadline, else the blocking one with the latest deadline.
		SELECT * INTO a FROM attempts t
		WHERE t.job_id = j.id AND {{fn}}.blocks(j, t)
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
-- A loser is recorded as lost and its result dropped (a cancelled attempt
-- stays cancelled, a lost one keeps its reason); a repeat by the winner
-- reports that it won.
-- The winner's waiters are told by announce, after the commit.
CREATE FUNCTION {{fn}}.complete(
	p_job uuid, p_attempt uuid, p_version bigint,
	p_status integer, p_header bytea, p_body bytea, p_size bigint, p_stored boolean,
	OUT outcome text, OUT job_state text, OUT job_version bigint, OUT completed_by uuid,
	OUT completed_at timestamptz, OUT expires_at timestamptz,
	OUT response_status integer, OUT response_header bytea, OUT response_body bytea,
	OUT response_size bigint, OUT response_stored boolean, OUT read_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	ts timestamptz := {{fn}}.ledger_clock();
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
		UPDATE attempts t SET state = 'succeeded', error = NULL, finished_at = ts WHERE t.id = p_attempt;
		outcome := 'won'; -- its waiters are told by announce
	ELSE
		SELECT * INTO j FROM {{fn}}.lock_job(p_job, ts);
		IF j.id IS NULL OR NOT EXISTS (SELECT 1 FROM attempts x WHERE x.id = p_attempt AND x.job_id = p_job) THEN
			outcome := 'not_found';
			RETURN;
		END IF;
		IF j.completed_by = p_attempt THEN
			outcome := 'won'; -- a repeat by the winner
		ELSE
			ts := {{fn}}.ledger_clock();
			UPDATE attempts t SET state = 'lost', finished_at = ts,
				error = CASE WHEN t.deadline <= ts THEN {{ReasonLateDeadline}}
					ELSE {{ReasonLateSettled}} END
			WHERE t.id = p_attempt AND t.state NOT IN ('cancelled', 'lost');
			PERFORM {{fn}}.refresh_lease(p_job, ts); -- an unbeaten lost result leaves the job unknown
			SELECT * INTO j FROM jobs t WHERE t.id = p_job;
			outcome := 'lost';
		END IF;
	END IF;
	job_state := j.state; job_version := j.version; completed_by := j.completed_by;
	completed_at := j.completed_at; expires_at := j.expires_at;
	IF j.completed_by IS NOT NULL THEN
		response_status := j.response_status; response_header := j.response_header;
		response_body := j.response_body; response_size := j.response_size;
		response_stored := j.response_stored;
	END IF;
	read_at := {{fn}}.ledger_clock(); -- the job as this call left it, by the ledger's clock
END $$;

-- blocked reports whether the locked job j takes no new attempt once
-- p_attempt failed (fsm.afterFailure): it is settled, or another attempt
-- is starting or unknown, or lost while no result won at the job's
-- version.
CREATE FUNCTION {{fn}}.blocked(j jobs, p_attempt uuid) RETURNS boolean
LANGUAGE sql STABLE AS $$
	SELECT j.completed_by IS NOT NULL OR j.state IN ('completed', 'failed')
		OR EXISTS (SELECT 1 FROM attempts x WHERE x.job_id = j.id AND x.id <> p_attempt AND {{fn}}.blocks(j, x));
$$;

-- after_failure settles the locked job p_job once p_attempt failed with no
-- next attempt to start (fsm.afterFailure): the job fails when nothing
-- else blocks it; otherwise its lease is refreshed (unknown when nothing
-- else runs).
CREATE FUNCTION {{fn}}.after_failure(p_job uuid, p_attempt uuid, p_ts timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
BEGIN
	SELECT * INTO j FROM jobs t WHERE t.id = p_job;
	IF {{fn}}.blocked(j, p_attempt) THEN
		PERFORM {{fn}}.refresh_lease(p_job, p_ts);
	ELSE
		UPDATE jobs t SET state = 'failed', completed_at = p_ts, expires_at = p_ts + t.retention, lease_until = NULL
		WHERE t.id = p_job;
		PERFORM {{fn}}.notify_job(p_job);
	END IF;
END $$;

-- fail records a definitive failure of an attempt, then starts the next
-- attempt (failover) or, when nothing else blocks, fails the job. An
-- unknown attempt may still report a definitive failure until its
-- deadline, but never fail over. A repeat answers as the first call did:
-- the attempt it started, else 'blocked' (with a next attempt) or 'ok'.
CREATE FUNCTION {{fn}}.fail(
	p_job uuid, p_attempt uuid, p_reason text,
	p_next uuid, p_next_provider text, p_next_scope text, p_next_lease_us bigint,
	OUT outcome text, OUT attempt_number integer, OUT attempt_version bigint,
	OUT attempt_provider text, OUT attempt_state text,
	OUT attempt_started timestamptz, OUT attempt_deadline timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	o record; -- open_job's answer
	a attempts%ROWTYPE;
	ts timestamptz;
	lease interval := p_next_lease_us * interval '1 microsecond';
BEGIN
	SELECT * INTO o FROM {{fn}}.open_job(p_job);
	j := o.j;
	ts := o.ts;
	IF j.id IS NULL THEN
		outcome := 'not_found';
		RETURN;
	END IF;
	SELECT * INTO a FROM attempts t WHERE t.id = p_attempt AND t.job_id = p_job;
	IF NOT FOUND THEN
		outcome := 'not_found';
		RETURN;
	END IF;
	IF a.state = 'failed' THEN -- a repeat (fsm.repeatedFailure)
		IF p_next IS NULL THEN
			outcome := 'ok';
			RETURN;
		END IF;
		SELECT * INTO a FROM attempts t WHERE t.id = p_next AND t.job_id = p_job;
		IF NOT FOUND THEN
			outcome := 'blocked';
			RETURN;
		END IF;
		outcome := 'next';
		attempt_number := a.number; attempt_version := a.job_version;
		attempt_provider := a.provider; attempt_state := a.state;
		attempt_started := a.started_at; attempt_deadline := a.deadline;
		RETURN;
	END IF;
	IF NOT (a.state = 'starting' OR (a.state = 'unknown' AND a.deadline > ts AND p_next IS NULL)) THEN
		outcome := 'stale';
		RETURN;
	END IF;
	UPDATE attempts t SET state = 'failed', error = p_reason, finished_at = ts WHERE t.id = p_attempt;
	SELECT * INTO j FROM jobs t WHERE t.id = p_job;
	IF p_next IS NULL THEN
		PERFORM {{fn}}.after_failure(p_job, p_attempt, ts);
		outcome := 'ok';
	ELSIF {{fn}}.blocked(j, p_attempt) THEN
		PERFORM {{fn}}.refresh_lease(p_job, ts); -- unknown when nothing else runs
		outcome := 'blocked';
	ELSE
		INSERT INTO attempts AS t (id, job_id, number, provider, scope, state, job_version, started_at, deadline)
		VALUES (p_next, p_job, j.attempt_count + 1, p_next_provider, p_next_scope, 'starting',
			j.version, ts, ts + lease)
		ON CONFLICT DO NOTHING
		RETURNING t.* INTO a;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'onejob: attempt id % is taken', p_next USING ERRCODE = 'unique_violation';
		END IF;
		UPDATE jobs t SET state = 'pending', attempt_count = t.attempt_count + 1, lease_until = ts + lease
		WHERE t.id = p_job;
		outcome := 'next';
		attempt_number := a.number; attempt_version := a.job_version;
		attempt_provider := a.provider; attempt_state := a.state;
		attempt_started := a.started_at; attempt_deadline := a.deadline;
	END IF;
END $$;

-- unsent records that the gateway never sent an attempt: it becomes failed
-- (with p_reason), even after it became unknown (by its lease, or by a
-- timeout that ended before its dial failed), whatever happened to the job
-- since; the job
-- becomes failed when nothing else settled or blocks it (fsm.Unsent). A
-- repeat, or an attempt failed otherwise, is 'ok'.
CREATE FUNCTION {{fn}}.unsent(p_job uuid, p_attempt uuid, p_reason text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	o record; -- open_job's answer
	a attempts%ROWTYPE;
	ts timestamptz;
BEGIN
	SELECT * INTO o FROM {{fn}}.open_job(p_job);
	j := o.j;
	ts := o.ts;
	IF j.id IS NULL THEN
		RETURN 'not_found';
	END IF;
	SELECT * INTO a FROM attempts t WHERE t.id = p_attempt AND t.job_id = p_job;
	IF NOT FOUND THEN
		RETURN 'not_found';
	ELSIF a.state = 'failed' THEN
		RETURN 'ok';
	ELSIF a.state NOT IN ('starting', 'unknown') THEN
		RETURN 'stale';
	END IF;
	UPDATE attempts t SET state = 'failed', error = p_reason, finished_at = ts WHERE t.id = p_attempt;
	PERFORM {{fn}}.after_failure(p_job, p_attempt, ts);
	RETURN 'ok';
END $$;

-- mark_unknown records that an attempt's outcome is unknown; the job becomes
-- unknown unless a result won. The version is kept. A repeat is 'ok'.
CREATE FUNCTION {{fn}}.mark_unknown(p_job uuid, p_attempt uuid, p_reason text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	s text;
	ts timestamptz;
BEGIN
	SELECT * INTO j FROM {{fn}}.lock_job(p_job, {{fn}}.ledger_clock());
	IF j.id IS NULL THEN
		RETURN 'not_found';
	END IF;
	ts := {{fn}}.ledger_clock();
	SELECT t.state INTO s FROM attempts t WHERE t.id = p_attempt AND t.job_id = p_job;
	IF NOT FOUND THEN
		RETURN 'not_found';
	ELSIF s = 'starting' THEN
		UPDATE attempts t SET state = 'unknown', error = p_reason, finished_at = ts WHERE t.id = p_attempt;
	ELSIF s <> 'unknown' THEN
		RETURN 'stale';
	END IF;
	UPDATE jobs t SET state = 'unknown'
	WHERE t.id = p_job AND t.state = 'pending' AND t.completed_by IS NULL;
	PERFORM {{fn}}.refresh_lease(p_job, ts);
	PERFORM {{fn}}.notify_job(p_job);
	RETURN 'ok';
END $$;

-- start_attempt starts p_attempt beside the job's other attempts, keeping
-- its version: a hedge (p_reconciles NULL) beside a starting attempt of a
-- pending job (fsm.Hedge), or a re-send (p_reconciles: the attempt it
-- reconciles) to a provider that deduplicates, after an attempt that
-- blocks the job, while no result won and nothing is starting; the job is
-- then pending again (fsm.Resend). A repeat returns the attempt as it is
-- now.
CREATE FUNCTION {{fn}}.start_attempt(p_job uuid, p_version bigint, p_attempt uuid, p_provider text,
	p_scope text, p_lease_us bigint, p_reconciles uuid,
	OUT outcome text, OUT attempt_number integer, OUT attempt_version bigint,
	OUT attempt_provider text, OUT attempt_state text,
	OUT attempt_started timestamptz, OUT attempt_deadline timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	o record; -- open_job's answer
	a attempts%ROWTYPE;
	r attempts%ROWTYPE;
	ts timestamptz;
	allowed boolean;
BEGIN
	SELECT * INTO o FROM {{fn}}.open_job(p_job);
	j := o.j;
	ts := o.ts;
	IF j.id IS NULL THEN
		outcome := 'not_found';
		RETURN;
	END IF;
	SELECT * INTO a FROM attempts t WHERE t.id = p_attempt AND t.job_id = p_job;
	IF NOT FOUND THEN
		SELECT * INTO j FROM jobs t WHERE t.id = p_job;
		IF p_reconciles IS NULL THEN
			allowed := j.state = 'pending' AND j.completed_by IS NULL;
		ELSE
			SELECT * INTO r FROM attempts t WHERE t.id = p_reconciles AND t.job_id = p_job;
			IF NOT FOUND THEN
				outcome := 'not_found';
				RETURN;
			END IF;
			allowed := j.completed_by IS NULL AND j.state NOT IN ('completed', 'failed') AND {{fn}}.blocks(j, r)
				AND NOT EXISTS (SELECT 1 FROM attempts t WHERE t.job_id = p_job AND t.state = 'starting');
		END IF;
		IF NOT allowed OR j.version <> p_version THEN
			outcome := 'stale';
			RETURN;
		END IF;
		INSERT INTO attempts AS t (id, job_id, number, provider, scope, state, job_version, started_at, deadline, resend)
		VALUES (p_attempt, p_job, j.attempt_count + 1, p_provider, p_scope, 'starting',
			j.version, ts, ts + p_lease_us * interval '1 microsecond', p_reconciles IS NOT NULL)
		ON CONFLICT DO NOTHING
		RETURNING t.* INTO a;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'onejob: attempt id % is taken', p_attempt USING ERRCODE = 'unique_violation';
		END IF;
		UPDATE jobs t SET state = 'pending', attempt_count = t.attempt_count + 1,
			lease_until = greatest(t.lease_until, a.deadline)
		WHERE t.id = p_job;
	END IF;
	outcome := 'ok';
	attempt_number := a.number; attempt_version := a.job_version;
	attempt_provider := a.provider; attempt_state := a.state;
	attempt_started := a.started_at; attempt_deadline := a.deadline;
END $$;

-- claim_lookup leases the unknown attempt p_attempt to the reconciler
-- p_holder until the ledger's clock plus p_lease_us (fsm.ClaimLookup), once
-- its deadline passed, its next lookup is due and no other holder's lease
-- runs. A repeat by the holder while its lease runs is 'ok' again.
CREATE FUNCTION {{fn}}.claim_lookup(p_job uuid, p_attempt uuid, p_holder text, p_lease_us bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	o record; -- open_job's answer
	a attempts%ROWTYPE;
	ts timestamptz;
BEGIN
	SELECT * INTO o FROM {{fn}}.open_job(p_job);
	j := o.j;
	ts := o.ts;
	IF j.id IS NULL THEN
		RETURN 'not_found';
	END IF;
	SELECT * INTO a FROM attempts t WHERE t.id = p_attempt AND t.job_id = p_job;
	IF NOT FOUND THEN
		RETURN 'not_found';
	ELSIF a.state = 'unknown' AND a.lookup_holder = p_holder AND coalesce(a.lookup_until > ts, false) THEN
		RETURN 'ok'; -- a repeat
	ELSIF a.state <> 'unknown' OR a.deadline > ts
		OR coalesce(a.lookup_next_at > ts, false) OR coalesce(a.lookup_until > ts, false) THEN
		RETURN 'stale';
	END IF;
	UPDATE attempts t SET lookup_holder = p_holder, lookup_until = ts + p_lease_us * interval '1 microsecond'
	WHERE t.id = p_attempt;
	RETURN 'ok';
END $$;

-- settle_lookup records what p_holder's lookup of the unknown attempt
-- p_attempt found, as one more try with status p_status, and releases the
-- lease (fsm.SettleLookup). A found answer (p_found: the provider's status,
-- header and body) completes the job with it, the attempt succeeding,
-- unless a result won meanwhile: then the attempt is lost. An absent one
-- fails the attempt, and the job when nothing else blocks it. Anything
-- else leaves the attempt unknown, its next lookup due after p_retry_us.
-- The reasons recorded come from the caller (ledger.ReasonAbsent,
-- ledger.ReasonLookupLost). A repeat by the holder, its lease released,
-- is 'ok'.
CREATE FUNCTION {{fn}}.settle_lookup(p_job uuid, p_attempt uuid, p_holder text, p_status integer,
	p_found boolean, p_found_status integer, p_found_header bytea, p_found_body bytea,
	p_absent boolean, p_retry_us bigint, p_absent_reason text, p_lost_reason text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	o record; -- open_job's answer
	a attempts%ROWTYPE;
	ts timestamptz;
	settles boolean := p_found OR p_absent;
BEGIN
	SELECT * INTO o FROM {{fn}}.open_job(p_job);
	j := o.j;
	ts := o.ts;
	IF j.id IS NULL THEN
		RETURN 'not_found';
	END IF;
	SELECT * INTO a FROM attempts t WHERE t.id = p_attempt AND t.job_id = p_job;
	IF NOT FOUND THEN
		RETURN 'not_found';
	ELSIF a.lookup_holder <> p_holder OR (a.lookup_until IS NULL AND a.lookup_last_at IS NULL) THEN
		RETURN 'stale'; -- not this holder's, or never claimed
	ELSIF a.lookup_until IS NULL THEN
		RETURN 'ok'; -- a repeat: this holder's lookup was recorded
	ELSIF a.state <> 'unknown' OR a.lookup_until <= ts THEN
		RETURN 'stale';
	END IF;
	UPDATE attempts t SET lookup_tries = t.lookup_tries + 1, lookup_last_status = p_status,
		lookup_last_at = ts, lookup_until = NULL, lookup_settled = settles,
		lookup_next_at = CASE WHEN settles THEN t.lookup_next_at ELSE ts + p_retry_us * interval '1 microsecond' END
	WHERE t.id = p_attempt;
	IF p_found AND j.completed_by IS NULL THEN
		UPDATE jobs t SET state = 'completed', version = t.version + 1, completed_by = p_attempt,
			completed_at = ts, expires_at = ts + t.retention, lease_until = NULL,
			response_status = p_found_status, response_header = p_found_header, response_body = p_found_body,
			response_size = octet_length(p_found_body), response_stored = true
		WHERE t.id = p_job;
		UPDATE attempts t SET state = 'succeeded', error = NULL, finished_at = ts WHERE t.id = p_attempt;
		PERFORM {{fn}}.notify_job(p_job);
	ELSIF p_found THEN
		UPDATE attempts t SET state = 'lost', error = p_lost_reason, finished_at = ts WHERE t.id = p_attempt;
	ELSIF p_absent THEN
		UPDATE attempts t SET state = 'failed', error = p_absent_reason, finished_at = ts WHERE t.id = p_attempt;
		PERFORM {{fn}}.after_failure(p_job, p_attempt, ts);
	END IF;
	RETURN 'ok';
END $$;

-- resolve settles a job out of band: cancel, or complete with the admin
-- attempt p_admin. Running attempts become cancelled and can only lose. A
-- repeat of a completion (the same p_admin) is 'ok', and so is a cancel of
-- a job already failed with nothing starting or unknown: neither changes
-- anything.
CREATE FUNCTION {{fn}}.resolve(p_job uuid, p_cancel boolean, p_admin uuid,
	p_status integer, p_header bytea, p_body bytea)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	j jobs%ROWTYPE;
	ts timestamptz;
BEGIN
	SELECT * INTO j FROM {{fn}}.lock_job(p_job, {{fn}}.ledger_clock());
	IF j.id IS NULL THEN
		RETURN 'not_found';
	END IF;
	IF NOT p_cancel AND j.completed_by = p_admin THEN
		RETURN 'ok';
	END IF;
	IF j.state = 'completed' OR j.completed_by IS NOT NULL THEN
		RETURN 'completed';
	END IF;
	ts := {{fn}}.ledger_clock();
	PERFORM {{fn}}.refresh_lease(p_job, ts);
	IF p_cancel AND j.state = 'failed'
		AND NOT EXISTS (SELECT 1 FROM attempts x WHERE x.job_id = p_job AND x.state IN ('starting', 'unknown')) THEN
		RETURN 'ok';
	END IF;
	UPDATE attempts SET state = 'cancelled', finished_at = ts, error = {{ReasonResolved}}
	WHERE job_id = p_job AND state IN ('starting', 'unknown');
	IF p_cancel THEN
		UPDATE jobs t SET state = 'failed', version = t.version + 1, completed_at = ts,
			expires_at = ts + t.retention, lease_until = NULL
		WHERE t.id = p_job;
	ELSE
		INSERT INTO attempts VALUES (p_admin, p_job, j.attempt_count + 1, {{AdminProvider}}, 'succeeded',
			j.version + 1, ts, ts, ts, NULL)
		ON CONFLICT DO NOTHING;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'onejob: attempt id % is taken', p_admin USING ERRCODE = 'unique_violation';
		END IF;
		UPDATE jobs t SET state = 'completed', version = t.version + 1, completed_by = p_admin,
			attempt_count = t.attempt_count + 1, completed_at = ts, expires_at = ts + t.retention,
			lease_until = NULL, response_status = p_status, response_header = p_header,
			response_body = p_body, response_size = octet_length(p_body), response_stored = true
		WHERE t.id = p_job;
	END IF;
	PERFORM {{fn}}.notify_job(p_job);
	RETURN 'ok';
END $$;

-- sweep records expired leases as unknown and removes up to p_limit expired
-- jobs (with their attempts).
CREATE FUNCTION {{fn}}.sweep(p_limit integer, OUT unknown integer, OUT removed integer)
LANGUAGE plpgsql AS $$
DECLARE
	v_job uuid;
	ts timestamptz := {{fn}}.ledger_clock();
BEGIN
	unknown := 0;
	FOR v_job IN
		SELECT t.id FROM jobs t
		WHERE t.id IN (SELECT DISTINCT x.job_id FROM attempts x WHERE x.state = 'starting' AND x.deadline <= ts LIMIT p_limit)
		FOR UPDATE SKIP LOCKED
	LOOP
		unknown := unknown + {{fn}}.refresh_lease(v_job, ts);
	END LOOP;
	WITH gone AS (
		DELETE FROM jobs t WHERE t.id IN (
			SELECT x.id FROM jobs x WHERE x.expires_at <= ts LIMIT p_limit FOR UPDATE SKIP LOCKED)
		RETURNING 1)
	SELECT count(*) INTO removed FROM gone;
END $$;
