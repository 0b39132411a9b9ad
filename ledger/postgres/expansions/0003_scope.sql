-- The handler scope each attempt ran under (ledger.Attempt.Scope): a
-- reconciler asks a provider only about its own scope's attempts. Attempts
-- of earlier releases keep the default, no scope.
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT '';
