package redis

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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

// flatMap reads a flat field/value array, as HGETALL returns it to Lua.
func flatMap(vals []any) map[string]string {
	m := make(map[string]string, len(vals)/2)
	for i := 0; i+1 < len(vals); i += 2 {
		k, _ := str(vals[i])
		v, _ := str(vals[i+1])
		m[k] = v
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

// decodeJob reads a job hash. The body is set only when m holds it.
func decodeJob(m map[string]string) (*ledger.Job, error) {
	if m["id"] == "" {
		return nil, errNoJob
	}
	fpv, _ := strconv.Atoi(m["fpv"])
	j := &ledger.Job{
		ID:                 m["id"],
		OwnerHash:          []byte(m["owner"]),
		KeyHash:            []byte(m["key"]),
		Fingerprint:        []byte(m["fp"]),
		FingerprintVersion: fpv,
		FingerprintScheme:  m["fps"],
		State:              ledger.JobState(m["state"]),
		Version:            int64Of(m["ver"]),
		CompletedBy:        m["by"],
		Retention:          time.Duration(int64Of(m["ret"])) * time.Microsecond,
		CreatedAt:          timeOf(m["created"]),
		CompletedAt:        timeOf(m["done"]),
		ExpiresAt:          timeOf(m["exp"]),
	}
	if status, ok := m["status"]; ok {
		h, err := decodeHeader(m["hdr"])
		if err != nil {
			return nil, err
		}
		st, _ := strconv.Atoi(status)
		r := &ledger.Response{Status: st, Header: h, Size: int64Of(m["size"]), Stored: m["stored"] == "1"}
		if body, ok := m["body"]; ok && r.Stored {
			r.Body = []byte(body)
		}
		j.Response = r
	}
	return j, nil
}

// decodeAttempts reads the attempts hash of job j, oldest first.
func decodeAttempts(j *ledger.Job, m map[string]string, count int) {
	j.Attempts = make([]ledger.Attempt, 0, count)
	for n := 1; n <= count; n++ {
		p := strconv.Itoa(n) + ":"
		if _, ok := m[p+"id"]; ok {
			j.Attempts = append(j.Attempts, decodeAttempt(j.ID, n, func(name string) string { return m[p+name] }))
		}
	}
}

// decodeAttempt reads attempt n of job jobID from its fields, named as in
// attemptFields.
func decodeAttempt(jobID string, n int, field func(name string) string) ledger.Attempt {
	return ledger.Attempt{
		ID:         field("id"),
		JobID:      jobID,
		Number:     n,
		Provider:   field("p"),
		State:      ledger.AttemptState(field("s")),
		JobVersion: int64Of(field("v")),
		StartedAt:  timeOf(field("t0")),
		Deadline:   timeOf(field("dl")),
		FinishedAt: timeOf(field("t1")),
		Error:      field("e"),
		Resend:     field("rs") == "1",
		Lookup: ledger.Lookup{
			Tries:      int(int64Of(field("lt"))),
			LastStatus: int(int64Of(field("ls"))),
			LastAt:     timeOf(field("la")),
			NextAt:     timeOf(field("ln")),
			Settled:    field("ld") == "1",
			Holder:     field("lh"),
			Until:      timeOf(field("lu")),
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
	m := zipFields(attemptFields, vals[1:])
	if _, ok := m["id"]; !ok {
		return nil, fmt.Errorf("redis ledger: %s: attempt %d missing", what, n)
	}
	a := decodeAttempt(jobID, n, func(name string) string { return m[name] })
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
	names := jobFields
	if len(vals) > len(jobFields) {
		names = append(jobFields[:len(jobFields):len(jobFields)], "body")
	}
	m := zipFields(names, vals)
	j, err := decodeJob(m)
	if err != nil {
		return nil, err
	}
	flat, ok := array(attempts)
	if !ok {
		return nil, errReply(what, attempts)
	}
	n, _ := strconv.Atoi(m["n"])
	decodeAttempts(j, flatMap(flat), n)
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
