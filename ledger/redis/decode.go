package redis

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/onejob/onejob/ledger"
)

// errReply reports a script reply this package cannot read.
func errReply(what string, v any) error {
	return fmt.Errorf("redis ledger: %s: unexpected reply %T", what, v)
}

// str reads a bulk string of a reply; ok is false for a missing value (nil,
// or false from a Lua script under RESP3).
func str(v any) (s string, ok bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	case int64:
		return strconv.FormatInt(x, 10), true
	}
	return "", false
}

func array(v any) ([]any, bool) {
	a, ok := v.([]any)
	return a, ok
}

// zipFields pairs values returned by HMGET with their field names, leaving
// out missing ones.
func zipFields(names []string, vals []any) map[string]string {
	m := make(map[string]string, len(names))
	for i, n := range names {
		if i < len(vals) {
			if s, ok := str(vals[i]); ok {
				m[n] = s
			}
		}
	}
	return m
}

func micros(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }

// timeOf reads microseconds since the epoch; absent or empty is zero.
func timeOf(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMicro(n).UTC()
}

func int64Of(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

func encodeHeader(h map[string][]string) (string, error) {
	if h == nil {
		return "", nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", fmt.Errorf("redis ledger: headers: %w", err)
	}
	return string(b), nil
}

func decodeHeader(s string) (map[string][]string, error) {
	if s == "" {
		return nil, nil
	}
	var h map[string][]string
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, fmt.Errorf("redis ledger: stored headers: %w", err)
	}
	return h, nil
}

var errNoJob = errors.New("redis ledger: job hash without id")

// jobValues returns a job's field by its place (jfID and on, jfBody for
// the body); ok is false where the field is absent.
type jobValues func(place int) (v string, ok bool)

// hashValues reads a job's fields from its hash, as HGETALL returns it.
func hashValues(m map[string]string) jobValues {
	return func(place int) (string, bool) {
		name := "body"
		if place < len(jobFields) {
			name = jobFields[place]
		}
		v, ok := m[name]
		return v, ok
	}
}

// replyValues reads a job's fields from a reply that has them in
// jobFields order (nil where absent), then perhaps the body.
func replyValues(vals []any) jobValues {
	return func(place int) (string, bool) {
		if place >= len(vals) {
			return "", false
		}
		return str(vals[place])
	}
}

// decodeJob reads a job's fields. The body is set only when they hold it.
func decodeJob(v jobValues) (*ledger.Job, error) {
	get := func(place int) string {
		s, _ := v(place)
		return s
	}
	id := get(jfID)
	if id == "" {
		return nil, errNoJob
	}
	fpv, _ := strconv.Atoi(get(jfFPV))
	j := &ledger.Job{
		ID:                 id,
		OwnerHash:          []byte(get(jfOwner)),
		KeyHash:            []byte(get(jfKey)),
		Fingerprint:        []byte(get(jfFP)),
		FingerprintVersion: fpv,
		FingerprintScheme:  get(jfFPS),
		State:              ledger.JobState(get(jfState)),
		Version:            int64Of(get(jfVer)),
		CompletedBy:        get(jfBy),
		Retention:          time.Duration(int64Of(get(jfRet))) * time.Microsecond,
		CreatedAt:          timeOf(get(jfCreated)),
		CompletedAt:        timeOf(get(jfDone)),
		ExpiresAt:          timeOf(get(jfExp)),
	}
	if status, ok := v(jfStatus); ok {
		h, err := decodeHeader(get(jfHdr))
		if err != nil {
			return nil, err
		}
		st, _ := strconv.Atoi(status)
		r := &ledger.Response{Status: st, Header: h, Size: int64Of(get(jfSize)), Stored: get(jfStored) == "1"}
		if body, ok := v(jfBody); ok && r.Stored {
			r.Body = []byte(body)
		}
		j.Response = r
	}
	return j, nil
}

// attemptRows gathers the fields of a job's attempts, numbered from 1,
// each at its place in attemptFields, from the attempts hash's
// "<number>:<name>" fields.
type attemptRows [][afCount]string

// attemptPlaces finds a field's place in attemptFields by its name.
var attemptPlaces = func() map[string]int {
	m := make(map[string]int, len(attemptFields))
	for i, f := range attemptFields {
		m[f] = i
	}
	return m
}()

// set records field "<number>:<name>" of the attempts hash; a field of no
// attempt numbered here, or of no name known, is left out.
func (r attemptRows) set(field, value string) {
	c := strings.IndexByte(field, ':')
	if c < 0 {
		return
	}
	n, err := strconv.Atoi(field[:c])
	if err != nil || n < 1 || n > len(r) {
		return
	}
	if place, ok := attemptPlaces[field[c+1:]]; ok {
		r[n-1][place] = value
	}
}

// decode sets the job's attempts, oldest first: those that have an id.
func (r attemptRows) decode(j *ledger.Job) {
	j.Attempts = make([]ledger.Attempt, 0, len(r))
	for i := range r {
		if r[i][afID] != "" {
			j.Attempts = append(j.Attempts, decodeAttempt(j.ID, i+1, &r[i]))
		}
	}
}

// rowsFor returns the rows of the attempts a job's fields count (n).
func rowsFor(v jobValues) attemptRows {
	n, _ := v(jfN)
	count, _ := strconv.Atoi(n)
	return make(attemptRows, count)
}

// decodeAttempts reads the attempts hash m (HGETALL) of job j, whose fields
// are v.
func decodeAttempts(j *ledger.Job, v jobValues, m map[string]string) {
	r := rowsFor(v)
	for k, x := range m {
		r.set(k, x)
	}
	r.decode(j)
}

// decodeAttempt reads attempt n of job jobID from its fields.
func decodeAttempt(jobID string, n int, f *[afCount]string) ledger.Attempt {
	return ledger.Attempt{
		ID:         f[afID],
		JobID:      jobID,
		Number:     n,
		Provider:   f[afP],
		Scope:      f[afSC],
		State:      ledger.AttemptState(f[afS]),
		JobVersion: int64Of(f[afV]),
		StartedAt:  timeOf(f[afT0]),
		Deadline:   timeOf(f[afDL]),
		FinishedAt: timeOf(f[afT1]),
		Error:      f[afE],
		Resend:     f[afRS] == "1",
		Lookup: ledger.Lookup{
			Tries:      int(int64Of(f[afLT])),
			LastStatus: int(int64Of(f[afLS])),
			LastAt:     timeOf(f[afLA]),
			NextAt:     timeOf(f[afLN]),
			Settled:    f[afLD] == "1",
			Holder:     f[afLH],
			Until:      timeOf(f[afLU]),
		}.OrNil(),
	}
}

// scriptAttempt reads one attempt a script returned (attempt_reply in
// lib.lua): its number, then its fields in attemptFields order.
func scriptAttempt(what, jobID string, v any) (*ledger.Attempt, error) {
	vals, ok := array(v)
	if !ok || len(vals) < 1 {
		return nil, errReply(what, v)
	}
	ns, _ := str(vals[0])
	n, err := strconv.Atoi(ns)
	if err != nil {
		return nil, errReply(what, vals[0])
	}
	var f [afCount]string
	for i, x := range vals[1:min(len(vals), afCount+1)] {
		f[i], _ = str(x)
	}
	if f[afID] == "" {
		return nil, fmt.Errorf("redis ledger: %s: attempt %d missing", what, n)
	}
	a := decodeAttempt(jobID, n, &f)
	return &a, nil
}

// scriptJob reads the job and attempts a script returned: the job's fields
// in jobFields order (then its body, if asked for), and its attempts hash
// as a flat array.
func scriptJob(what string, fields, attempts any) (*ledger.Job, error) {
	vals, ok := array(fields)
	if !ok {
		return nil, errReply(what, fields)
	}
	v := replyValues(vals)
	j, err := decodeJob(v)
	if err != nil {
		return nil, err
	}
	flat, ok := array(attempts)
	if !ok {
		return nil, errReply(what, attempts)
	}
	r := rowsFor(v)
	for i := 0; i+1 < len(flat); i += 2 {
		k, _ := str(flat[i])
		v, _ := str(flat[i+1])
		r.set(k, v)
	}
	r.decode(j)
	return j, nil
}

func attemptNumbered(j *ledger.Job, n int) *ledger.Attempt {
	for i := range j.Attempts {
		if j.Attempts[i].Number == n {
			c := j.Attempts[i]
			return &c
		}
	}
	return nil
}
