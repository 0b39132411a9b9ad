package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Where the machine's CPU goes during a run: the whole machine from
// /proc/stat, the server under test from its /proc/<pid>/stat, the load
// generator (wrk, pgbench) from its own usage when it exits, and the
// upstream from this program's usage (it serves the upstream; between
// runs it only reads counters). What is left is the rest: PostgreSQL,
// Redis, the kernel's work that no process is charged with (loopback
// packets, flushes), and anything else running. A ratio target asks the
// machine to carry a rate; this shows what the server could take per
// request for the machine to have the CPU for it.

// shares is where the machine's CPU went over a run, per request: every
// core's busy time, the load generator's and the upstream's (the server's
// is the sample's cpu). In a sample, load is the load generator's total
// until withShares divides it.
type shares struct {
	machine, load, upstream time.Duration
	busy                    float64 // the cores' busy time over the run's wall time, 0 to 1
	cores                   int
}

// procTicks is the unit of /proc's CPU times (USER_HZ on Linux).
const procTicks = 100

// machineCPU returns the CPU time every core spent busy so far, and the
// number of cores (parseStat of /proc/stat).
func machineCPU() (time.Duration, int) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	return parseStat(f)
}

// parseStat reads /proc/stat: the busy time of every core together (user,
// nice, system, irq and softirq on its "cpu" line; guest time is inside
// user, and steal, another guest's, is not counted), and the number of
// "cpu<N>" lines.
func parseStat(r io.Reader) (busy time.Duration, cores int) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || !strings.HasPrefix(fields[0], "cpu") {
			continue
		}
		if fields[0] != "cpu" {
			cores++
			continue
		}
		// user nice system idle iowait irq softirq steal ...
		for _, i := range []int{1, 2, 3, 6, 7} {
			t, _ := strconv.ParseInt(fields[i], 10, 64)
			busy += time.Duration(t) * time.Second / procTicks
		}
	}
	return busy, cores
}

// selfCPU returns this program's CPU time so far (user + system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// withShares takes one measured run and adds to its sample where the
// machine's CPU went meanwhile, per request: the machine's, the load
// generator's (run sets the total in load), and the upstream's.
func withShares(run func() (sample, error)) (sample, error) {
	machine0, cores := machineCPU()
	self0, start := selfCPU(), time.Now()
	smp, err := run()
	if err != nil || smp.requests == 0 {
		return smp, err
	}
	machine, _ := machineCPU()
	wall := time.Since(start)
	n := time.Duration(smp.requests)
	smp.machine, smp.upstream, smp.load = (machine-machine0)/n, (selfCPU()-self0)/n, smp.load/n
	if cores > 0 && wall > 0 {
		smp.busy = float64(machine-machine0) / (float64(wall) * float64(cores))
	}
	smp.cores = cores
	return smp, nil
}

// printShares prints, for each series, where the machine's CPU went per
// request, and the rate it would carry were the cores busy all the time.
// For a series with a ratio target, it prints what the server could take
// per request for the machine to carry the rate the target asks, given
// what everything else took per request in that series: when everything
// else alone takes more, no server would reach the target here.
func printShares(w io.Writer, results []result) {
	byName := map[string]result{}
	cores := 0
	for _, r := range results {
		byName[r.name] = r
		cores = max(cores, r.cores)
	}
	if cores == 0 {
		return
	}
	fmt.Fprintf(w, "\nwhere the machine's %d cores went, per request (medians of the runs; rest: PostgreSQL, Redis, the kernel's own work and anything else)\n", cores)
	fmt.Fprintf(w, "%-30s %10s %5s %9s %7s %11s %7s %13s  %s\n",
		"series", "machine-us", "busy", "server-us", "load-us", "upstream-us", "rest-us", "ceiling-req/s", "for the target: the server could take")
	us := func(d time.Duration) string {
		if d <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", float64(d)/float64(time.Microsecond))
	}
	for _, r := range results {
		if r.machine <= 0 {
			continue
		}
		rest := r.machine - r.cpu - r.load - r.upstream
		ceiling := float64(cores) * float64(time.Second) / float64(r.machine)
		budget := ""
		if b, ok := byName[r.baseline]; ok && r.target.ratio > 0 {
			// The machine CPU a request may cost for the cores to carry
			// the rate the target asks, less what all but the server took.
			perRequest := time.Duration(float64(cores) * float64(time.Second) / (r.target.ratio * b.rps))
			if left := perRequest - (r.machine - r.cpu); left > 0 {
				budget = fmt.Sprintf("<= %.1f us (took %s)", float64(left)/float64(time.Microsecond), us(r.cpu))
			} else {
				budget = fmt.Sprintf("nothing: all but the server take %s us of the %.1f a request may cost at %.0f req/s",
					us(r.machine-r.cpu), float64(perRequest)/float64(time.Microsecond), r.target.ratio*b.rps)
			}
		}
		// The rest is a difference of times counted in 10 ms ticks
		// (/proc) and in microseconds: near zero, it may come out below.
		fmt.Fprintf(w, "%-30s %10s %4.0f%% %9s %7s %11s %7.1f %13.0f  %s\n",
			r.name, us(r.machine), 100*r.busy, us(r.cpu), us(r.load), us(r.upstream), float64(rest)/float64(time.Microsecond), ceiling, budget)
	}
}
