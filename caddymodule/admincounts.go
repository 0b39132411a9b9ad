package caddymodule

import (
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
)

// adminCountsPath answers the jobs of every open ledger by state.
const adminCountsPath = "/idempotency/counts"

// countsJSON is the answer of GET /idempotency/counts: the jobs of every
// open ledger that can count them, by state (the one to act on first
// first), the oldest unknown job's creation and age, and whether a count
// covers only part of its ledger so far.
type countsJSON struct {
	Counts struct {
		Unknown   int64 `json:"unknown"`
		Pending   int64 `json:"pending"`
		Failed    int64 `json:"failed"`
		Completed int64 `json:"completed"`
	} `json:"counts"`
	OldestUnknown           *string `json:"oldest_unknown"`
	OldestUnknownAgeSeconds float64 `json:"oldest_unknown_age_seconds"`
	Partial                 bool    `json:"partial"`
}

// handleCounts serves GET /idempotency/counts.
func (a *adminAPI) handleCounts(w http.ResponseWriter, r *http.Request) error {
	if !allowMethod(w, r, http.MethodGet) {
		return nil
	}
	ls, release := holdOpenLedgers(func(err error) { a.log().Error("closing ledger", zap.Error(err)) })
	defer release()
	var (
		sum    ledger.Counts
		oldest time.Duration
	)
	for _, s := range ls {
		c, at, ok, err := s.counts(r.Context())
		if err != nil {
			a.unavailable(w, err, "")
			return nil
		}
		if ok {
			sum.Merge(c)
			oldest = max(oldest, oldestUnknownAge(c, at))
		}
	}
	var out countsJSON
	out.Counts.Unknown = sum.ByState[ledger.JobUnknown]
	out.Counts.Pending = sum.ByState[ledger.JobPending]
	out.Counts.Failed = sum.ByState[ledger.JobFailed]
	out.Counts.Completed = sum.ByState[ledger.JobCompleted]
	out.OldestUnknown = timeJSON(sum.OldestUnknown)
	out.OldestUnknownAgeSeconds = oldest.Seconds()
	out.Partial = sum.Partial
	writeJSON(w, http.StatusOK, out)
	return nil
}
