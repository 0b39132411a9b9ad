package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
	"github.com/onejob/onejob/ledger/internal/near"
)

func micros(d time.Duration) int64 { return d.Microseconds() }

func encodeHeader(h map[string][]string) ([]byte, error) {
	if h == nil {
		return nil, nil
	}
	return json.Marshal(h)
}

func decodeHeader(b []byte) (map[string][]string, error) {
	if b == nil {
		return nil, nil
	}
	var h map[string][]string
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("postgres ledger: stored headers: %w", err)
	}
	return h, nil
}

// validID reports whether id can name a row; other ids are simply not found.
func validID(id string) bool {
	_, err := uuid.Parse(id)
	return err == nil
}

// errInvalidID reports an id the caller chose that cannot name a row.
func errInvalidID(what, id string) error {
	return fmt.Errorf("postgres ledger: invalid %s id %q: the caller chooses a UUID (ledger.NewID)", what, id)
}

// responseCols are the nullable response columns a function returns.
type responseCols struct {
	status pgtype.Int4
	header []byte
	body   []byte
	size   pgtype.Int8
	stored pgtype.Bool
}

func (r *responseCols) dest() []any {
	return []any{&r.status, &r.header, &r.body, &r.size, &r.stored}
}

func (r *responseCols) response() (*ledger.Response, error) {
	if !r.status.Valid {
		return nil, nil
	}
	h, err := decodeHeader(r.header)
	if err != nil {
		return nil, err
	}
	resp := &ledger.Response{Status: int(r.status.Int32), Header: h, Size: r.size.Int64, Stored: r.stored.Bool}
	if resp.Stored {
		resp.Body = r.body
		if resp.Body == nil {
			resp.Body = []byte{}
		}
	}
	return resp, nil
}

func timeOf(t pgtype.Timestamptz) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time
}

func stringOf(t pgtype.Text) string { return t.String }

// Reserve implements ledger.Ledger. A replay of a completed job this
// process read lately is answered from memory: the job cannot change before
// it expires (see near.Margin). A repeat of the winner's own reservation is
// not a replay: the ledger answers it, as the first call was answered.
func (l *Ledger) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	if !validID(p.JobID) {
		return ledger.Reservation{}, errInvalidID("job", p.JobID)
	}
	if !validID(p.Attempt.ID) {
		return ledger.Reservation{}, errInvalidID("attempt", p.Attempt.ID)
	}
	key, now, gen := near.Key(p.OwnerHash, p.KeyHash), time.Now(), l.replays.Gen()
	if j := l.replays.Get(key, now); j != nil {
		if r, ok := near.Answer(j, &p, now); ok {
			return r, nil
		}
	}
	r, err := l.reserve(ctx, p)
	if err != nil {
		return r, err
	}
	return l.replays.Remember(key, r, &p, near.Margin, gen), nil
}

// reserve runs the reservation in the ledger.
func (l *Ledger) reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	var (
		outcome                                  string
		ts                                       time.Time
		jobID, jobState                          string
		jobVersion                               int64
		completedBy                              pgtype.Text
		createdAt, completedAt, expiresAt        pgtype.Timestamptz
		resp                                     responseCols
		attemptID, attemptProvider, attemptState pgtype.Text
		attemptNumber                            pgtype.Int4
		attemptVersion                           pgtype.Int8
		attemptStarted, attemptDeadline          pgtype.Timestamptz
		fpVersion                                int32
		fpScheme                                 string
	)
	dest := []any{&outcome, &ts, &jobID, &jobState, &jobVersion, &completedBy, &createdAt, &completedAt, &expiresAt}
	dest = append(dest, resp.dest()...)
	dest = append(dest, &attemptID, &attemptNumber, &attemptProvider, &attemptState, &attemptVersion, &attemptStarted, &attemptDeadline,
		&fpVersion, &fpScheme)
	err := l.pool.QueryRow(ctx, `SELECT * FROM reserve($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		p.JobID, p.Attempt.ID, p.OwnerHash, p.KeyHash, p.Fingerprint, p.FingerprintVersion, p.FingerprintScheme,
		p.Attempt.Provider, p.Attempt.Scope, micros(p.Attempt.Lease), micros(p.Retention)).Scan(dest...)
	if err != nil {
		return ledger.Reservation{}, fmt.Errorf("postgres ledger: reserve: %w", err)
	}
	r := ledger.Reservation{Now: ts}
	var ok bool
	if r.Outcome, ok = ledger.ParseOutcome(outcome); !ok {
		return ledger.Reservation{}, errUnexpected("reserve", outcome)
	}
	r.Job = &ledger.Job{
		ID:        jobID,
		State:     ledger.JobState(jobState),
		Version:   jobVersion,
		CreatedAt: timeOf(createdAt),
	}
	if r.Outcome == ledger.Mismatch {
		r.Job.FingerprintVersion, r.Job.FingerprintScheme = int(fpVersion), fpScheme
		return ledger.Mismatched(r.Job, ts), nil
	}
	j := r.Job
	p.Identify(j)
	j.Retention = p.Retention
	j.CompletedBy = stringOf(completedBy)
	j.CompletedAt, j.ExpiresAt = timeOf(completedAt), timeOf(expiresAt)
	if j.Response, err = resp.response(); err != nil {
		return ledger.Reservation{}, err
	}
	if attemptID.Valid {
		r.Attempt = &ledger.Attempt{
			ID:         attemptID.String,
			JobID:      jobID,
			Number:     int(attemptNumber.Int32),
			Provider:   attemptProvider.String,
			State:      ledger.AttemptState(attemptState.String),
			JobVersion: attemptVersion.Int64,
			StartedAt:  timeOf(attemptStarted),
			Deadline:   timeOf(attemptDeadline),
		}
		if r.Outcome == ledger.Created || r.Outcome == ledger.Reopened {
			r.Attempt.Scope = p.Attempt.Scope // the attempt this call started
			j.Attempts = []ledger.Attempt{*r.Attempt}
		}
	}
	return r, nil
}

// attemptCols are the columns of an attempt a function returns.
type attemptCols struct {
	number            pgtype.Int4
	version           pgtype.Int8
	provider, state   pgtype.Text
	started, deadline pgtype.Timestamptz
}

func (c *attemptCols) dest() []any {
	return []any{&c.number, &c.version, &c.provider, &c.state, &c.started, &c.deadline}
}

func (c *attemptCols) attempt(id, jobID string) *ledger.Attempt {
	return &ledger.Attempt{
		ID:         id,
		JobID:      jobID,
		Number:     int(c.number.Int32),
		Provider:   c.provider.String,
		State:      ledger.AttemptState(c.state.String),
		JobVersion: c.version.Int64,
		StartedAt:  timeOf(c.started),
		Deadline:   timeOf(c.deadline),
	}
}

// Hedge implements ledger.Ledger.
func (l *Ledger) Hedge(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	return l.start(ctx, "hedge", ref, next, nil)
}

// Resend implements ledger.Ledger.
func (l *Ledger) Resend(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	if !validID(ref.AttemptID) {
		return ledger.Attempt{}, ledger.ErrNotFound
	}
	return l.start(ctx, "resend", ref, next, &ref.AttemptID)
}

// start calls start_attempt: a hedge, or a re-send reconciling the
// attempt reconciles.
func (l *Ledger) start(ctx context.Context, op string, ref ledger.AttemptRef, next ledger.NextAttempt, reconciles *string) (ledger.Attempt, error) {
	if !validID(next.ID) {
		return ledger.Attempt{}, errInvalidID("attempt", next.ID)
	}
	if !validID(ref.JobID) {
		return ledger.Attempt{}, ledger.ErrNotFound
	}
	var (
		outcome string
		a       attemptCols
	)
	err := l.pool.QueryRow(ctx, `SELECT * FROM start_attempt($1, $2, $3, $4, $5, $6, $7)`,
		ref.JobID, ref.Version, next.ID, next.Provider, next.Scope, micros(next.Lease), reconciles).Scan(append([]any{&outcome}, a.dest()...)...)
	if err != nil {
		return ledger.Attempt{}, fmt.Errorf("postgres ledger: %s: %w", op, err)
	}
	switch outcome {
	case "ok":
		r := a.attempt(next.ID, ref.JobID)
		r.Scope, r.Resend = next.Scope, reconciles != nil
		return *r, nil
	case "not_found":
		return ledger.Attempt{}, ledger.ErrNotFound
	case "stale":
		return ledger.Attempt{}, ledger.ErrStale
	}
	return ledger.Attempt{}, errUnexpected(op, outcome)
}

// Complete implements ledger.Ledger.
func (l *Ledger) Complete(ctx context.Context, ref ledger.AttemptRef, resp ledger.Response) (ledger.Completion, error) {
	if !validID(ref.JobID) || !validID(ref.AttemptID) {
		return ledger.Completion{}, ledger.ErrNotFound
	}
	header, err := encodeHeader(resp.Header)
	if err != nil {
		return ledger.Completion{}, err
	}
	body := resp.Body
	if !resp.Stored {
		body = nil
	}
	var (
		outcome                string
		state                  pgtype.Text
		version                pgtype.Int8
		completedBy            pgtype.Text
		completedAt, expiresAt pgtype.Timestamptz
		cols                   responseCols
		readAt                 pgtype.Timestamptz
	)
	dest := append(append([]any{&outcome, &state, &version, &completedBy, &completedAt, &expiresAt}, cols.dest()...), &readAt)
	err = l.completeAnnouncing(ctx, ref.JobID,
		[]any{ref.JobID, ref.AttemptID, ref.Version, resp.Status, header, body, resp.Size, resp.Stored}, dest)
	if err != nil {
		return ledger.Completion{}, fmt.Errorf("postgres ledger: complete: %w", err)
	}
	if outcome == "not_found" {
		return ledger.Completion{}, ledger.ErrNotFound
	}
	if outcome != "won" && outcome != "lost" {
		return ledger.Completion{}, errUnexpected("complete", outcome)
	}
	j := &ledger.Job{
		ID:          ref.JobID,
		State:       ledger.JobState(state.String),
		Version:     version.Int64,
		CompletedBy: stringOf(completedBy),
		CompletedAt: timeOf(completedAt),
		ExpiresAt:   timeOf(expiresAt),
		ReadAt:      timeOf(readAt),
	}
	if j.Response, err = cols.response(); err != nil {
		return ledger.Completion{}, err
	}
	return ledger.Completion{Won: outcome == "won", Job: j}, nil
}

// SaveBody implements ledger.Ledger.
func (l *Ledger) SaveBody(ctx context.Context, ref ledger.AttemptRef, body []byte, size int64, stored bool) error {
	if !validID(ref.JobID) || !validID(ref.AttemptID) {
		return ledger.ErrNotFound
	}
	if !stored {
		body = nil
	}
	// The waiters are woken (a duplicate on another instance waits for a
	// streamed answer's end to replay it), in the same statement. A job
	// gone or expired is not found, one another attempt won stale
	// (fsm.SaveBody).
	var found, saved int
	err := l.pool.QueryRow(ctx, `WITH job AS (
			SELECT id FROM jobs WHERE id = $1 AND (expires_at IS NULL OR expires_at > ledger_clock())),
		saved AS (
			UPDATE jobs t SET response_body = $3, response_size = $4, response_stored = $5
			FROM job WHERE t.id = job.id AND t.completed_by = $2 AND t.response_status IS NOT NULL
			RETURNING t.id),
		notified AS (SELECT pg_notify($6, id::text) FROM saved)
		SELECT (SELECT count(*) FROM job), (SELECT count(*) FROM notified)`,
		ref.JobID, ref.AttemptID, body, size, stored, l.channel).Scan(&found, &saved)
	switch {
	case err != nil:
		return fmt.Errorf("postgres ledger: save body: %w", err)
	case found == 0:
		return ledger.ErrNotFound
	case saved == 0:
		return ledger.ErrStale
	}
	return nil
}

// Fail implements ledger.Ledger.
func (l *Ledger) Fail(ctx context.Context, ref ledger.AttemptRef, reason string, next *ledger.NextAttempt) (*ledger.Attempt, error) {
	var (
		nextID                  any
		nextProvider, nextScope string
		nextLease               int64
	)
	if next != nil {
		if !validID(next.ID) {
			return nil, errInvalidID("attempt", next.ID)
		}
		nextID, nextProvider, nextScope, nextLease = next.ID, next.Provider, next.Scope, micros(next.Lease)
	}
	if !validID(ref.JobID) || !validID(ref.AttemptID) {
		return nil, ledger.ErrNotFound
	}
	var (
		outcome string
		a       attemptCols
	)
	err := l.pool.QueryRow(ctx, `SELECT * FROM fail($1, $2, $3, $4, $5, $6, $7)`,
		ref.JobID, ref.AttemptID, reason, nextID, nextProvider, nextScope, nextLease).Scan(append([]any{&outcome}, a.dest()...)...)
	if err != nil {
		return nil, fmt.Errorf("postgres ledger: fail: %w", err)
	}
	switch outcome {
	case "ok":
		return nil, nil
	case "next":
		if next == nil {
			break
		}
		r := a.attempt(next.ID, ref.JobID)
		r.Scope = next.Scope
		return r, nil
	case "blocked":
		return nil, ledger.ErrBlocked
	case "stale":
		return nil, ledger.ErrStale
	case "not_found":
		return nil, ledger.ErrNotFound
	}
	return nil, errUnexpected("fail", outcome)
}

// Unsent implements ledger.Ledger.
func (l *Ledger) Unsent(ctx context.Context, ref ledger.AttemptRef) error {
	if !validID(ref.JobID) || !validID(ref.AttemptID) {
		return ledger.ErrNotFound
	}
	var outcome string
	if err := l.pool.QueryRow(ctx, `SELECT unsent($1, $2, $3)`, ref.JobID, ref.AttemptID, ledger.ReasonUnsent).Scan(&outcome); err != nil {
		return fmt.Errorf("postgres ledger: unsent: %w", err)
	}
	return outcomeError("unsent", outcome)
}

// MarkUnknown implements ledger.Ledger.
func (l *Ledger) MarkUnknown(ctx context.Context, ref ledger.AttemptRef, reason string) error {
	if !validID(ref.JobID) || !validID(ref.AttemptID) {
		return ledger.ErrNotFound
	}
	var outcome string
	if err := l.pool.QueryRow(ctx, `SELECT mark_unknown($1, $2, $3)`, ref.JobID, ref.AttemptID, reason).Scan(&outcome); err != nil {
		return fmt.Errorf("postgres ledger: mark unknown: %w", err)
	}
	return outcomeError("mark_unknown", outcome)
}

// Resolve implements ledger.Ledger.
func (l *Ledger) Resolve(ctx context.Context, jobID string, r ledger.Resolution) (*ledger.Job, error) {
	if !validID(jobID) {
		return nil, ledger.ErrNotFound
	}
	cancel := r.Cancel || r.Response == nil
	var (
		admin  any // NULL for a cancel
		status int
		header []byte
		body   []byte
		err    error
	)
	if !cancel {
		if !validID(r.AttemptID) {
			return nil, errInvalidID("attempt", r.AttemptID)
		}
		admin = r.AttemptID
		status, body = r.Response.Status, r.Response.Body
		if body == nil {
			body = []byte{}
		}
		if header, err = encodeHeader(r.Response.Header); err != nil {
			return nil, err
		}
	}
	var outcome string
	if err := l.pool.QueryRow(ctx, `SELECT resolve($1, $2, $3, $4, $5, $6)`,
		jobID, cancel, admin, status, header, body).Scan(&outcome); err != nil {
		return nil, fmt.Errorf("postgres ledger: resolve: %w", err)
	}
	if err := outcomeError("resolve", outcome); err != nil {
		return nil, err
	}
	return l.Job(ctx, jobID)
}

// Sweep implements ledger.Ledger.
func (l *Ledger) Sweep(ctx context.Context, limit int) (ledger.SweepStats, error) {
	var st ledger.SweepStats
	if err := l.pool.QueryRow(ctx, `SELECT * FROM sweep($1)`, limit).Scan(&st.Unknown, &st.Removed); err != nil {
		return st, fmt.Errorf("postgres ledger: sweep: %w", err)
	}
	return st, nil
}

// outcomeError maps a transition's outcome name to the ledger's error.
func outcomeError(transition, outcome string) error {
	return fsm.OutcomeError("postgres ledger", transition, outcome)
}
