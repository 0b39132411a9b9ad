package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
)

// jobColumns are read by Job and Jobs; the body only by Job. The state is
// read as stored: leases are applied in Go against the server's clock.
const jobColumns = `id, owner_hash, key_hash, fingerprint, fingerprint_version, fingerprint_scheme, state, version,
	completed_by, extract(epoch FROM retention)::float8, created_at, completed_at, expires_at,
	response_status, response_header, %s, response_size, response_stored, ledger_clock()`

// effectiveState is the job's state with leases applied, for filtering.
const effectiveState = `CASE WHEN state = 'pending' AND completed_by IS NULL
	AND (lease_until IS NULL OR lease_until <= ledger_clock()) THEN 'unknown' ELSE state END`

const attemptColumns = `id, job_id, number, provider, scope, state, job_version, started_at, deadline, finished_at, coalesce(error, ''), resend,
	lookup_tries, lookup_last_status, lookup_last_at, lookup_next_at, lookup_settled, lookup_holder, lookup_until`

// scanJob reads the jobColumns of a row, then extra columns into extra.
func scanJob(row pgx.Row, extra ...any) (*ledger.Job, time.Time, error) {
	var (
		j                      ledger.Job
		state                  string
		completedBy            pgtype.Text
		retention              float64
		completedAt, expiresAt pgtype.Timestamptz
		cols                   responseCols
		now                    time.Time
	)
	dest := []any{&j.ID, &j.OwnerHash, &j.KeyHash, &j.Fingerprint, &j.FingerprintVersion, &j.FingerprintScheme, &state, &j.Version,
		&completedBy, &retention, &j.CreatedAt, &completedAt, &expiresAt}
	dest = append(dest, cols.dest()...)
	dest = append(dest, &now)
	dest = append(dest, extra...)
	if err := row.Scan(dest...); err != nil {
		return nil, now, err
	}
	j.State = ledger.JobState(state)
	j.CompletedBy = stringOf(completedBy)
	j.Retention = time.Duration(retention * float64(time.Second))
	j.CompletedAt, j.ExpiresAt = timeOf(completedAt), timeOf(expiresAt)
	resp, err := cols.response()
	if err != nil {
		return nil, now, err
	}
	j.Response = resp
	return &j, now, nil
}

func scanAttempt(rows pgx.CollectableRow) (ledger.Attempt, error) {
	var (
		a                     ledger.Attempt
		state                 string
		finished              pgtype.Timestamptz
		lastAt, nextAt, until pgtype.Timestamptz
		lookup                ledger.Lookup
	)
	lk := &lookup
	err := rows.Scan(&a.ID, &a.JobID, &a.Number, &a.Provider, &a.Scope, &state, &a.JobVersion, &a.StartedAt, &a.Deadline, &finished, &a.Error, &a.Resend,
		&lk.Tries, &lk.LastStatus, &lastAt, &nextAt, &lk.Settled, &lk.Holder, &until)
	a.State = ledger.AttemptState(state)
	a.FinishedAt = timeOf(finished)
	lk.LastAt, lk.NextAt, lk.Until = timeOf(lastAt), timeOf(nextAt), timeOf(until)
	a.Lookup = lookup.OrNil()
	return a, err
}

// load reads one unexpired job and its attempts in one round trip, with
// leases applied by the server's clock.
func (l *Ledger) load(ctx context.Context, jobID string) (*ledger.Job, time.Time, error) {
	if !validID(jobID) {
		return nil, time.Time{}, ledger.ErrNotFound
	}
	var b pgx.Batch
	b.Queue(fmt.Sprintf(`SELECT `+jobColumns+` FROM jobs WHERE id = $1 AND (expires_at IS NULL OR expires_at > ledger_clock())`, "response_body"), jobID)
	b.Queue(`SELECT `+attemptColumns+` FROM attempts WHERE job_id = $1 ORDER BY number`, jobID)
	res := l.pool.SendBatch(ctx, &b)
	defer res.Close()
	j, now, err := scanJob(res.QueryRow())
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, now, ledger.ErrNotFound
	}
	if err != nil {
		return nil, now, fmt.Errorf("postgres ledger: job: %w", err)
	}
	rows, err := res.Query()
	if err != nil {
		return nil, now, fmt.Errorf("postgres ledger: attempts: %w", err)
	}
	j.Attempts, err = pgx.CollectRows(rows, scanAttempt)
	if err != nil {
		return nil, now, fmt.Errorf("postgres ledger: attempts: %w", err)
	}
	fsm.ApplyLeases(j, now)
	return j, now, nil
}

// Job implements ledger.Ledger.
func (l *Ledger) Job(ctx context.Context, jobID string) (*ledger.Job, error) {
	j, now, err := l.load(ctx, jobID)
	if j != nil {
		j.ReadAt = now
	}
	return j, err
}

// attemptsJSON is the job's attempts as one JSON array, oldest first,
// times in microseconds since the epoch: Find and the lookups read them in
// the job's row.
const attemptsJSON = `(SELECT coalesce(json_agg(json_build_object(
		'id', a.id, 'number', a.number, 'provider', a.provider, 'scope', a.scope, 'state', a.state,
		'job_version', a.job_version, 'started_at', (extract(epoch FROM a.started_at) * 1000000)::int8,
		'deadline', (extract(epoch FROM a.deadline) * 1000000)::int8,
		'finished_at', (extract(epoch FROM a.finished_at) * 1000000)::int8, 'error', coalesce(a.error, ''),
		'resend', a.resend, 'lookup_tries', a.lookup_tries, 'lookup_last_status', a.lookup_last_status,
		'lookup_last_at', (extract(epoch FROM a.lookup_last_at) * 1000000)::int8,
		'lookup_next_at', (extract(epoch FROM a.lookup_next_at) * 1000000)::int8,
		'lookup_settled', a.lookup_settled, 'lookup_holder', a.lookup_holder,
		'lookup_until', (extract(epoch FROM a.lookup_until) * 1000000)::int8)
	ORDER BY a.number), '[]') FROM attempts a WHERE a.job_id = jobs.id)`

// attemptJSON is one element of attemptsJSON.
type attemptJSON struct {
	ID         string `json:"id"`
	Number     int    `json:"number"`
	Provider   string `json:"provider"`
	Scope      string `json:"scope"`
	State      string `json:"state"`
	JobVersion int64  `json:"job_version"`
	StartedAt  int64  `json:"started_at"`
	Deadline   int64  `json:"deadline"`
	FinishedAt *int64 `json:"finished_at"`
	Error      string `json:"error"`
	Resend     bool   `json:"resend"`

	LookupTries      int    `json:"lookup_tries"`
	LookupLastStatus int    `json:"lookup_last_status"`
	LookupLastAt     *int64 `json:"lookup_last_at"`
	LookupNextAt     *int64 `json:"lookup_next_at"`
	LookupSettled    bool   `json:"lookup_settled"`
	LookupHolder     string `json:"lookup_holder"`
	LookupUntil      *int64 `json:"lookup_until"`
}

// unixMicro is the time of a nullable count of microseconds since the
// epoch; zero for NULL.
func unixMicro(us *int64) time.Time {
	if us == nil {
		return time.Time{}
	}
	return time.UnixMicro(*us)
}

// Find implements ledger.Ledger: one statement, by the unique (owner_hash,
// key_hash), reads the job, its attempts and the server's clock from one
// snapshot, so the attempts are the job's even while a reservation
// replaces an expired job in place; leases are applied in Go by that clock.
func (l *Ledger) Find(ctx context.Context, ownerHash, keyHash []byte) (*ledger.Job, error) {
	j, err := scanWhole(l.pool.QueryRow(ctx, wholeJob+`owner_hash = $1 AND key_hash = $2`, ownerHash, keyHash))
	if err != nil && !errors.Is(err, ledger.ErrNotFound) {
		return nil, fmt.Errorf("postgres ledger: find: %w", err)
	}
	return j, err
}

// wholeJob reads an unexpired job with its body and attempts (attemptsJSON)
// in one row; the condition that picks the job follows.
var wholeJob = fmt.Sprintf(`SELECT `+jobColumns+`, `+attemptsJSON+` FROM jobs
	WHERE (expires_at IS NULL OR expires_at > ledger_clock()) AND `, "response_body")

// scanWhole reads a row of wholeJob: the job, its attempts and the
// server's clock from one snapshot, so the attempts are the job's even
// while a reservation replaces an expired job in place. Leases are applied
// by that clock, and ReadAt is set to it, as Job reads the job.
func scanWhole(row pgx.Row) (*ledger.Job, error) {
	var raw []byte
	j, now, err := scanJob(row, &raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ledger.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	var attempts []attemptJSON
	if err := json.Unmarshal(raw, &attempts); err != nil {
		return nil, fmt.Errorf("attempts: %w", err)
	}
	j.Attempts = make([]ledger.Attempt, len(attempts))
	for i, a := range attempts {
		j.Attempts[i] = ledger.Attempt{
			ID: a.ID, JobID: j.ID, Number: a.Number, Provider: a.Provider, Scope: a.Scope,
			State: ledger.AttemptState(a.State), JobVersion: a.JobVersion,
			StartedAt: time.UnixMicro(a.StartedAt), Deadline: time.UnixMicro(a.Deadline),
			FinishedAt: unixMicro(a.FinishedAt), Error: a.Error, Resend: a.Resend,
			Lookup: ledger.Lookup{
				Tries: a.LookupTries, LastStatus: a.LookupLastStatus,
				LastAt: unixMicro(a.LookupLastAt), NextAt: unixMicro(a.LookupNextAt),
				Settled: a.LookupSettled, Holder: a.LookupHolder, Until: unixMicro(a.LookupUntil),
			}.OrNil(),
		}
	}
	fsm.ApplyLeases(j, now)
	j.ReadAt = now
	return j, nil
}

// Jobs implements ledger.Ledger. Listed jobs carry their attempts and
// their response's status and size, not its body.
func (l *Ledger) Jobs(ctx context.Context, q ledger.JobQuery) (ledger.JobPage, error) {
	limit := ledger.EffectiveLimit(q.Limit)
	var before any
	if q.Before != "" {
		if !validID(q.Before) {
			return ledger.JobPage{}, fmt.Errorf("postgres ledger: invalid cursor %q", q.Before)
		}
		before = q.Before
	}
	rows, err := l.pool.Query(ctx, fmt.Sprintf(`SELECT `+jobColumns+` FROM jobs
		WHERE (expires_at IS NULL OR expires_at > ledger_clock())
		AND ($1 = '' OR `+effectiveState+` = $1)
		AND ($2 = '' OR EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.id AND a.provider = $2))
		AND ($3::uuid IS NULL OR id < $3::uuid)
		ORDER BY id DESC LIMIT $4`, "NULL::bytea"),
		string(q.State), q.Provider, before, limit+1)
	if err != nil {
		return ledger.JobPage{}, fmt.Errorf("postgres ledger: jobs: %w", err)
	}
	var (
		jobs []*ledger.Job
		now  time.Time
	)
	for rows.Next() {
		j, n, err := scanJob(rows)
		if err != nil {
			rows.Close()
			return ledger.JobPage{}, fmt.Errorf("postgres ledger: jobs: %w", err)
		}
		jobs, now = append(jobs, j), n
	}
	if err := rows.Err(); err != nil {
		return ledger.JobPage{}, fmt.Errorf("postgres ledger: jobs: %w", err)
	}
	var page ledger.JobPage
	if len(jobs) > limit {
		jobs = jobs[:limit]
		page.Next = jobs[limit-1].ID
	}
	page.Jobs = jobs
	if len(jobs) == 0 {
		return page, nil
	}
	ids := make([]string, len(jobs))
	byID := make(map[string]*ledger.Job, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID
		byID[j.ID] = j
	}
	arows, err := l.pool.Query(ctx, `SELECT `+attemptColumns+` FROM attempts WHERE job_id = ANY($1::uuid[]) ORDER BY job_id, number`, ids)
	if err != nil {
		return ledger.JobPage{}, fmt.Errorf("postgres ledger: attempts: %w", err)
	}
	attempts, err := pgx.CollectRows(arows, scanAttempt)
	if err != nil {
		return ledger.JobPage{}, fmt.Errorf("postgres ledger: attempts: %w", err)
	}
	for _, a := range attempts {
		if j := byID[a.JobID]; j != nil {
			j.Attempts = append(j.Attempts, a)
		}
	}
	for _, j := range jobs {
		fsm.ApplyLeases(j, now)
	}
	return page, nil
}
