package main

import (
	"strings"
	"testing"
)

// stream is `go test -json` output in the shape cmd/test2json writes it.
func stream(lines ...string) *strings.Reader {
	return strings.NewReader(strings.Join(lines, "\n") + "\n")
}

func TestReportCountsAndFailures(t *testing.T) {
	in := stream(
		`{"Action":"start","Package":"p"}`,
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.5}`,
		`{"Action":"run","Package":"p","Test":"TestB"}`,
		`{"Action":"run","Package":"p","Test":"TestB/sub"}`,
		`{"Action":"output","Package":"p","Test":"TestB/sub","Output":"    b_test.go:9: got 1, want 2\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestB/sub","Elapsed":0.1}`,
		`{"Action":"fail","Package":"p","Test":"TestB","Elapsed":0.1}`,
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.5}`,
		`{"Action":"fail","Package":"p","Elapsed":1.2}`,
	)
	var live strings.Builder
	tl, err := read(in, &live)
	if err != nil {
		t.Fatal(err)
	}
	if tl.passed != 2 || tl.failed != 2 || tl.skipped != 0 {
		t.Errorf("passed %d failed %d skipped %d, want 2 2 0", tl.passed, tl.failed, tl.skipped)
	}
	if len(tl.retried) != 1 || tl.retried[0] != "p TestA" {
		t.Errorf("retried %q, want [p TestA]", tl.retried)
	}
	if len(tl.brokenPackages) != 0 {
		t.Errorf("a package with a failed test is not broken on its own: %q", tl.brokenPackages)
	}
	if !strings.Contains(live.String(), "--- FAIL: TestB (") || !strings.Contains(live.String(), "    --- FAIL: TestB/sub") {
		t.Errorf("live output lacks the failures:\n%s", live.String())
	}
	var out strings.Builder
	if tl.report(&out, "stage") {
		t.Error("the report passed a run with failures")
	}
	for _, want := range []string{"--- FAIL: p TestB/sub", "got 1, want 2", "--- RETRIED: p TestA", "stage: 2 passed, 2 failed, 0 skipped, 1 retried"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestReportNamesTheTestsRunningAtTimeout(t *testing.T) {
	in := stream(
		`{"Action":"run","Package":"p","Test":"TestSlow"}`,
		`{"Action":"output","Package":"p","Test":"TestSlow","Output":"=== RUN   TestSlow\n"}`,
		`{"Action":"output","Package":"p","Output":"panic: test timed out after 1s\n"}`,
		`{"Action":"output","Package":"p","Output":"\trunning tests:\n"}`,
		`{"Action":"output","Package":"p","Output":"\t\tTestSlow (1s)\n"}`,
		`{"Action":"fail","Package":"p","Elapsed":1}`,
	)
	tl, err := read(in, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if tl.report(&out, "stage") {
		t.Error("the report passed a package that timed out")
	}
	for _, want := range []string{"--- FAIL (package): p", "running tests:", "TestSlow (1s)", "-timeout ran out"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestReportPassesACleanRun(t *testing.T) {
	in := stream(
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.1}`,
		`{"Action":"run","Package":"q","Test":"TestA"}`,
		`{"Action":"pass","Package":"q","Test":"TestA","Elapsed":0.1}`,
		`{"Action":"pass","Package":"p","Elapsed":0.2}`,
		`{"Action":"pass","Package":"q","Elapsed":0.2}`,
	)
	tl, err := read(in, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if !tl.report(&out, "stage") || !strings.Contains(out.String(), "stage: 2 passed, 0 failed, 0 skipped, 0 retried") {
		t.Errorf("a clean run (one test name in two packages) did not pass:\n%s", out.String())
	}
}
