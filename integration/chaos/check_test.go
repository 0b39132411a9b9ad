package main

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/onejob/onejob/integration/faultproxy"
	"github.com/onejob/onejob/ledger"
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
		{"an attempt recorded never sent reached the upstream", func(ev *evidence) {
			ev.Jobs["job-a"].Attempts[0].Error = ptr(ledger.ReasonUnsent)
		}, "recorded never sent, but it reached the upstream"},
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

// TestCheckReplayMarkers counts answers wrongly marked Idempotent-Replayed
// (a request's own answer, a problem) and replays wrongly unmarked, and
// none in a sound run.
func TestCheckReplayMarkers(t *testing.T) {
	tests := []struct {
		name               string
		mutate             func(ev *evidence)
		marked, unmarked   int
		violationSubstring string
	}{
		{"sound", func(*evidence) {}, 0, 0, ""},
		{"own answer marked", func(ev *evidence) { ev.Exchanges[0].Replayed = true }, 1, 0, "Idempotent-Replayed true"},
		{"replay unmarked", func(ev *evidence) { ev.Exchanges[1].Replayed = false }, 0, 1, "Idempotent-Replayed false"},
		{"problem marked", func(ev *evidence) { ev.Exchanges[2].Replayed = true }, 1, 0, "never wrote"},
		{"replay after the run unmarked", func(ev *evidence) {
			rp := ev.Replays[identity{"alice", "k-00000"}]
			rp.Replayed = false
			ev.Replays[rp.ID] = rp
		}, 0, 1, "replay of alice/k-00000"},
		{"409 after the run marked", func(ev *evidence) {
			rp := ev.Replays[identity{"bob", "k-00000"}]
			rp.Replayed = true
			ev.Replays[rp.ID] = rp
		}, 1, 0, "marked Idempotent-Replayed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := sound()
			tt.mutate(ev)
			r := check(ev)
			if r.WronglyReplayed != tt.marked || r.WronglyUnmarked != tt.unmarked {
				t.Errorf("wrongly marked %d, unmarked %d; want %d, %d", r.WronglyReplayed, r.WronglyUnmarked, tt.marked, tt.unmarked)
			}
			if tt.violationSubstring == "" {
				if len(r.Violations) != 0 {
					t.Errorf("violations:\n%s", strings.Join(r.Violations, "\n"))
				}
				return
			}
			if !mentions(r.Violations, tt.violationSubstring) {
				t.Errorf("no violation mentions %q; got:\n%s", tt.violationSubstring, strings.Join(r.Violations, "\n"))
			}
		})
	}
}

func mentions(vs []string, s string) bool {
	for _, v := range vs {
		if strings.Contains(v, s) {
			return true
		}
	}
	return false
}

// withUnarrived adds to a sound run carol's job, unknown, whose one
// attempt on primary never reached the upstream: the gateway (instance 1,
// where carol's request went) recorded its connection broken 200 ms after
// it started. Alone, that is an attempt the gateway never sent.
func withUnarrived() *evidence {
	ev := sound()
	carol := identity{"carol", "k-00000"}
	t0 := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	stamp := func(t time.Time) *string { return ptr(t.Format(time.RFC3339Nano)) }
	jc := &adminJob{ID: "job-c", State: "unknown", Attempts: []adminAttempt{
		{Number: 1, ID: "att-c1", Provider: "primary", State: "unknown",
			StartedAt: stamp(t0), FinishedAt: stamp(t0.Add(200 * time.Millisecond)), Error: ptr("read: connection reset by peer")},
	}}
	jc.OwnerHash = hex.EncodeToString(ev.Hasher.Owner("Bearer " + carol.Owner))
	jc.KeyHash = hex.EncodeToString(ev.Hasher.Key(carol.Key))
	ev.IDs = append(ev.IDs, carol)
	ev.Jobs[jc.ID] = jc
	ev.Exchanges = append(ev.Exchanges, exchange{ID: carol, Request: 40, Instance: 1,
		Start: t0.Add(-50 * time.Millisecond), End: t0.Add(300 * time.Millisecond),
		Status: http.StatusBadGateway, JobID: "job-c", Problem: "outcome-unknown", ProblemJob: "job-c"})
	ev.Replays[carol] = exchange{ID: carol, Request: 41, Status: http.StatusConflict, JobID: "job-c",
		Problem: "outcome-unknown", ProblemJob: "job-c"}
	ev.AttemptTimeout, ev.AttemptDeadline = 500*time.Millisecond, 3*time.Second
	return ev
}

// TestCheckNeverSentUnknown: an unknown attempt the upstream never got is
// legitimate only when the instance that ran it was killed meanwhile, or
// the upstream reset a connection on accept on its provider meanwhile;
// otherwise the gateway knew it never sent it.
func TestCheckNeverSentUnknown(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	leaseExpired := func(ev *evidence) {
		a := &ev.Jobs["job-c"].Attempts[0]
		a.Error = ptr(ledger.ReasonLeaseExpired)
		a.FinishedAt = ptr(t0.Add(3500 * time.Millisecond).Format(time.RFC3339Nano))
	}
	tests := []struct {
		name   string
		mutate func(ev *evidence)
		cause  string // "" when it must be flagged
	}{
		{"nothing explains it", func(*evidence) {}, ""},
		{"its instance killed while it ran", func(ev *evidence) {
			ev.Kills = []killEvent{{Gateway: 1, At: t0.Add(100 * time.Millisecond)}}
		}, "gateway killed"},
		{"another instance killed", func(ev *evidence) {
			ev.Kills = []killEvent{{Gateway: 2, At: t0.Add(100 * time.Millisecond)}}
		}, ""},
		{"its instance killed long before", func(ev *evidence) {
			ev.Kills = []killEvent{{Gateway: 1, At: t0.Add(-8 * time.Second)}}
		}, ""},
		{"a reset on accept on its provider", func(ev *evidence) {
			ev.AcceptResets = []acceptReset{{Provider: "primary", At: t0.Add(50 * time.Millisecond)}}
		}, "upstream: reset on accept"},
		{"a reset on accept on the other provider", func(ev *evidence) {
			ev.AcceptResets = []acceptReset{{Provider: "fallback", At: t0.Add(50 * time.Millisecond)}}
		}, ""},
		{"a reset on accept after the gateway recorded its outcome", func(ev *evidence) {
			ev.AcceptResets = []acceptReset{{Provider: "primary", At: t0.Add(2 * time.Second)}}
		}, ""},
		{"lease expired, a reset on accept, the ledger link fine", func(ev *evidence) {
			leaseExpired(ev)
			ev.AcceptResets = []acceptReset{{Provider: "primary", At: t0.Add(50 * time.Millisecond)}}
		}, ""},
		{"lease expired, a reset on accept, the ledger link cut", func(ev *evidence) {
			leaseExpired(ev)
			ev.AcceptResets = []acceptReset{{Provider: "primary", At: t0.Add(50 * time.Millisecond)}}
			ev.Links = []linkEvent{{Gateway: 1, Link: "postgres", Event: faultproxy.Event{
				Kind: faultproxy.KindCut, At: t0.Add(100 * time.Millisecond), End: t0.Add(3 * time.Second)}}}
		}, "upstream: reset on accept"},
		{"lease expired, a reset on accept after the ledger link came back", func(ev *evidence) {
			leaseExpired(ev)
			ev.AcceptResets = []acceptReset{{Provider: "primary", At: t0.Add(50 * time.Millisecond)}}
			ev.Links = []linkEvent{{Gateway: 1, Link: "postgres", Event: faultproxy.Event{
				Kind: faultproxy.KindCut, At: t0.Add(-3 * time.Second), End: t0}}}
		}, ""},
		{"lease expired, a reset on accept after a window of delayed replies", func(ev *evidence) {
			leaseExpired(ev)
			ev.AcceptResets = []acceptReset{{Provider: "primary", At: t0.Add(50 * time.Millisecond)}}
			ev.Links = []linkEvent{{Gateway: 1, Link: "postgres", Event: faultproxy.Event{
				Kind: faultproxy.KindDelay, At: t0.Add(-time.Second), End: t0.Add(5500 * time.Millisecond), Delay: 6 * time.Second}}}
		}, ""},
		{"lease expired, a reset on accept within a window of delayed replies", func(ev *evidence) {
			leaseExpired(ev)
			ev.AcceptResets = []acceptReset{{Provider: "primary", At: t0.Add(50 * time.Millisecond)}}
			ev.Links = []linkEvent{{Gateway: 1, Link: "postgres", Event: faultproxy.Event{
				Kind: faultproxy.KindDelay, At: t0.Add(-time.Second), End: t0.Add(6500 * time.Millisecond), Delay: 6 * time.Second}}}
		}, "upstream: reset on accept"},
		{"lease expired, the ledger link cut, nothing reset", func(ev *evidence) {
			leaseExpired(ev)
			ev.Links = []linkEvent{{Gateway: 1, Link: "postgres", Event: faultproxy.Event{
				Kind: faultproxy.KindCut, At: t0.Add(100 * time.Millisecond), End: t0.Add(3 * time.Second)}}}
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := withUnarrived()
			tt.mutate(ev)
			r := check(ev)
			if tt.cause == "" {
				if r.NeverSent != 1 || !mentions(r.Violations, "never reached the upstream") {
					t.Errorf("not flagged: never sent %d, violations:\n%s", r.NeverSent, strings.Join(r.Violations, "\n"))
				}
				return
			}
			if len(r.Violations) != 0 || r.NeverSent != 0 {
				t.Errorf("flagged (never sent %d):\n%s", r.NeverSent, strings.Join(r.Violations, "\n"))
			}
			if r.UnarrivedUnknown[tt.cause] != 1 || r.UnknownByCause[tt.cause] != 1 {
				t.Errorf("unknown never arrived %v, unknown jobs %v; want one %q", r.UnarrivedUnknown, r.UnknownByCause, tt.cause)
			}
		})
	}
}

// TestCheckUnknownByCause: every unknown job is counted by the fault that
// produced it.
func TestCheckUnknownByCause(t *testing.T) {
	ev := sound()
	if r := check(ev); len(r.UnknownByCause) != 1 || r.UnknownByCause["upstream: reset after read"] != 1 {
		t.Errorf("sound run: %v", r.UnknownByCause)
	}
	// Bob's attempt answered well, but its instance's ledger link lost the
	// reply to its completion: the result could not be recorded.
	a := &ev.Arrivals[2]
	a.Behaviour, a.Status, a.Answered = answerFast, 200, true
	ev.Exchanges[2].Instance = 2
	ev.Links = []linkEvent{{Gateway: 2, Link: "redis", Event: faultproxy.Event{Kind: faultproxy.KindDrop, At: a.End}}}
	if r := check(ev); r.UnknownByCause["ledger link: lost reply"] != 1 {
		t.Errorf("a lost reply: %v", r.UnknownByCause)
	}
	ev.Links[0].Gateway = 0 // another instance's link
	if r := check(ev); r.UnknownByCause["no fault found"] != 1 {
		t.Errorf("another instance's lost reply: %v", r.UnknownByCause)
	}
}
