package main

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/onejob/onejob/proxy"
)

// sound is the evidence of a small run that kept every promise: alice's
// job failed over from a 503 to a result, which a retry replayed; bob's
// job is unknown after the upstream acted and reset the connection.
func sound() *evidence {
	h := proxy.NewHasher([]byte(ownerSecret))
	hash := func(id identity) (string, string) {
		return hex.EncodeToString(h.Owner("Bearer " + id.Owner)), hex.EncodeToString(h.Key(id.Key))
	}
	alice, bob := identity{"alice", "k-00000"}, identity{"bob", "k-00000"}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	body := []byte(`{"owner":"alice"}`)
	sum := sha256.Sum256(body)

	ja := &adminJob{ID: "job-a", State: "completed", CompletedBy: ptr("att-a2"), Attempts: []adminAttempt{
		{Number: 1, ID: "att-a1", Provider: "primary", State: "failed"},
		{Number: 2, ID: "att-a2", Provider: "fallback", State: "succeeded"},
	}}
	ja.OwnerHash, ja.KeyHash = hash(alice)
	ja.Response = &struct {
		Status int   `json:"status"`
		Size   int64 `json:"size"`
		Stored bool  `json:"stored"`
	}{Status: 200, Size: int64(len(body)), Stored: true}
	jb := &adminJob{ID: "job-b", State: "unknown", Attempts: []adminAttempt{
		{Number: 1, ID: "att-b1", Provider: "primary", State: "unknown"},
	}}
	jb.OwnerHash, jb.KeyHash = hash(bob)

	up := &answerBody{Owner: "alice", Key: "k-00000", Job: "job-a", Attempt: 2, Provider: "fallback", Seq: 2, Executed: true}
	return &evidence{
		Hasher:    h,
		Providers: providers,
		IDs:       []identity{alice, bob},
		Jobs:      map[string]*adminJob{ja.ID: ja, jb.ID: jb},
		Arrivals: []arrival{
			{Provider: "primary", JobID: "job-a", Attempt: 1, Owner: "alice", Key: "k-00000", Request: 10, Seq: 1,
				Behaviour: refuse503, Start: t0, End: t0.Add(time.Millisecond), Status: 503, Answered: true},
			{Provider: "fallback", JobID: "job-a", Attempt: 2, Owner: "alice", Key: "k-00000", Request: 10, Seq: 2,
				Behaviour: answerFast, Start: t0.Add(2 * time.Millisecond), End: t0.Add(3 * time.Millisecond),
				Executed: true, Status: 200, Answered: true, Sum: sum, Len: len(body)},
			{Provider: "primary", JobID: "job-b", Attempt: 1, Owner: "bob", Key: "k-00000", Request: 20, Seq: 3,
				Behaviour: resetAfterRead, Start: t0, End: t0.Add(time.Millisecond), Executed: true},
		},
		Exchanges: []exchange{
			{ID: alice, Request: 10, Status: 200, JobID: "job-a", Up: up, Sum: sum, Len: len(body)},
			{ID: alice, Request: 11, Status: 200, JobID: "job-a", Replayed: true, Up: up, Sum: sum, Len: len(body)},
			{ID: bob, Request: 20, Status: http.StatusBadGateway, JobID: "job-b", Problem: "outcome-unknown", ProblemJob: "job-b"},
			{ID: bob, Request: 21, Status: http.StatusServiceUnavailable, Problem: "ledger-unavailable"},
		},
		Replays: map[identity]exchange{
			alice: {ID: alice, Request: 30, Status: 200, JobID: "job-a", Replayed: true, Up: up, Sum: sum, Len: len(body)},
			bob:   {ID: bob, Request: 31, Status: http.StatusConflict, JobID: "job-b", Problem: "outcome-unknown", ProblemJob: "job-b"},
		},
		ArrivalsAfter: 3,
	}
}

func ptr(s string) *string { return &s }

func TestCheckSoundRun(t *testing.T) {
	if r := check(sound()); len(r.Violations) != 0 {
		t.Fatalf("violations in a sound run:\n%s", strings.Join(r.Violations, "\n"))
	}
}

// TestCheckFindsViolations breaks one promise at a time and expects the
// checks to say so.
func TestCheckFindsViolations(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(ev *evidence)
		want   string
	}{
		{"a failed attempt had acted", func(ev *evidence) { ev.Arrivals[0].Executed = true }, "recorded failed"},
		{"an attempt sent twice", func(ev *evidence) {
			dup := ev.Arrivals[1]
			dup.Seq = 9
			ev.Arrivals = append(ev.Arrivals, dup)
		}, "reached the upstream 2 times"},
		{"attempts overlapped", func(ev *evidence) { ev.Arrivals[0].End = ev.Arrivals[1].Start.Add(time.Millisecond) }, "before attempt 1"},
		{"another owner's answer", func(ev *evidence) {
			up := *ev.Exchanges[1].Up
			up.Owner = "bob"
			ev.Exchanges[1].Up = &up
		}, "meant for bob"},
		{"an answer that differs from the stored one", func(ev *evidence) { ev.Exchanges[1].Sum[0]++ }, "not what the upstream answered"},
		{"a job left pending", func(ev *evidence) { ev.Jobs["job-b"].State = "pending" }, "pending after every deadline"},
		{"a replay not marked", func(ev *evidence) { ev.Exchanges[1].Replayed = false }, "Idempotent-Replayed false"},
		{"a first answer marked replayed", func(ev *evidence) { ev.Exchanges[0].Replayed = true }, "Idempotent-Replayed true"},
		{"two jobs for one key", func(ev *evidence) {
			j := *ev.Jobs["job-b"]
			j.ID = "job-c"
			ev.Jobs[j.ID] = &j
		}, "has two jobs"},
		{"an unknown job run again", func(ev *evidence) {
			j := ev.Jobs["job-b"]
			j.Attempts = append(j.Attempts, adminAttempt{Number: 2, ID: "att-b2", Provider: "primary", State: "unknown"})
		}, "started after attempt 1 ended unknown"},
		{"two executions of one intent", func(ev *evidence) {
			ev.Jobs["job-b"].Attempts[0].State = "failed"
			ev.Jobs["job-b"].Attempts = append(ev.Jobs["job-b"].Attempts, adminAttempt{Number: 2, ID: "att-b2", Provider: "primary", State: "unknown"})
			ev.Arrivals[2].Behaviour = resetBeforeRead
			ev.Arrivals = append(ev.Arrivals, arrival{Provider: "primary", JobID: "job-b", Attempt: 2, Owner: "bob", Key: "k-00000",
				Seq: 8, Behaviour: stall, Start: ev.Arrivals[2].End, End: ev.Arrivals[2].End.Add(time.Second), Executed: true})
			ev.ArrivalsAfter++
		}, "executed 2 times"},
		{"a replay that reached the upstream", func(ev *evidence) { ev.ArrivalsAfter++ }, "replays of finished jobs reached the upstream 1 times"},
		{"an upstream call for a job the ledger lacks", func(ev *evidence) { delete(ev.Jobs, "job-b") }, "which the ledger does not have"},
		{"an answer naming another job", func(ev *evidence) { ev.Exchanges[2].JobID = "job-a" }, "its job is job-b"},
		{"a result stored whole from an answer cut short", func(ev *evidence) {
			ev.Jobs["job-a"].Response.Stored = false
		}, "only a stream may win"},
		{"a stored answer replayed differently", func(ev *evidence) {
			rp := ev.Replays[identity{"alice", "k-00000"}]
			rp.Sum[0]++
			ev.Replays[rp.ID] = rp
		}, "replay of alice/k-00000"},
		{"an answer from nowhere", func(ev *evidence) {
			ev.Exchanges = append(ev.Exchanges, exchange{ID: identity{"alice", "k-00000"}, Request: 13,
				Status: http.StatusOK, JobID: "job-a"})
		}, "neither the upstream's answer nor a problem"},
		{"in-flight without Retry-After", func(ev *evidence) {
			ev.Exchanges = append(ev.Exchanges, exchange{ID: identity{"alice", "k-00000"}, Request: 12,
				Status: http.StatusConflict, JobID: "job-a", Problem: "in-flight", ProblemJob: "job-a"})
		}, "in-flight without Retry-After"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := sound()
			tt.mutate(ev)
			r := check(ev)
			for _, v := range r.Violations {
				if strings.Contains(v, tt.want) {
					return
				}
			}
			t.Errorf("no violation mentions %q; got:\n%s", tt.want, strings.Join(r.Violations, "\n"))
		})
	}
}
