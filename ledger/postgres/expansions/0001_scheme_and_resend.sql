-- How each job's fingerprint was made (body mode, headers, selected
-- members), so a retry is fingerprinted the same way after the
-- configuration changed. Empty for jobs of earlier releases, whose
-- functions leave it at its default.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS fingerprint_scheme text NOT NULL DEFAULT '';

-- Whether an attempt re-sent the job's request to a provider that
-- deduplicates, to reconcile an attempt whose outcome was unknown.
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS resend boolean NOT NULL DEFAULT false;
