package caddymodule

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/proxy"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves the idempotency endpoints of Caddy's admin API
// (docs/contract.md, section 10): it lists, shows and resolves jobs in
// every ledger open in this process, and lists the providers with their
// probe results.
//
// Admin modules are provisioned apart from the handlers, before the apps,
// on every config load: the ledgers are looked up per request in the
// process's pool, never kept.
type adminAPI struct {
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.idempotency",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Provision sets up the logger.
func (a *adminAPI) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger(a)
	return nil
}

// Routes returns the routes of the idempotency admin endpoints.
func (a *adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: adminJobsPath, Handler: caddy.AdminHandlerFunc(a.handleJobs)},
		{Pattern: adminJobsPath + "/", Handler: caddy.AdminHandlerFunc(a.handleJob)},
		{Pattern: adminProvidersPath, Handler: caddy.AdminHandlerFunc(a.handleProviders)},
		{Pattern: adminCountsPath, Handler: caddy.AdminHandlerFunc(a.handleCounts)},
		{Pattern: adminStoragePath, Handler: caddy.AdminHandlerFunc(a.handleStorage)},
		{Pattern: adminPurgePath, Handler: caddy.AdminHandlerFunc(a.handlePurge)},
		{Pattern: uiPath, Handler: caddy.AdminHandlerFunc(serveUI)},
	}
}

const (
	adminJobsPath      = "/idempotency/jobs"
	adminProvidersPath = "/idempotency/providers"
)

// maxResolveBody bounds a resolve request: room for the base64 of an
// answer as large as max_response_body's default, and 1 MiB for the rest.
var maxResolveBody = int64(base64.StdEncoding.EncodedLen(proxy.DefaultMaxResponseBody)) + 1<<20

// Problem names of the admin API; each is the last part of a problem type
// urn:onejob:problem:<name>.
const (
	problemInvalidRequest   = "invalid-request"
	problemNotFound         = "not-found"
	problemMethodNotAllowed = "method-not-allowed"
	problemAlreadyCompleted = "already-completed"
	problemRequestTooLarge  = "request-too-large"
)

func (a *adminAPI) log() *zap.Logger {
	if a.logger == nil {
		return zap.NewNop()
	}
	return a.logger
}

// handleJobs serves GET /idempotency/jobs?state=&provider=&limit=&before=:
// one page of jobs from every open ledger, newest first.
func (a *adminAPI) handleJobs(w http.ResponseWriter, r *http.Request) error {
	if !allowMethod(w, r, http.MethodGet) {
		return nil
	}
	q, err := parseJobQuery(r.URL.Query())
	if err != nil {
		writeProblem(w, http.StatusBadRequest, problemInvalidRequest, "Invalid request", err.Error(), "")
		return nil
	}
	limit := ledger.EffectiveLimit(q.Limit)

	ls, release := a.openLedgers()
	defer release()
	var (
		jobs []*ledger.Job
		more bool
	)
	for _, l := range ls {
		page, err := l.Jobs(r.Context(), q)
		if err != nil {
			a.unavailable(w, err, "")
			return nil
		}
		jobs = append(jobs, page.Jobs...)
		more = more || page.Next != ""
	}
	// Ids are UUIDv7: descending string order is newest first.
	slices.SortFunc(jobs, func(x, y *ledger.Job) int { return strings.Compare(y.ID, x.ID) })
	jobs = slices.CompactFunc(jobs, func(x, y *ledger.Job) bool { return x.ID == y.ID })
	if len(jobs) > limit {
		jobs, more = jobs[:limit], true
	}

	out := struct {
		Jobs []jobJSON `json:"jobs"`
		Next *string   `json:"next"`
	}{Jobs: make([]jobJSON, len(jobs))}
	for i, j := range jobs {
		out.Jobs[i] = newJobJSON(j)
	}
	if more && len(jobs) > 0 {
		out.Next = &jobs[len(jobs)-1].ID
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// parseJobQuery validates the listing's query parameters; all are optional.
func parseJobQuery(v url.Values) (ledger.JobQuery, error) {
	var q ledger.JobQuery
	if s := v.Get("state"); s != "" {
		q.State = ledger.JobState(s)
		if !q.State.Valid() {
			return q, fmt.Errorf("state must be pending, unknown, completed or failed, not %q", s)
		}
	}
	q.Provider = v.Get("provider")
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > ledger.MaxLimit {
			return q, fmt.Errorf("limit must be an integer from 1 to %d, not %q", ledger.MaxLimit, s)
		}
		q.Limit = n
	}
	if s := v.Get("before"); s != "" {
		id, err := uuid.Parse(s)
		if err != nil {
			return q, fmt.Errorf("before must be a job id (a UUID), not %q", s)
		}
		q.Before = id.String()
	}
	return q, nil
}

// handleJob serves GET /idempotency/jobs/<id> and
// POST /idempotency/jobs/<id>/resolve.
func (a *adminAPI) handleJob(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.Path, adminJobsPath+"/")
	if rest == "" {
		return a.handleJobs(w, r)
	}
	id, action, _ := strings.Cut(rest, "/")
	switch action {
	case "":
		if allowMethod(w, r, http.MethodGet) {
			a.getJob(w, r, id)
		}
	case "resolve":
		if allowMethod(w, r, http.MethodPost) {
			a.resolveJob(w, r, id)
		}
	default:
		writeProblem(w, http.StatusNotFound, problemNotFound, "Not found", "No such endpoint: "+r.URL.Path, "")
	}
	return nil
}

// getJob answers with the job from whichever open ledger has it.
func (a *adminAPI) getJob(w http.ResponseWriter, r *http.Request, rawID string) {
	id, ok := jobID(rawID)
	if !ok {
		jobNotFound(w, rawID)
		return
	}
	j, err := a.inLedgers(func(l ledger.Ledger) (*ledger.Job, error) { return l.Job(r.Context(), id) })
	if err != nil {
		a.lookupFailed(w, err, id)
		return
	}
	writeJSON(w, http.StatusOK, newJobJSON(j))
}

// inLedgers calls op on each open ledger until one has the job, and
// returns that ledger's answer (a job, or ledger.ErrCompleted). When none
// has it, the error is the last one of a ledger that could not answer, or
// else ledger.ErrNotFound.
func (a *adminAPI) inLedgers(op func(ledger.Ledger) (*ledger.Job, error)) (*ledger.Job, error) {
	ls, release := a.openLedgers()
	defer release()
	failed := ledger.ErrNotFound
	for _, l := range ls {
		j, err := op(l)
		switch {
		case err == nil, errors.Is(err, ledger.ErrCompleted):
			return j, err
		case !errors.Is(err, ledger.ErrNotFound):
			failed = err
		}
	}
	return nil, failed
}

// lookupFailed answers a job lookup that found no job: 404 when no ledger
// has it, 503 when one could not answer.
func (a *adminAPI) lookupFailed(w http.ResponseWriter, err error, id string) {
	if errors.Is(err, ledger.ErrNotFound) {
		jobNotFound(w, id)
		return
	}
	a.unavailable(w, err, id)
}

// resolveRequest is the body of POST /idempotency/jobs/<id>/resolve.
type resolveRequest struct {
	Outcome  string `json:"outcome"`
	Response *struct {
		Status  int                 `json:"status"`
		Headers map[string][]string `json:"headers"`
		Body    string              `json:"body"` // base64
	} `json:"response"`
}

// resolveJob settles a job out of band in whichever open ledger has it.
func (a *adminAPI) resolveJob(w http.ResponseWriter, r *http.Request, rawID string) {
	res, status, err := parseResolution(w, r)
	if err != nil {
		name, title := problemInvalidRequest, "Invalid request"
		if status == http.StatusRequestEntityTooLarge {
			name, title = problemRequestTooLarge, "Request too large"
		}
		writeProblem(w, status, name, title, err.Error(), "")
		return
	}
	id, ok := jobID(rawID)
	if !ok {
		jobNotFound(w, rawID)
		return
	}
	// The operator's answer completes the job with an attempt whose id is
	// chosen here, so that a repeat of the call is recognized.
	res.AttemptID = ledger.NewID()
	j, err := a.inLedgers(func(l ledger.Ledger) (*ledger.Job, error) { return sealing(l).Resolve(r.Context(), id, res) })
	switch {
	case err == nil:
		a.log().Info("job resolved by an operator",
			zap.String("job_id", id), zap.Bool("cancel", res.Cancel), zap.Int64("version", j.Version))
		writeJSON(w, http.StatusOK, newJobJSON(j))
	case errors.Is(err, ledger.ErrCompleted):
		writeProblem(w, http.StatusConflict, problemAlreadyCompleted, "Job already completed",
			"The job already completed; its result cannot be changed.", id)
	default:
		a.lookupFailed(w, err, id)
	}
}

// parseResolution reads and validates a resolve request. On error, status
// is the HTTP status to answer with.
func parseResolution(w http.ResponseWriter, r *http.Request) (ledger.Resolution, int, error) {
	var req resolveRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxResolveBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("trailing data after the JSON object")
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return ledger.Resolution{}, http.StatusRequestEntityTooLarge, fmt.Errorf("the request body is larger than %d bytes", mbe.Limit)
		}
		return ledger.Resolution{}, http.StatusBadRequest, fmt.Errorf("invalid JSON body: %v", err)
	}
	bad := func(format string, args ...any) (ledger.Resolution, int, error) {
		return ledger.Resolution{}, http.StatusBadRequest, fmt.Errorf(format, args...)
	}
	switch req.Outcome {
	case "cancel":
		if req.Response != nil {
			return bad(`outcome "cancel" takes no response`)
		}
		return ledger.Resolution{Cancel: true}, 0, nil
	case "complete":
	default:
		return bad(`outcome must be "cancel" or "complete", not %q`, req.Outcome)
	}
	if req.Response == nil {
		return bad(`outcome "complete" needs a response`)
	}
	if s := req.Response.Status; s < 100 || s > 599 {
		return bad("response status must be from 100 to 599, not %d", s)
	}
	body, err := base64.StdEncoding.DecodeString(req.Response.Body)
	if err != nil {
		return bad("response body is not valid base64: %v", err)
	}
	header, err := answerHeader(req.Response.Headers, len(body))
	if err != nil {
		return bad("%v", err)
	}
	return ledger.Resolution{Response: &ledger.Response{
		Status: req.Response.Status,
		Header: header,
		Body:   body,
		Size:   int64(len(body)),
		Stored: true,
	}}, 0, nil
}

// answerHeader validates an operator's answer headers and returns them
// with canonical names, as a replay writes them.
func answerHeader(in map[string][]string, bodyLen int) (map[string][]string, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make(map[string][]string, len(in))
	for name, values := range in {
		if err := checkStoredHeader(name, values); err != nil {
			return nil, err
		}
		key := http.CanonicalHeaderKey(name)
		if key == "Content-Length" && (len(values) != 1 || values[0] != strconv.Itoa(bodyLen)) {
			return nil, fmt.Errorf("header Content-Length must be the body's length, %d", bodyLen)
		}
		out[key] = append(out[key], values...)
	}
	return out, nil
}

// handleProviders serves GET /idempotency/providers: every handler's
// providers, each with its handler's scope, in the order first configured.
func (a *adminAPI) handleProviders(w http.ResponseWriter, r *http.Request) error {
	if !allowMethod(w, r, http.MethodGet) {
		return nil
	}
	type probeJSON struct {
		OK     bool    `json:"ok"`
		Error  string  `json:"error"`
		At     *string `json:"at"`
		Status int     `json:"status"`
	}
	type providerJSON struct {
		Scope string     `json:"scope"` // the handler's that declares it
		Name  string     `json:"name"`
		Probe *probeJSON `json:"probe"`
	}
	list := listProviders()
	out := struct {
		Providers []providerJSON `json:"providers"`
	}{Providers: make([]providerJSON, len(list))}
	for i, p := range list {
		out.Providers[i].Scope, out.Providers[i].Name = p.Scope, p.Name
		if p.Probe != nil {
			out.Providers[i].Probe = &probeJSON{
				OK:     p.Probe.OK,
				Error:  p.Probe.Error,
				At:     timeJSON(p.Probe.At),
				Status: p.Probe.Status,
			}
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// jobJSON is a job as the admin API shows it (docs/contract.md, section
// 10): hashes in lowercase hex, times in RFC 3339, absent values null.
type jobJSON struct {
	ID          string          `json:"id"`
	State       ledger.JobState `json:"state"`
	Version     int64           `json:"version"`
	OwnerHash   *string         `json:"owner_hash"`
	KeyHash     *string         `json:"key_hash"`
	Fingerprint *string         `json:"fingerprint"`
	CreatedAt   *string         `json:"created_at"`
	CompletedAt *string         `json:"completed_at"`
	CompletedBy *string         `json:"completed_by"`
	Response    *responseJSON   `json:"response"`
	Attempts    []attemptJSON   `json:"attempts"`
}

type responseJSON struct {
	Status int   `json:"status"`
	Size   int64 `json:"size"`
	Stored bool  `json:"stored"`
}

type attemptJSON struct {
	Number     int                 `json:"number"`
	ID         string              `json:"id"`
	Provider   string              `json:"provider"`
	Scope      *string             `json:"scope"` // the handler's; null for an operator's
	State      ledger.AttemptState `json:"state"`
	StartedAt  *string             `json:"started_at"`
	FinishedAt *string             `json:"finished_at"`
	Error      *string             `json:"error"`
	// Resend marks a re-send to a provider that deduplicates;
	// Reconciled is "resend" on the re-send that settled the job, "lookup"
	// on an attempt a lookup settled; Reconcile is the record of its
	// lookups, null while none ran.
	Resend     bool           `json:"resend"`
	Reconciled *string        `json:"reconciled"`
	Reconcile  *reconcileJSON `json:"reconcile"`
}

type reconcileJSON struct {
	Tries      int     `json:"tries"`
	LastStatus *int    `json:"last_status"`
	LastAt     *string `json:"last_at"`
	NextAt     *string `json:"next_at"`
}

func newJobJSON(j *ledger.Job) jobJSON {
	out := jobJSON{
		ID:          j.ID,
		State:       j.State,
		Version:     j.Version,
		OwnerHash:   hexJSON(j.OwnerHash),
		KeyHash:     hexJSON(j.KeyHash),
		Fingerprint: hexJSON(j.Fingerprint),
		CreatedAt:   timeJSON(j.CreatedAt),
		CompletedAt: timeJSON(j.CompletedAt),
		CompletedBy: stringJSON(j.CompletedBy),
		Attempts:    make([]attemptJSON, len(j.Attempts)),
	}
	if j.Response != nil {
		out.Response = &responseJSON{Status: j.Response.Status, Size: j.Response.Size, Stored: j.Response.Stored}
	}
	for i, at := range j.Attempts {
		out.Attempts[i] = attemptJSON{
			Number:     at.Number,
			ID:         at.ID,
			Provider:   at.Provider,
			Scope:      stringJSON(at.Scope),
			State:      at.State,
			StartedAt:  timeJSON(at.StartedAt),
			FinishedAt: timeJSON(at.FinishedAt),
			Error:      stringJSON(at.Error),
			Resend:     at.Resend,
		}
		out.Attempts[i].Reconciled = stringJSON(at.Reconciled(j))
		if l := at.Lookups(); l.Tries > 0 {
			r := &reconcileJSON{Tries: l.Tries, LastAt: timeJSON(l.LastAt)}
			if l.LastStatus != 0 {
				r.LastStatus = &l.LastStatus
			}
			if !l.Settled {
				r.NextAt = timeJSON(l.NextAt)
			}
			out.Attempts[i].Reconcile = r
		}
	}
	return out
}

func hexJSON(b []byte) *string {
	if len(b) == 0 {
		return nil
	}
	s := hex.EncodeToString(b)
	return &s
}

func timeJSON(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}

func stringJSON(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// openLedgers returns every ledger open in this process, each held until
// release is called, so that a config unloaded meanwhile cannot close one
// in the middle of a request.
func (a *adminAPI) openLedgers() (ls []ledger.Ledger, release func()) {
	held, release := holdOpenLedgers(func(err error) { a.log().Error("closing ledger", zap.Error(err)) })
	for _, s := range held {
		ls = append(ls, s)
	}
	return ls, release
}

var errLedgerClosed = errors.New("ledger was closed")

// jobID returns the canonical form of a job id, or false if it is not a
// UUID (and so names no job).
func jobID(s string) (string, bool) {
	id, err := uuid.Parse(s)
	if err != nil {
		return "", false
	}
	return id.String(), true
}

// allowMethod answers 405 unless r's method is method.
func allowMethod(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method {
		return true
	}
	w.Header().Set("Allow", method)
	writeProblem(w, http.StatusMethodNotAllowed, problemMethodNotAllowed, "Method not allowed",
		fmt.Sprintf("%s %s: use %s.", r.Method, r.URL.Path, method), "")
	return false
}

func jobNotFound(w http.ResponseWriter, id string) {
	writeProblem(w, http.StatusNotFound, problemNotFound, "Job not found",
		fmt.Sprintf("No open ledger holds job %q (or its retention has passed).", id), "")
}

// unavailable answers 503 when a ledger could not answer.
func (a *adminAPI) unavailable(w http.ResponseWriter, err error, id string) {
	a.log().Error("ledger unavailable", zap.String("job_id", id), zap.Error(err))
	writeProblem(w, http.StatusServiceUnavailable, proxy.ProblemLedgerUnavailable, "Ledger unavailable",
		"A ledger could not answer; try again.", id)
}

// writeProblem answers with an RFC 9457 problem.
func writeProblem(w http.ResponseWriter, status int, name, title, detail, jobID string) {
	p := proxy.Problem{Type: proxy.ProblemType(name), Title: title, Status: status, Detail: detail, JobID: jobID}
	p.Write(w)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		writeProblem(w, http.StatusInternalServerError, "internal", "Internal error", err.Error(), "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// Interface guards
var (
	_ caddy.Module      = (*adminAPI)(nil)
	_ caddy.Provisioner = (*adminAPI)(nil)
	_ caddy.AdminRouter = (*adminAPI)(nil)
)
