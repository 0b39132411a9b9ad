package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/onejob/onejob/ledger"
)

// countsQuery counts the jobs by state in one round trip, in three parts,
// each over an index of migrations/0001_init.sql:
//
//   - pending and unknown jobs (the few that are not settled) are read
//     through jobs_state (state, id), leases applied as Jobs applies them
//     (effectiveState), with the creation time of the oldest of each;
//   - completed and failed jobs are counted by state, never reading their
//     answers: through jobs_state, or by a sequential scan where the
//     planner finds it cheaper (when nearly every job is settled); this
//     part grows with the number of settled jobs, which is why the gateway
//     runs the query at most every few seconds, however often it is
//     scraped;
//   - from those, the jobs whose retention passed and which the sweeper
//     has not removed yet are taken away, read through jobs_expires_at (a
//     short range: the sweeper removes them every few seconds). The bound
//     is statement_timestamp(), not the volatile ledger_clock() the
//     other reads use, so that the index can serve it.
const countsQuery = `SELECT s, sum(n)::bigint, min(oldest), ledger_clock() FROM (
	SELECT ` + effectiveState + ` AS s, count(*) AS n, min(created_at) AS oldest
		FROM jobs WHERE state IN ('pending', 'unknown') GROUP BY 1
	UNION ALL
	SELECT state, count(*), NULL FROM jobs WHERE state IN ('completed', 'failed') GROUP BY state
	UNION ALL
	SELECT state, -count(*), NULL FROM jobs
		WHERE state IN ('completed', 'failed') AND expires_at <= statement_timestamp() GROUP BY state
) c GROUP BY s`

// Counts implements ledger.Counter.
func (l *Ledger) Counts(ctx context.Context) (ledger.Counts, error) {
	rows, err := l.pool.Query(ctx, countsQuery)
	if err != nil {
		return ledger.Counts{}, fmt.Errorf("postgres ledger: counts: %w", err)
	}
	defer rows.Close()
	var c ledger.Counts
	for rows.Next() {
		var (
			state  string
			n      int64
			oldest pgtype.Timestamptz
			now    time.Time
		)
		if err := rows.Scan(&state, &n, &oldest, &now); err != nil {
			return ledger.Counts{}, fmt.Errorf("postgres ledger: counts: %w", err)
		}
		if c.ByState == nil {
			c = ledger.NewCounts(now)
		}
		c.ByState[ledger.JobState(state)] += n
		if state == string(ledger.JobUnknown) && oldest.Valid {
			c.OldestUnknown = oldest.Time
		}
	}
	if err := rows.Err(); err != nil {
		return ledger.Counts{}, fmt.Errorf("postgres ledger: counts: %w", err)
	}
	if c.ByState == nil {
		// No job at all: the server's clock still dates the count.
		var now time.Time
		if err := l.pool.QueryRow(ctx, `SELECT ledger_clock()`).Scan(&now); err != nil {
			return ledger.Counts{}, fmt.Errorf("postgres ledger: counts: %w", err)
		}
		c = ledger.NewCounts(now)
	}
	return c, nil
}

// ListenerUp implements ledger.Listener: the LISTEN connection that wakes
// this process's waiters.
func (l *Ledger) ListenerUp() bool { return l.listen.Up() }

// Interface guards
var (
	_ ledger.Counter  = (*Ledger)(nil)
	_ ledger.Listener = (*Ledger)(nil)
)
