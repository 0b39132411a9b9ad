package file

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/record"
)

// crashEnv names the ledger file of a crash helper process: when it is set,
// TestCrashMidBurst is the helper, not the test.
const (
	crashEnv      = "ONEJOB_CRASH_LEDGER"
	crashRoundEnv = "ONEJOB_CRASH_ROUND"
)

// TestCrashMidBurst kills (SIGKILL) a process in the middle of a burst of
// concurrent reservations, completions and failures on the file ledger,
// three times over the same file. The helper prints a job only after the
// ledger acknowledged its completion or failure. After each kill the
// ledger opens, holds every acknowledged job
// exactly as it was acknowledged (state, attempt, whole answer) and
// findable by its key, and every job in it is well-formed: it decodes, its
// key and index entries agree with it, and a completed job's answer is the
// exact one its helper sent. The ledger then takes new work.
func TestCrashMidBurst(t *testing.T) {
	if path := os.Getenv(crashEnv); path != "" {
		round, _ := strconv.Atoi(os.Getenv(crashRoundEnv))
		crashHelper(path, round)
		return
	}
	path := filepath.Join(t.TempDir(), "ledger.db")
	total := map[string]ack{}
	for round := 1; round <= 3; round++ {
		acks := runAndKill(t, path, round, 150+100*round)
		for id, a := range acks {
			total[id] = a
		}
		checkAfterCrash(t, path, total)
	}
}

// ack is a job the helper saw acknowledged: completed or failed.
type ack struct {
	round, n int
	failed   bool
}

func crashParams(round, n int) ledger.ReserveParams {
	return ledger.ReserveParams{
		OwnerHash:          []byte(fmt.Sprintf("owner-%d", n%3)),
		KeyHash:            []byte(fmt.Sprintf("r%d-k%d", round, n)),
		Fingerprint:        []byte(fmt.Sprintf("fp-%d-%d", round, n)),
		FingerprintVersion: 1,
		Retention:          24 * time.Hour,
		Attempt:            ledger.NextAttempt{Provider: "p", Lease: time.Hour},
	}
}

// crashAnswer is the answer job n completes with: its status, header and
// body all depend on n; sizes vary up to past a bbolt page, and one in 97
// spans many pages.
func crashAnswer(round, n int) ledger.Response {
	reps := n%50 + 1
	if n%97 == 0 {
		reps = 5000
	}
	body := []byte(strings.Repeat(fmt.Sprintf("answer-%d-%d;", round, n), reps))
	return ledger.Response{
		Status: 200 + n%5,
		Header: map[string][]string{"X-N": {strconv.Itoa(n)}, "Content-Type": {"application/json"}},
		Body:   body, Size: int64(len(body)), Stored: true,
	}
}

// crashFails says which jobs fail rather than complete; one in eleven is
// left pending (reserved, never settled).
func crashFails(n int) bool   { return n%7 == 3 }
func crashPending(n int) bool { return n%11 == 5 }

// crashHelper completes and fails jobs with 8 workers until it is killed,
// printing "done <job id> <n>" or "failed <job id> <n>" once each is
// acknowledged.
func crashHelper(path string, round int) {
	l, err := Open(path, Options{Timeout: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var (
		mu   sync.Mutex
		next int
	)
	out := bufio.NewWriter(os.Stdout)
	say := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		out.WriteString(s)
		out.Flush()
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				n := next
				next++
				mu.Unlock()
				r, err := l.Reserve(ctx, crashParams(round, n).WithNewIDs())
				if err != nil || r.Outcome != ledger.Created {
					fmt.Fprintln(os.Stderr, "reserve", n, r.Outcome, err)
					os.Exit(2)
				}
				switch {
				case crashPending(n):
				case crashFails(n):
					if _, err := l.Fail(ctx, r.Attempt.Ref(), "refused", nil); err != nil {
						fmt.Fprintln(os.Stderr, "fail", n, err)
						os.Exit(2)
					}
					say(fmt.Sprintf("failed %s %d\n", r.Job.ID, n))
				default:
					c, err := l.Complete(ctx, r.Attempt.Ref(), crashAnswer(round, n))
					if err != nil || !c.Won {
						fmt.Fprintln(os.Stderr, "complete", n, c.Won, err)
						os.Exit(2)
					}
					say(fmt.Sprintf("done %s %d\n", r.Job.ID, n))
				}
			}
		}()
	}
	wg.Wait()
}

// runAndKill runs a helper on path until it has acknowledged at least
// atLeast jobs, kills it with SIGKILL, and returns every job it
// acknowledged (including lines written just before the kill).
func runAndKill(t *testing.T, path string, round, atLeast int) map[string]ack {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashMidBurst$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+path, crashRoundEnv+"="+strconv.Itoa(round))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acks := map[string]ack{}
	br := bufio.NewReader(stdout)
	killed := false
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF {
			break // a partial last line was never acknowledged
		}
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(line)
		if len(f) != 3 || (f[0] != "done" && f[0] != "failed") {
			continue // the test binary's own output
		}
		n, err := strconv.Atoi(f[2])
		if err != nil {
			t.Fatalf("helper line %q", line)
		}
		acks[f[1]] = ack{round: round, n: n, failed: f[0] == "failed"}
		if !killed && len(acks) >= atLeast {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	if !killed {
		t.Fatalf("the helper ended by itself after %d acknowledgements: %v\n%s", len(acks), err, stderr.String())
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the helper was not killed by SIGKILL: %v\n%s", err, stderr.String())
	}
	t.Logf("round %d: killed after %d acknowledged jobs", round, len(acks))
	return acks
}

// checkAfterCrash opens the file the helper was killed on and checks it.
func checkAfterCrash(t *testing.T, path string, acks map[string]ack) {
	t.Helper()
	l, err := Open(path, Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("opening the ledger after the crash: %v", err)
	}
	defer l.Close()
	ctx := context.Background()

	for id, a := range acks {
		j, err := l.Job(ctx, id)
		if err != nil {
			t.Errorf("acknowledged job %s (round %d, n %d): %v", id, a.round, a.n, err)
			continue
		}
		p := crashParams(a.round, a.n)
		if a.failed {
			if j.State != ledger.JobFailed || len(j.Attempts) != 1 || j.Attempts[0].State != ledger.AttemptFailed || j.Response != nil {
				t.Errorf("failed job %s: %+v", id, j)
			}
			continue
		}
		if j.State != ledger.JobCompleted || len(j.Attempts) != 1 || j.Attempts[0].State != ledger.AttemptSucceeded ||
			j.CompletedBy != j.Attempts[0].ID {
			t.Errorf("completed job %s: %+v", id, j)
			continue
		}
		checkAnswer(t, j, a.round, a.n)
		r, err := l.Reserve(ctx, p.WithNewIDs())
		if err != nil || r.Outcome != ledger.Done || r.Job.ID != id {
			t.Errorf("the key of acknowledged job %s: %v %+v %v", id, r.Outcome, r.Job, err)
		}
	}

	// Every job in the database is well-formed, and its key and index
	// entries agree with it.
	records := checkStore(t, l, checkStoredJob)
	jobs := 0
	for q := (ledger.JobQuery{Limit: 500}); ; {
		page, err := l.Jobs(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		jobs += len(page.Jobs)
		if page.Next == "" {
			break
		}
		q.Before = page.Next
	}
	if jobs < len(acks) {
		t.Errorf("%d jobs in the ledger, %d acknowledged", jobs, len(acks))
	}
	t.Logf("%d job records, %d jobs listed", records, jobs)

	// The ledger takes new work: a job of round 0 that completes, as
	// checkStoredJob expects of its number when the next round reads it.
	n := len(acks)
	for crashFails(n) || crashPending(n) {
		n++
	}
	p := crashParams(0, n)
	r, err := l.Reserve(ctx, p.WithNewIDs())
	if err != nil || r.Outcome != ledger.Created {
		t.Fatalf("a new job after the crash: %v %v", r.Outcome, err)
	}
	if c, err := l.Complete(ctx, r.Attempt.Ref(), crashAnswer(0, n)); err != nil || !c.Won {
		t.Fatalf("completing a new job after the crash: %v %v", c.Won, err)
	}
}

// checkStoredJob checks one job record: it decodes, its state agrees with its attempts, and a completed job holds
// the exact answer the helper sent for it.
func checkStoredJob(t *testing.T, v []byte) {
	t.Helper()
	j, err := record.Decode(v)
	if err != nil {
		t.Errorf("a job record does not decode: %v", err)
		return
	}
	if !j.State.Valid() || len(j.Attempts) == 0 {
		t.Errorf("job %s: %+v", j.ID, j)
		return
	}
	var round, n int
	if _, err := fmt.Sscanf(string(j.KeyHash), "r%d-k%d", &round, &n); err != nil {
		t.Errorf("job %s: key %q", j.ID, j.KeyHash)
		return
	}
	if !bytes.Equal(j.Fingerprint, crashParams(round, n).Fingerprint) {
		t.Errorf("job %s: fingerprint %q", j.ID, j.Fingerprint)
	}
	a := j.Attempts[0]
	switch j.State {
	case ledger.JobPending:
		if a.State != ledger.AttemptStarting || j.Response != nil || !j.ExpiresAt.IsZero() {
			t.Errorf("pending job %s: %+v", j.ID, j)
		}
	case ledger.JobFailed:
		if !crashFails(n) || a.State != ledger.AttemptFailed || j.Response != nil || j.ExpiresAt.IsZero() {
			t.Errorf("failed job %s: %+v", j.ID, j)
		}
	case ledger.JobCompleted:
		if crashFails(n) || crashPending(n) || a.State != ledger.AttemptSucceeded || j.CompletedBy != a.ID || j.ExpiresAt.IsZero() {
			t.Errorf("completed job %s: %+v", j.ID, j)
		}
		checkAnswer(t, j, round, n)
	default:
		t.Errorf("job %s is %s", j.ID, j.State)
	}
}

func checkAnswer(t *testing.T, j *ledger.Job, round, n int) {
	t.Helper()
	want, got := crashAnswer(round, n), j.Response
	if got == nil || got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || got.Size != want.Size || !got.Stored ||
		fmt.Sprint(got.Header) != fmt.Sprint(want.Header) {
		t.Errorf("job %s (round %d, n %d): answer %+v, want status %d, %d bytes", j.ID, round, n, got, want.Status, len(want.Body))
	}
}
