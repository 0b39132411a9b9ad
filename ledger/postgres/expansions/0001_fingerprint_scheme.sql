-- How each job's fingerprint was made (body mode, headers, selected
-- members), so a retry is fingerprinted the same way after the
-- configuration changed. Empty for jobs of earlier releases, whose
-- functions leave it at its default.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS fingerprint_scheme text NOT NULL DEFAULT '';
