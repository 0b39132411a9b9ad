//go:build integration

package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// What clients can ask for (issue 18) through the built binary: Prefer:
// wait, joining a live stream, the job status path and
// Idempotency-Expires.

// doWith is gateway.do with extra request headers.
func (g *gateway) doWith(t *testing.T, method, path, key, auth, body string, extra http.Header) response {
	t.Helper()
	return g.request(t, context.Background(), method, path, key, auth, body, extra)
}

func prefer(v string) http.Header { return http.Header{"Prefer": {v}} }

// reserves waits until g's ledger has taken n reservations: a duplicate's
// request has reached its wait.
func reserves(t *testing.T, g *gateway, n int) {
	t.Helper()
	want := fmt.Sprintf(`caddy_idempotency_ledger_seconds_count{operation="reserve"} %d`, n)
	eventually(t, fmt.Sprintf("%d reservations", n), func() bool {
		_, body := g.adminCall(t, http.MethodGet, "/metrics", "")
		return strings.Contains(body, want)
	})
}

// heldUpstream answers {"n":<n>} once release is closed.
func heldUpstream(t *testing.T) (*upstream, chan struct{}) {
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		<-release
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	return up, release
}

// TestPreferWait: with in_flight reject, a duplicate that says Prefer:
// wait=5 waits for the held first request and replays it; wait=0 and no
// preference get 409 at once.
func TestPreferWait(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up, release := heldUpstream(t)
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 10s", "in_flight reject"))
		first := make(chan response, 1)
		go func() { first <- g.post(t, "/charges", "pw-1", auth, `{}`) }()
		eventually(t, "the first attempt reaches the upstream", func() bool { return up.count("pw-1") == 1 })

		start := time.Now()
		r0 := g.doWith(t, http.MethodPost, "/charges", "pw-1", auth, `{}`, prefer("wait=0"))
		if r0.status != http.StatusConflict || !strings.Contains(r0.body, "urn:onejob:problem:in-flight") ||
			r0.header.Get("Preference-Applied") != "wait=0" || time.Since(start) > 3*time.Second {
			t.Errorf("wait=0: %v after %v", r0, time.Since(start))
		}
		plain := g.post(t, "/charges", "pw-1", auth, `{}`)
		if plain.status != http.StatusConflict || plain.header.Get("Preference-Applied") != "" {
			t.Errorf("no preference, in_flight reject: %v", plain)
		}

		waiter := make(chan response, 1)
		go func() {
			waiter <- g.doWith(t, http.MethodPost, "/charges", "pw-1", auth, `{}`, prefer("wait=5"))
		}()
		reserves(t, g, 4) // the first, wait=0, no preference, wait=5
		close(release)
		a, w := <-first, <-waiter
		if a.status != http.StatusOK || a.body != `{"n":1}` || a.header.Get("Preference-Applied") != "" {
			t.Errorf("first: %v", a)
		}
		if w.status != http.StatusOK || w.body != a.body || w.header.Get("Idempotent-Replayed") != "true" ||
			w.header.Get("Preference-Applied") != "wait=5" ||
			w.header.Get("Idempotency-Job-Id") != a.header.Get("Idempotency-Job-Id") {
			t.Errorf("wait=5: %v\nfirst: %v", w, a)
		}
		if c := up.count("pw-1"); c != 1 {
			t.Errorf("upstream called %d times", c)
		}
	})
}

// TestPreferWaitCappedByMaxWait: a wait longer than max_wait is cut to it,
// and Preference-Applied says the wait applied.
func TestPreferWaitCappedByMaxWait(t *testing.T) {
	up, release := heldUpstream(t)
	defer close(release) // before the gateway's graceful stop, which waits for the held request
	g := startGateway(t, backend{name: "memory", line: "ledger memory"},
		site(up.addr(), "attempt_timeout 10s", "in_flight reject", "max_wait 1s"))
	go func() {
		req, _ := http.NewRequest(http.MethodPost, g.url+"/charges", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "cap-1")
		req.Header.Set("Authorization", auth)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	eventually(t, "the first attempt reaches the upstream", func() bool { return up.count("cap-1") == 1 })
	start := time.Now()
	r := g.doWith(t, http.MethodPost, "/charges", "cap-1", auth, `{}`, prefer("wait=30"))
	took := time.Since(start)
	if r.status != http.StatusConflict || r.header.Get("Preference-Applied") != "wait=1" ||
		took < 900*time.Millisecond || took > 5*time.Second {
		t.Errorf("wait=30 capped at 1s: %v after %v", r, took)
	}
}

// TestFleetPreferWait: on a shared ledger, a duplicate on instance B with
// Prefer: wait=5 waits for A's attempt (in_flight reject on both) and
// replays it; wait=0 on B answers 409 at once.
func TestFleetPreferWait(t *testing.T) { shared(t, testFleetPreferWait) }

func testFleetPreferWait(t *testing.T, b backend) {
	up, release := heldUpstream(t)
	s := fmt.Sprintf("\tidempotency {\n\t\t{ledger}\n\t\tattempt_timeout 30s\n\t\tattempt_deadline 60s\n\t\tin_flight reject\n\t}\n\treverse_proxy %s\n", up.addr())
	gs := fleet(t, b, 2, s)
	first := make(chan response, 1)
	go func() { first <- gs[0].post(t, "/charges", "fpw-1", auth, `{}`) }()
	eventually(t, "instance A's attempt reaches the upstream", func() bool { return up.count("fpw-1") == 1 })

	r0 := gs[1].doWith(t, http.MethodPost, "/charges", "fpw-1", auth, `{}`, prefer("wait=0"))
	if r0.status != http.StatusConflict || r0.header.Get("Preference-Applied") != "wait=0" {
		t.Errorf("wait=0 on B: %v", r0)
	}
	waiter := make(chan response, 1)
	go func() {
		waiter <- gs[1].doWith(t, http.MethodPost, "/charges", "fpw-1", auth, `{}`, prefer("wait=5"))
	}()
	reserves(t, gs[1], 2)
	close(release)
	a, w := <-first, <-waiter
	if a.status != http.StatusOK || w.status != http.StatusOK || w.body != a.body ||
		w.header.Get("Idempotent-Replayed") != "true" || w.header.Get("Preference-Applied") != "wait=5" {
		t.Errorf("A: %v\nB: %v", a, w)
	}
	if c := up.count("fpw-1"); c != 1 {
		t.Errorf("upstream called %d times", c)
	}
}

// openStream posts {"q":"x"} to /stream under key and returns the answer
// as soon as its headers arrive, its body still streaming.
func (g *gateway) openStream(t *testing.T, key string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, g.url+"/stream", strings.NewReader(`{"q":"x"}`))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestJoinLiveStream: three duplicates join a Server-Sent Events answer
// while it streams, each at a different moment, and each receives exactly
// the first client's bytes, marked replayed.
func TestJoinLiveStream(t *testing.T) {
	steps := make([]chan struct{}, 3)
	for i := range steps {
		steps[i] = make(chan struct{})
	}
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "id: 0\ndata: event 0 of call %d\n\n", n)
		w.(http.Flusher).Flush()
		for i, step := range steps {
			<-step
			fmt.Fprintf(w, "id: %d\ndata: event %d\n\n", i+1, i+1)
			w.(http.Flusher).Flush()
		}
	})
	t.Cleanup(func() {
		for _, s := range steps {
			select {
			case <-s:
			default:
				close(s)
			}
		}
	})
	g := startGateway(t, backend{name: "memory", line: "ledger memory"}, site(up.addr(), "attempt_timeout 5s"))

	open := func() *http.Response { return g.openStream(t, "join-1") }
	type result struct {
		body string
		err  error
	}
	readAll := func(r io.Reader) chan result {
		c := make(chan result, 1)
		go func() {
			b, err := io.ReadAll(r)
			c <- result{string(b), err}
		}()
		return c
	}

	first := open()
	br := bufio.NewReader(first.Body)
	head, err := br.ReadString('\n')
	if err != nil || head != "id: 0\n" {
		t.Fatalf("first event: %q %v", head, err)
	}
	firstRest := readAll(br)

	var joiners []*http.Response
	var bodies []chan result
	for i, step := range steps {
		j := open() // returns with the headers: it joined
		if j.StatusCode != first.StatusCode || j.Header.Get("Idempotent-Replayed") != "true" ||
			j.Header.Get("Content-Type") != "text/event-stream" ||
			j.Header.Get("Idempotency-Job-Id") != first.Header.Get("Idempotency-Job-Id") {
			t.Errorf("joiner %d: %d %v", i+1, j.StatusCode, j.Header)
		}
		joiners = append(joiners, j)
		bodies = append(bodies, readAll(j.Body))
		if i == 1 {
			// A duplicate that would not wait is not joined.
			r := g.doWith(t, http.MethodPost, "/stream", "join-1", auth, `{"q":"x"}`, prefer("wait=0"))
			if r.status != http.StatusConflict {
				t.Errorf("wait=0 during the stream: %v", r)
			}
		}
		close(step)
	}
	fr := <-firstRest
	want := head + fr.body
	if fr.err != nil || !strings.HasSuffix(want, "data: event 3\n\n") || !strings.Contains(want, "call 1") {
		t.Fatalf("first client's stream: %q %v", want, fr.err)
	}
	for i, c := range bodies {
		if r := <-c; r.err != nil || r.body != want {
			t.Errorf("joiner %d got %q (%v), want %q", i+1, r.body, r.err, want)
		}
	}
	if c := up.count("join-1"); c != 1 {
		t.Errorf("upstream called %d times", c)
	}
	// Once stored, a retry replays the same bytes.
	var replay response
	eventually(t, "the stream is stored", func() bool {
		replay = g.post(t, "/stream", "join-1", auth, `{"q":"x"}`)
		return replay.status == http.StatusOK
	})
	if replay.body != want || replay.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %v", replay)
	}
}

// statusBody is the JSON of a status answer.
type statusBody struct {
	JobID       string     `json:"job_id"`
	State       string     `json:"state"`
	CreatedAt   *time.Time `json:"created_at"`
	CompletedAt *time.Time `json:"completed_at"`
	ExpiresAt   *time.Time `json:"expires_at"`
	Attempts    int        `json:"attempts"`
	RetryAfter  *int64     `json:"retry_after"`
}

func decodeStatus(t *testing.T, r response) statusBody {
	t.Helper()
	var s statusBody
	if r.status != http.StatusOK || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("status answer: %v", r)
	}
	if err := json.Unmarshal([]byte(r.body), &s); err != nil {
		t.Fatalf("status body %q: %v", r.body, err)
	}
	return s
}

// TestStatusPath: GET <status_path>/<key> follows the owner's job from
// pending to completed, and answers 404 job-not-found for a key with no
// job; the provider never sees it.
func TestStatusPath(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up, release := heldUpstream(t)
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 10s", "status_path /jobs"))
		first := make(chan response, 1)
		go func() { first <- g.post(t, "/charges", "st-1/a", auth, `{}`) }()
		eventually(t, "the attempt reaches the upstream", func() bool { return up.count("st-1/a") == 1 })

		pending := decodeStatus(t, g.do(t, context.Background(), http.MethodGet, "/jobs/st-1%2Fa", "", auth, ""))
		if pending.State != "pending" || pending.JobID == "" || pending.CreatedAt == nil || pending.CompletedAt != nil ||
			pending.ExpiresAt != nil || pending.Attempts != 1 || pending.RetryAfter == nil || *pending.RetryAfter <= 0 {
			t.Errorf("pending: %+v", pending)
		}
		close(release)
		a := <-first
		if a.status != http.StatusOK || a.header.Get("Idempotency-Job-Id") != pending.JobID {
			t.Fatalf("first: %v (status said job %s)", a, pending.JobID)
		}
		r := g.do(t, context.Background(), http.MethodGet, "/jobs/st-1%2Fa", "", auth, "")
		done := decodeStatus(t, r)
		if done.State != "completed" || done.JobID != pending.JobID || done.CompletedAt == nil || done.ExpiresAt == nil ||
			done.Attempts != 1 || done.RetryAfter != nil || strings.Contains(r.body, `{"n":1}`) {
			t.Errorf("completed: %+v (%s)", done, r.body)
		}
		if r.header.Get("Idempotency-Job-Id") != pending.JobID || r.header.Get("Cache-Control") != "no-store" {
			t.Errorf("status headers: %v", r.header)
		}
		if exp, err := http.ParseTime(r.header.Get("Idempotency-Expires")); err != nil || done.ExpiresAt == nil ||
			!exp.Equal(done.ExpiresAt.Truncate(time.Second)) {
			t.Errorf("Idempotency-Expires %q, expires_at %v", r.header.Get("Idempotency-Expires"), done.ExpiresAt)
		}

		none := g.do(t, context.Background(), http.MethodGet, "/jobs/never-used", "", auth, "")
		if none.status != http.StatusNotFound || none.header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(none.body, "urn:onejob:problem:job-not-found") || none.header.Get("Idempotency-Job-Id") != "" {
			t.Errorf("unknown key: %v", none)
		}
		if n := len(up.callsFor("")); n != 0 {
			t.Errorf("the upstream saw %d requests without a key (status requests?)", n)
		}
	})
}

// sameAnswer reports how a and b differ, Date apart; "" when they do not.
func sameAnswer(a, b response) string {
	ha, hb := a.header.Clone(), b.header.Clone()
	ha.Del("Date")
	hb.Del("Date")
	keys := func(h http.Header) []string {
		var k []string
		for name, v := range h {
			k = append(k, name+": "+strings.Join(v, ", "))
		}
		slices.Sort(k)
		return k
	}
	if a.status != b.status || a.body != b.body || !slices.Equal(keys(ha), keys(hb)) {
		return fmt.Sprintf("%d %v %q\nvs %d %v %q", a.status, keys(ha), a.body, b.status, keys(hb), b.body)
	}
	return ""
}

// TestStatusPathCrossOwner: owner B probing owner A's keys learns nothing.
// B's status answers for A's keys, pending or completed, are identical to
// the answer for a key nobody used; B's request with A's key, with or
// without Prefer: wait, is B's own job, never A's answer.
func TestStatusPathCrossOwner(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		const bob = "Bearer bob"
		release := make(chan struct{})
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			if r.Header.Get("Authorization") == auth {
				<-release
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"for":%q,"n":%d}`, r.Header.Get("Authorization"), n)
		})
		defer func() {
			select {
			case <-release:
			default:
				close(release)
			}
		}()
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 10s", "status_path /jobs"))
		aliceA, aliceB := make(chan response, 1), make(chan response, 1)
		go func() { aliceA <- g.post(t, "/charges", "secret-a", auth, `{}`) }()
		go func() { aliceB <- g.post(t, "/charges", "secret-b", auth, `{}`) }()
		eventually(t, "alice's attempts reach the upstream", func() bool {
			return up.count("secret-a") == 1 && up.count("secret-b") == 1
		})
		get := func(key, who string) response {
			return g.do(t, context.Background(), http.MethodGet, "/jobs/"+key, "", who, "")
		}

		// While alice's job is pending.
		if d := sameAnswer(get("secret-a", bob), get("nobody-1", bob)); d != "" {
			t.Errorf("bob's probe of alice's pending job differs from no job:\n%s", d)
		}
		// Prefer: wait on alice's in-flight key: bob's own job, at once.
		bp := g.doWith(t, http.MethodPost, "/charges", "secret-b", bob, `{}`, prefer("wait=5"))
		if bp.status != http.StatusOK || bp.body != `{"for":"Bearer bob","n":2}` ||
			bp.header.Get("Idempotent-Replayed") != "" || bp.header.Get("Preference-Applied") != "" {
			t.Errorf("bob's Prefer: wait with alice's key: %v", bp)
		}

		close(release)
		a, ab := <-aliceA, <-aliceB
		if a.status != http.StatusOK || ab.status != http.StatusOK || ab.header.Get("Idempotency-Job-Id") == bp.header.Get("Idempotency-Job-Id") {
			t.Fatalf("alice: %v\n%v\nbob: %v", a, ab, bp)
		}
		// Alice sees her own job; bob's view of it is no job.
		if s := decodeStatus(t, get("secret-a", auth)); s.State != "completed" || s.JobID != a.header.Get("Idempotency-Job-Id") {
			t.Errorf("alice's status: %+v", s)
		}
		if d := sameAnswer(get("secret-a", bob), get("nobody-2", bob)); d != "" {
			t.Errorf("bob's probe of alice's completed job differs from no job:\n%s", d)
		}
		// A replay attempt: bob's own new job, never alice's answer.
		br := g.post(t, "/charges", "secret-a", bob, `{}`)
		if br.status != http.StatusOK || strings.Contains(br.body, "alice") || br.header.Get("Idempotent-Replayed") != "" ||
			br.header.Get("Idempotency-Job-Id") == a.header.Get("Idempotency-Job-Id") {
			t.Errorf("bob's replay attempt of alice's key: %v", br)
		}
		// Alice's replay is still hers.
		if again := g.post(t, "/charges", "secret-a", auth, `{}`); again.body != a.body || again.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("alice's replay: %v", again)
		}
	})
}

// TestIdempotencyExpires: a settled job's first answer and its replay
// carry the same Idempotency-Expires, retention after completion.
func TestIdempotencyExpires(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			fmt.Fprintf(w, `{"n":%d}`, n)
		})
		g := startGateway(t, b, site(up.addr(), "retention 1h"))
		before := time.Now()
		a := g.post(t, "/charges", "exp-1", auth, `{}`)
		exp, err := http.ParseTime(a.header.Get("Idempotency-Expires"))
		if a.status != http.StatusOK || err != nil {
			t.Fatalf("first: %v (%v)", a, err)
		}
		if lo, hi := before.Add(time.Hour).Add(-5*time.Second), time.Now().Add(time.Hour).Add(5*time.Second); exp.Before(lo) || exp.After(hi) {
			t.Errorf("Idempotency-Expires %v, want about an hour from now", exp)
		}
		r := g.post(t, "/charges", "exp-1", auth, `{}`)
		if r.header.Get("Idempotent-Replayed") != "true" || r.header.Get("Idempotency-Expires") != a.header.Get("Idempotency-Expires") {
			t.Errorf("replay: %v, first's Idempotency-Expires %q", r, a.header.Get("Idempotency-Expires"))
		}
	})
}

// TestFleetJoinStreamElsewhere: a duplicate that arrives on instance B
// while the winning answer streams through instance A waits for the
// stream's end and replays it, byte for byte; one that would not wait
// gets 409 at once.
func TestFleetJoinStreamElsewhere(t *testing.T) { shared(t, testFleetJoinStreamElsewhere) }

func testFleetJoinStreamElsewhere(t *testing.T, b backend) {
	step := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "id: 0\ndata: event 0 of call %d\n\n", n)
		w.(http.Flusher).Flush()
		<-step
		fmt.Fprint(w, "id: 1\ndata: event 1\n\n")
	})
	// Registered after the upstream's, so it runs first: the upstream's
	// close waits for this handler.
	t.Cleanup(func() {
		select {
		case <-step:
		default:
			close(step)
		}
	})
	gs := fleet(t, b, 2, site(up.addr(), "attempt_timeout 5s", "in_flight wait 10s"))

	first := gs[0].openStream(t, "elsewhere-1")
	br := bufio.NewReader(first.Body)
	if head, err := br.ReadString('\n'); err != nil || head != "id: 0\n" {
		t.Fatalf("first event on A: %q %v", head, err)
	}

	if r := gs[1].doWith(t, http.MethodPost, "/stream", "elsewhere-1", auth, `{"q":"x"}`, prefer("wait=0")); r.status != http.StatusConflict {
		t.Errorf("wait=0 on B during the stream: %v", r)
	}
	waiter := make(chan response, 1)
	go func() { waiter <- gs[1].post(t, "/stream", "elsewhere-1", auth, `{"q":"x"}`) }()
	reserves(t, gs[1], 2)
	select {
	case w := <-waiter:
		t.Fatalf("B answered while A still streamed: %v", w)
	case <-time.After(300 * time.Millisecond):
	}
	close(step)
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	want := "id: 0\n" + string(rest)
	w := <-waiter
	if w.status != http.StatusOK || w.body != want || w.header.Get("Idempotent-Replayed") != "true" ||
		w.header.Get("Idempotency-Job-Id") != first.Header.Get("Idempotency-Job-Id") {
		t.Errorf("B: %v, want %q replayed", w, want)
	}
	if c := up.count("elsewhere-1"); c != 1 {
		t.Errorf("upstream called %d times", c)
	}
}

// TestFleetStatusPath: instance B answers the status of a job that runs
// on instance A, pending and then completed, from the shared ledger.
func TestFleetStatusPath(t *testing.T) { shared(t, testFleetStatusPath) }

func testFleetStatusPath(t *testing.T, b backend) {
	up, release := heldUpstream(t)
	gs := fleet(t, b, 2, site(up.addr(), "attempt_timeout 10s", "status_path /jobs"))
	first := make(chan response, 1)
	go func() { first <- gs[0].post(t, "/charges", "fst-1", auth, `{}`) }()
	eventually(t, "A's attempt reaches the upstream", func() bool { return up.count("fst-1") == 1 })

	pending := decodeStatus(t, gs[1].do(t, context.Background(), http.MethodGet, "/jobs/fst-1", "", auth, ""))
	if pending.State != "pending" || pending.JobID == "" || pending.Attempts != 1 || pending.RetryAfter == nil {
		t.Errorf("B's status while A runs the job: %+v", pending)
	}
	close(release)
	a := <-first
	done := decodeStatus(t, gs[1].do(t, context.Background(), http.MethodGet, "/jobs/fst-1", "", auth, ""))
	if a.header.Get("Idempotency-Job-Id") != pending.JobID || done.JobID != pending.JobID ||
		done.State != "completed" || done.ExpiresAt == nil || done.CompletedAt == nil {
		t.Errorf("A answered %v; B's status after: %+v", a, done)
	}
	if other := gs[1].do(t, context.Background(), http.MethodGet, "/jobs/fst-1", "", "Bearer mallory", ""); other.status != http.StatusNotFound {
		t.Errorf("another owner's status on B: %v", other)
	}
}
