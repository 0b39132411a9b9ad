-- What the reconciler's lookups did on an unknown attempt (ledger.Lookup):
-- how many got an answer or an error, the last one's status and end, when
-- the next may start (NULL: at once), whether one settled the attempt, and
-- the holder of the lease with its end (NULL once released). Attempts of
-- earlier releases keep the defaults: no lookup ran.
ALTER TABLE attempts
	ADD COLUMN IF NOT EXISTS lookup_tries integer NOT NULL DEFAULT 0,
	ADD COLUMN IF NOT EXISTS lookup_last_status integer NOT NULL DEFAULT 0,
	ADD COLUMN IF NOT EXISTS lookup_last_at timestamptz,
	ADD COLUMN IF NOT EXISTS lookup_next_at timestamptz,
	ADD COLUMN IF NOT EXISTS lookup_settled boolean NOT NULL DEFAULT false,
	ADD COLUMN IF NOT EXISTS lookup_holder text NOT NULL DEFAULT '',
	ADD COLUMN IF NOT EXISTS lookup_until timestamptz;
