//go:build integration

package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// cli runs the built binary's "caddy idempotency <args>" and returns its
// output and exit code.
func cli(t *testing.T, g *gateway, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"idempotency"}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+g.home, "XDG_DATA_HOME="+g.home+"/data", "XDG_CONFIG_HOME="+g.home+"/config")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("running caddy idempotency %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// tableRow returns the row of a printed table whose first column is id,
// split into columns, or nil.
func tableRow(table, id string) []string {
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, id+" ") {
			return strings.Fields(line)
		}
	}
	return nil
}

// TestCLIListsAndCancels: "caddy idempotency" against a running gateway
// lists its jobs, shows one, and cancels an unknown job, after which a
// retry runs a new attempt; API errors fail the command with the problem's
// title and detail.
func TestCLIListsAndCancels(t *testing.T) {
	b := pgBackend(t)
	release := make(chan struct{})
	defer close(release)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("Idempotency-Key") == "cli-stuck" && n == 1 {
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"attempt":"`+r.Header.Get("Idempotency-Attempt")+`"}`)
	})
	g := startGateway(t, b, site(up.addr()))
	done := g.post(t, "/charges", "cli-done", auth, `{}`)
	stuck := g.post(t, "/charges", "cli-stuck", auth, `{}`)
	if done.status != http.StatusOK || stuck.status != http.StatusGatewayTimeout {
		t.Fatalf("setup: %v / %v", done, stuck)
	}
	doneID, stuckID := done.header.Get("Idempotency-Job-Id"), stuck.header.Get("Idempotency-Job-Id")

	out, errOut, code := cli(t, g, "jobs", "--address", g.admin)
	if code != 0 {
		t.Fatalf("jobs: exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "ID STATE PROVIDER ATTEMPTS CREATED (UTC) COMPLETED BY" {
		t.Fatalf("jobs printed:\n%s", out)
	}
	if !strings.HasPrefix(lines[1], stuckID) || !strings.HasPrefix(lines[2], doneID) {
		t.Errorf("jobs are not newest first:\n%s", out)
	}
	// id, state, provider, attempts, created (two fields), completed by
	if row := tableRow(out, stuckID); len(row) != 7 || row[1] != "unknown" || row[2] != "next" || row[3] != "1" || row[6] != "-" {
		t.Errorf("the unknown job's row: %q", row)
	}
	if row := tableRow(out, doneID); len(row) != 8 || row[1] != "completed" || row[3] != "1" || row[6] != "#1" || row[7] != "next" {
		t.Errorf("the completed job's row: %q", row)
	}

	// The admin address read from the gateway's own config, and a filter.
	out, errOut, code = cli(t, g, "jobs", "--config", g.config, "--adapter", "caddyfile", "--state", "unknown")
	if code != 0 || tableRow(out, stuckID) == nil || tableRow(out, doneID) != nil {
		t.Errorf("jobs --config --state unknown: exit %d\n%s%s", code, out, errOut)
	}

	out, errOut, code = cli(t, g, "show", stuckID, "--address", g.admin)
	if code != 0 || !strings.Contains(out, "State         unknown (version 1)") ||
		!strings.Contains(strings.Join(strings.Fields(out), " "), "1 "+g.job(t, stuckID).Attempts[0].ID+" next unknown +0s") {
		t.Errorf("show: exit %d\n%s%s", code, out, errOut)
	}

	// --json prints the admin API's answer, for scripts.
	out, errOut, code = cli(t, g, "jobs", "--json", "--state", "unknown", "--address", g.admin)
	var page struct {
		Jobs []adminJob `json:"jobs"`
		Next *string    `json:"next"`
	}
	if err := json.Unmarshal([]byte(out), &page); code != 0 || errOut != "" || err != nil ||
		len(page.Jobs) != 1 || page.Jobs[0].ID != stuckID || page.Jobs[0].State != "unknown" || page.Next != nil {
		t.Errorf("jobs --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	out, errOut, code = cli(t, g, "show", "--json", doneID, "--address", g.admin)
	var shown adminJob
	if err := json.Unmarshal([]byte(out), &shown); code != 0 || errOut != "" || err != nil ||
		shown.ID != doneID || shown.State != "completed" || len(shown.Attempts) != 1 || shown.Response == nil || !shown.Response.Stored {
		t.Errorf("show --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}

	out, errOut, code = cli(t, g, "resolve", stuckID, "--cancel", "--address", g.admin)
	if code != 0 || !strings.HasPrefix(out, "Cancelled job "+stuckID+": it is now failed") {
		t.Fatalf("resolve --cancel: exit %d\n%s%s", code, out, errOut)
	}
	if j := g.job(t, stuckID); j.State != "failed" || j.Attempts[0].State != "cancelled" {
		t.Errorf("the job after the cancel: %+v", j)
	}
	retry := g.post(t, "/charges", "cli-stuck", auth, `{}`)
	if retry.status != http.StatusOK || retry.body != `{"attempt":"2"}` || retry.header.Get("Idempotency-Job-Id") != stuckID {
		t.Errorf("the retry after the cancel: %v", retry)
	}

	// Errors of the admin API: the problem's title and detail, exit 1.
	_, errOut, code = cli(t, g, "resolve", doneID, "--cancel", "--address", g.admin)
	if code != 1 || errOut != "Job already completed: The job already completed; its result cannot be changed.\n" {
		t.Errorf("cancelling a completed job: exit %d, %q", code, errOut)
	}
	const missing = "01a20000-0000-7000-8000-000000000000"
	_, errOut, code = cli(t, g, "show", missing, "--address", g.admin)
	if code != 1 || !strings.HasPrefix(errOut, "Job not found: No open ledger holds job \""+missing+"\"") {
		t.Errorf("showing a missing job: exit %d, %q", code, errOut)
	}
	_, errOut, code = cli(t, g, "jobs", "--state", "stuck", "--address", g.admin)
	if code != 1 || !strings.HasPrefix(errOut, "Invalid request: state must be pending, unknown, completed or failed") {
		t.Errorf("an invalid state: exit %d, %q", code, errOut)
	}
}
