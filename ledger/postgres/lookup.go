package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onejob/onejob/ledger"
)

// ClaimLookup implements ledger.Ledger.
func (l *Ledger) ClaimLookup(ctx context.Context, ref ledger.AttemptRef, holder string, lease time.Duration) (*ledger.Job, error) {
	if !validID(ref.JobID) || !validID(ref.AttemptID) {
		return nil, ledger.ErrNotFound
	}
	return l.lookup(ctx, "claim_lookup", ref.JobID, `SELECT claim_lookup($1, $2, $3, $4)`,
		ref.JobID, ref.AttemptID, holder, micros(lease))
}

// SettleLookup implements ledger.Ledger. A found answer is stored whole:
// its size is its body's length.
func (l *Ledger) SettleLookup(ctx context.Context, ref ledger.AttemptRef, holder string, r ledger.LookupResult) (*ledger.Job, error) {
	if !validID(ref.JobID) || !validID(ref.AttemptID) {
		return nil, ledger.ErrNotFound
	}
	var (
		status       any // NULL unless found
		header, body []byte
		err          error
	)
	if r.Found != nil {
		status, body = r.Found.Status, r.Found.Body
		if body == nil {
			body = []byte{}
		}
		if header, err = encodeHeader(r.Found.Header); err != nil {
			return nil, err
		}
	}
	return l.lookup(ctx, "settle_lookup", ref.JobID,
		`SELECT settle_lookup($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		ref.JobID, ref.AttemptID, holder, r.Status, r.Found != nil, status, header, body,
		r.Absent, micros(r.Retry), ledger.ReasonAbsent, ledger.ReasonLookupLost)
}

// lookup runs the lookup transition fn by query and reads the job as Job
// would, in one round trip: both statements go in one batch, which the
// server runs as one transaction, the read seeing what the transition did.
func (l *Ledger) lookup(ctx context.Context, fn, jobID, query string, args ...any) (*ledger.Job, error) {
	var b pgx.Batch
	b.Queue(query, args...)
	b.Queue(wholeJob+`id = $1`, jobID)
	res := l.pool.SendBatch(ctx, &b)
	defer res.Close()
	var outcome string
	if err := res.QueryRow().Scan(&outcome); err != nil {
		return nil, fmt.Errorf("postgres ledger: %s: %w", fn, err)
	}
	if err := outcomeError(fn, outcome); err != nil {
		return nil, err
	}
	j, err := scanWhole(res.QueryRow())
	if err != nil && !errors.Is(err, ledger.ErrNotFound) {
		return nil, fmt.Errorf("postgres ledger: %s: %w", fn, err)
	}
	return j, err
}
