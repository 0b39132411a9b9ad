package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/onejob/onejob/integration/faultproxy"
)

// report is the outcome of the checks: violations and figures.
type report struct {
	Violations []string

	JobsByState     map[string]int
	AttemptsByState map[string]int
	Arrivals        int
	Executions      int
	NeverReached    int // attempts the upstream never saw
	NotRecorded     int // results clients got that the ledger could not record
	Unstored        int // completed jobs whose stream was cut short, not stored
	ClientResults   int // results (upstream answers that are no refusal) clients got

	WronglyReplayed int // a request's own answer (or a problem) marked Idempotent-Replayed
	WronglyUnmarked int // a replay of another request's answer without the mark
	NeverSent       int // unknown attempts the gateway knew it never sent (violations)
	Unsent          int // attempts recorded failed because the gateway never sent them
	// Duplicates are the identities the upstream executed more than once
	// (in one job or in several); CrossAnswers the answers a client got
	// that were meant for another owner or key.
	Duplicates   []identity
	CrossAnswers int
	// UnknownByCause counts the unknown jobs by the fault that produced
	// them; UnarrivedUnknown the unknown attempts the upstream never got,
	// by what makes them legitimate.
	UnknownByCause   map[string]int
	UnarrivedUnknown map[string]int
}

func (r *report) violate(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

// totals are the figures over both routes, and on a cluster what preceded
// each violation.
type totals struct {
	Duplicates          []identity // intents executed more than once
	DuplicatesAfterKill int        // of those, the ones a master kill may have caused
	CrossAnswers        int        // answers meant for another owner or key
	Notes               []string   // by violation: the master kill before it, or ""
}

func printReport(w io.Writer, o options, r *report, ev *evidence, cl *clients, up *upstream, events []string, t totals, took time.Duration) {
	var (
		requests, retries, timeouts, disconnects, transport, replayed int
		statuses                                                      = map[int]int{}
		problems                                                      = map[string]int{}
	)
	for _, e := range ev.Exchanges {
		requests++
		if e.Try > 1 {
			retries++
		}
		switch {
		case e.Cut == "timeout":
			timeouts++
		case e.Cut == "disconnect":
			disconnects++
		case e.Err != "":
			transport++
		default:
			statuses[e.Status]++
			if e.Replayed {
				replayed++
			}
			if e.Problem != "" {
				problems[fmt.Sprintf("%d %s", e.Status, e.Problem)]++
			}
		}
	}
	row := func(name string, format string, args ...any) {
		fmt.Fprintf(w, "  %-28s %s\n", name, fmt.Sprintf(format, args...))
	}
	fmt.Fprintf(w, "\nchaos soak on %s: %s (load %s)\n", o.ledger, took.Round(time.Second), o.duration)
	row("requests", "%d (%d first tries, %d retries)", requests, requests-retries, retries)
	row("client sessions", "%d (%d gave up after %d tries)", cl.sessions.Load(), cl.gaveUp.Load(), o.maxTries)
	row("client timeouts", "%d", timeouts)
	row("client disconnects", "%d", disconnects)
	row("transport errors", "%d (refused, reset, cut short)", transport)
	row("answers by status", "%s", countList(statuses))
	row("gateway problems", "%s", countList(problems))
	row("replayed answers", "%d", replayed)
	row("jobs", "%d (%s)", len(ev.Jobs), countList(r.JobsByState))
	attempts := 0
	for _, n := range r.AttemptsByState {
		attempts += n
	}
	row("attempts", "%d (%s)", attempts, countList(r.AttemptsByState))
	row("upstream arrivals", "%d (%d executions)", r.Arrivals, r.Executions)
	row("attempts never arrived", "%d", r.NeverReached)
	row("unknown jobs", "%d", r.JobsByState["unknown"])
	row("races lost", "%d", r.AttemptsByState["lost"])
	row("results to clients", "%d (%d answered but not recorded)", r.ClientResults, r.NotRecorded)
	row("answers not stored", "%d (streams cut short after they won)", r.Unstored)
	faults := map[string]int{}
	for b, n := range up.faultCounts() {
		faults[behaviour(b).String()] = n
	}
	faults["reset on accept"] = int(up.resets.Load())
	row("upstream behaviours", "%s", countList(faults))
	row("gateway kills (SIGKILL)", "%d", len(ev.Kills))
	crashes := 0
	for _, r := range ev.Restarts {
		if r.Crash {
			crashes++
		}
	}
	if ev.OnCluster {
		var kills, moves []string
		keys := 0
		for _, e := range ev.Cluster {
			switch e.Kind {
			case clusterKill:
				kills = append(kills, fmt.Sprintf("promoted after %s, whole after %s",
					e.Promoted.Sub(e.At).Round(100*time.Millisecond), e.End.Sub(e.At).Round(100*time.Millisecond)))
			case clusterMigration:
				moves = append(moves, fmt.Sprintf("slot %d, %d jobs", e.Slots[0][0], len(e.Jobs)))
				keys += e.Keys
			}
		}
		row("master kills (SIGKILL)", "%d (%s)", len(kills), strings.Join(kills, "; "))
		row("slot migrations", "%d (%s; %d keys)", len(moves), strings.Join(moves, "; "), keys)
	} else {
		row("ledger restarts", "%d (%d a crash)", len(ev.Restarts), crashes)
	}
	counts, onCache, conns := linkCounts(ev.Links)
	var cut time.Duration
	for _, e := range ev.Links {
		if e.Kind == faultproxy.KindCut && !e.End.IsZero() {
			cut += e.End.Sub(e.At)
		}
	}
	cached := func(kind string) string {
		if n := onCache[kind]; n > 0 {
			return fmt.Sprintf(" (%d on a cache's link)", n)
		}
		return ""
	}
	if ev.OnCluster {
		row("ledger-link faults", "none: the gateways reach the cluster's nodes directly")
	} else {
		row("ledger-link faults", "%s %d%s, %s %d%s (%d connections), %s %d (replies held %s), %s %d (%s in all)",
			faultDrop, counts[faultDrop], cached(faultDrop), faultReset, counts[faultReset], cached(faultReset), conns,
			faultDelay, counts[faultDelay], o.links.Delay, faultCut, counts[faultCut], cut.Round(100*time.Millisecond))
	}
	for _, e := range events {
		fmt.Fprintf(w, "    %s\n", e)
	}
	row("unknown jobs by fault", "%s", countList(r.UnknownByCause))
	row("unknown, never arrived", "%s", countList(r.UnarrivedUnknown))
	row("wrong replay markers", "%d marked, %d unmarked", r.WronglyReplayed, r.WronglyUnmarked)
	row("never sent, recorded failed", "%d attempts", r.Unsent)
	row("never-sent unknown", "%d (attempts the gateway knew it never sent)", r.NeverSent)
	afterKill := 0
	for _, n := range t.Notes {
		if n != "" {
			afterKill++
		}
	}
	if ev.OnCluster {
		row("duplicate executions", "%d (%d after a master kill that served their slot)", len(t.Duplicates), t.DuplicatesAfterKill)
		row("cross-owner answers", "%d", t.CrossAnswers)
		fmt.Fprintf(w, "  %-28s %d (%d after a master kill that served their slot)\n", "violations", len(r.Violations), afterKill)
	} else {
		row("duplicate executions", "%d", len(t.Duplicates))
		row("cross-owner answers", "%d", t.CrossAnswers)
		fmt.Fprintf(w, "  %-28s %d\n", "violations", len(r.Violations))
	}
	var logs []string
	if len(r.Violations) > 0 {
		logs = gatewayLogs(o.work)
	}
	for i, v := range r.Violations {
		if i == o.maxViolations {
			fmt.Fprintf(w, "    ... and %d more\n", len(r.Violations)-i)
			break
		}
		fmt.Fprintf(w, "    VIOLATION %s\n", v)
		if i < len(t.Notes) && t.Notes[i] != "" {
			fmt.Fprintf(w, "      (%s)\n", t.Notes[i])
		}
		for _, l := range logLinesOf(logs, v, 12) {
			fmt.Fprintf(w, "      %s\n", l)
		}
	}
}

// countList prints counts as "name n, name n", largest first.
func countList[K comparable](m map[K]int) string {
	type kv struct {
		k string
		n int
	}
	var l []kv
	for k, n := range m {
		l = append(l, kv{fmt.Sprint(k), n})
	}
	sort.Slice(l, func(a, b int) bool {
		if l[a].n != l[b].n {
			return l[a].n > l[b].n
		}
		return l[a].k < l[b].k
	})
	parts := make([]string, len(l))
	for i, x := range l {
		parts[i] = fmt.Sprintf("%s %d", x.k, x.n)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
