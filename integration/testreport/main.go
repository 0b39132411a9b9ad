// Command testreport reads `go test -json` on its standard input and says
// what a person running the test command needs: each top-level test's
// result as it ends, then how many tests passed, failed, were skipped and
// were retried, and for a run that failed, what each failed test printed
// and, when the time ran out, which tests were running.
//
// It exits 1 when any test failed, was skipped or ran more than once with
// the same name in one package (a retried test is a failed one: test.sh
// runs every test once), or when a package failed without a failed test (a
// build error, a panic, a timeout).
//
// Usage: go test -json ... | testreport -stage NAME
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// tally is what a stream of events came to.
type tally struct {
	passed, failed, skipped int
	retried                 []string // package and test, once per extra run
	failures                []string // each failed test's name and output
	brokenPackages          []string // failed with no failed test: their last output
}

// maxOutput is how many of a failed test's last lines the report prints.
const maxOutput = 60

func main() {
	stage := flag.String("stage", "tests", "the name the summary line gives")
	flag.Parse()
	t, err := read(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	if !t.report(os.Stdout, *stage) {
		os.Exit(1)
	}
}

// read consumes the events, printing each top-level test's and package's
// result line to live as it arrives, and returns the tally.
func read(r io.Reader, live io.Writer) (*tally, error) {
	type key struct{ pkg, test string }
	var (
		t       tally
		output  = map[key][]string{} // each running test's lines, and each package's
		runs    = map[key]int{}
		failed  = map[string]bool{} // packages with a failed test
		scanner = bufio.NewScanner(r)
	)
	scanner.Buffer(make([]byte, 1<<20), 16<<20)
	for scanner.Scan() {
		line := scanner.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// go test prints build failures as plain text.
			fmt.Fprintf(live, "%s\n", line)
			k := key{pkg: "(build)"}
			output[k] = append(output[k], string(line))
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "build-output":
			fmt.Fprint(live, e.Output)
			k := key{pkg: "(build)"}
			output[k] = append(output[k], strings.TrimRight(e.Output, "\n"))
		case "run":
			runs[k]++
			if runs[k] == 2 {
				t.retried = append(t.retried, e.Package+" "+e.Test)
			}
		case "output":
			output[k] = append(output[k], strings.TrimRight(e.Output, "\n"))
			if e.Test != "" {
				// A package's own output keeps its tests' lines too, for a
				// package that ends without its tests' results (a timeout).
				pk := key{pkg: e.Package}
				output[pk] = append(output[pk], strings.TrimRight(e.Output, "\n"))
			}
		case "pass", "fail", "skip":
			if e.Test == "" {
				result := "ok  "
				if e.Action == "fail" {
					result = "FAIL"
				}
				fmt.Fprintf(live, "%s %s %.1fs\n", result, e.Package, e.Elapsed)
				if e.Action == "fail" && !failed[e.Package] {
					t.brokenPackages = append(t.brokenPackages, e.Package+"\n"+tail(output[k], maxOutput))
				}
				delete(output, k)
				continue
			}
			switch e.Action {
			case "pass":
				t.passed++
			case "fail":
				t.failed++
				failed[e.Package] = true
				t.failures = append(t.failures, fmt.Sprintf("--- FAIL: %s %s (%.2fs)\n%s", e.Package, e.Test, e.Elapsed, tail(output[k], maxOutput)))
			case "skip":
				t.skipped++
			}
			// Top-level tests as they end, subtests only when they did not
			// pass.
			if !strings.Contains(e.Test, "/") {
				fmt.Fprintf(live, "--- %s: %s (%s)\n", strings.ToUpper(e.Action), e.Test, time.Duration(e.Elapsed*float64(time.Second)).Round(10*time.Millisecond))
			} else if e.Action != "pass" {
				fmt.Fprintf(live, "    --- %s: %s\n", strings.ToUpper(e.Action), e.Test)
			}
			delete(output, k)
		}
	}
	if err := scanner.Err(); err != nil {
		return nil, err
	}
	if lines := output[key{pkg: "(build)"}]; len(lines) > 0 {
		t.brokenPackages = append(t.brokenPackages, "(build output)\n"+tail(lines, maxOutput))
	}
	return &t, nil
}

// report prints the summary and what went wrong, and says whether the run
// passed.
func (t *tally) report(w io.Writer, stage string) bool {
	for _, f := range t.failures {
		fmt.Fprintln(w, f)
	}
	for _, p := range t.brokenPackages {
		fmt.Fprintf(w, "--- FAIL (package): %s\n", p)
		if strings.Contains(p, "panic: test timed out") {
			fmt.Fprintln(w, "(the stage's -timeout ran out; the tests named under \"running tests:\" above were running)")
		}
	}
	sort.Strings(t.retried)
	for _, r := range t.retried {
		fmt.Fprintf(w, "--- RETRIED: %s\n", r)
	}
	fmt.Fprintf(w, "%s: %d passed, %d failed, %d skipped, %d retried\n", stage, t.passed, t.failed, t.skipped, len(t.retried))
	return t.failed == 0 && t.skipped == 0 && len(t.retried) == 0 && len(t.brokenPackages) == 0
}

// tail is the last n of lines, indented, one string.
func tail(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("    ")
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}
