package redis

import (
	"context"
	"strconv"
	"time"

	"github.com/onejob/onejob/ledger"
)

// ClaimLookup implements ledger.Ledger.
func (l *Ledger) ClaimLookup(ctx context.Context, ref ledger.AttemptRef, holder string, lease time.Duration) (*ledger.Job, error) {
	return l.lookup(ctx, "claim lookup", ref, "claim", holder, micros(lease))
}

// SettleLookup implements ledger.Ledger.
func (l *Ledger) SettleLookup(ctx context.Context, ref ledger.AttemptRef, holder string, r ledger.LookupResult) (*ledger.Job, error) {
	found, status, header, body := "retry", "0", "", []byte(nil)
	switch {
	case r.Found != nil:
		var err error
		if header, err = encodeHeader(r.Found.Header); err != nil {
			return nil, err
		}
		found, status, body = "found", strconv.Itoa(r.Found.Status), r.Found.Body
	case r.Absent:
		found = "absent"
	}
	return l.lookup(ctx, "settle lookup", ref, "settle", holder,
		strconv.Itoa(r.Status), found, micros(r.Retry), ledger.ReasonAbsent, status, header, body)
}

// lookup runs lookup.lua in mode (claim or settle) and returns the job as
// it left it, read at the server's clock.
func (l *Ledger) lookup(ctx context.Context, what string, ref ledger.AttemptRef, mode, holder string, args ...any) (*ledger.Job, error) {
	if !validID(ref.JobID) {
		return nil, ledger.ErrNotFound
	}
	bp, err := l.where(ctx, ref.JobID)
	if err != nil {
		return nil, err
	}
	outcome, a, err := l.run(ctx, what, l.scripts.lookup,
		[]string{jobKey(bp, ref.JobID), attemptsKey(bp, ref.JobID), leasesKey(bp), expiryKey(bp)},
		append([]any{bp, mode, ref.AttemptID, holder}, args...)...)
	if err != nil {
		return nil, err
	}
	if outcome != "ok" {
		return nil, outcomeError(what, outcome)
	}
	if len(a) < 4 {
		return nil, errReply(what, a)
	}
	j, err := scriptJob(what, a[2], a[3])
	if err != nil {
		return nil, err
	}
	j.ReadAt = nowOf(a, 1)
	return j, nil
}
