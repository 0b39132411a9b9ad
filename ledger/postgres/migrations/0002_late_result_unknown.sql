-- A result that arrives after its attempt's deadline is dropped (the
-- attempt is lost), and when nothing else runs the job is unknown: the
-- provider acted. refresh_lease left such a job pending, since it settled
-- a job unknown only beside an unknown attempt.

CREATE OR REPLACE FUNCTION refresh_lease(p_job uuid, p_now timestamptz) RETURNS integer
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
				AND EXISTS (SELECT 1 FROM attempts WHERE job_id = p_job AND state IN ('unknown', 'lost'))
			THEN 'unknown' ELSE state END
	WHERE id = p_job;
	IF n > 0 THEN
		PERFORM notify_job(p_job);
	END IF;
	RETURN n;
END $$;

-- Jobs an earlier version left pending that way.
UPDATE jobs j SET state = 'unknown', lease_until = NULL
WHERE j.state = 'pending' AND j.completed_by IS NULL
	AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = j.id AND a.state = 'starting')
	AND EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = j.id AND a.state = 'lost');
