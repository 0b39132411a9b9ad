package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// profile is what one profiled run of a fresh or replay series found: its rate, so a
// reader sees how much the profiler slowed it, and the top entries of the
// gateway's CPU and allocation profiles.
type profile struct {
	rps       float64 // the profiled run's requests/s
	cpu, mem  string  // the profiles' files
	top       string  // the top entries of both, as go tool pprof prints them
	allocated float64 // bytes allocated per request, over the measured runs
	gcs       float64 // GC cycles per 1,000 requests, over the measured runs
}

// runtimeCounters reads the Go runtime's cumulative allocation counts and
// GC cycles from the admin endpoint's metrics, and the file ledger's syncs
// of its log (hasSyncs: a file ledger reported them).
type runtimeCounters struct {
	mallocs, bytes, gcs, syncs float64
	hasSyncs                   bool
}

func readRuntime(admin string) runtimeCounters {
	c := runtimeCounters{
		mallocs: metric(admin, "go_memstats_mallocs_total"),
		bytes:   metric(admin, "go_memstats_alloc_bytes_total"),
		gcs:     metric(admin, "go_gc_duration_seconds_count"),
	}
	c.syncs, c.hasSyncs = metricSeen(admin, "caddy_idempotency_ledger_syncs_total")
	return c
}

// profileSeries drives one more run of a fresh or replay series (mode),
// with keys keys named after prefix, after its measured
// runs (the profiler costs CPU, so it never runs under a measured one),
// and takes a CPU profile and an allocation profile of the gateway over
// the same seconds from Caddy's admin endpoint (net/http/pprof): the CPU
// profile with /debug/pprof/profile?seconds=N, the allocations as the
// difference between the allocation counts at the start and at the end
// (/debug/pprof/allocs?seconds=N). Both are saved in cfg.profiles as
// <series>.cpu.pprof and <series>.allocs.pprof, and their top entries in
// <series>.top.txt.
func profileSeries(cfg config, srv *server, name, mode, prefix string, keys int) (*profile, error) {
	secs := max(1, int(cfg.duration/time.Second))
	p := &profile{
		cpu: filepath.Join(cfg.profiles, name+".cpu.pprof"),
		mem: filepath.Join(cfg.profiles, name+".allocs.pprof"),
	}
	type ran struct {
		s   sample
		err error
	}
	load := make(chan ran, 1)
	go func() {
		// A second longer than the profiles, which start half a second
		// in: they see the load at full speed only.
		s, err := drive(cfg, srv.url, time.Duration(secs+1)*time.Second, mode, prefix, keys)
		load <- ran{s, err}
	}()
	time.Sleep(500 * time.Millisecond)
	fetched := make(chan error, 2)
	go func() { fetched <- fetchProfile(srv.admin, fmt.Sprintf("profile?seconds=%d", secs), p.cpu) }()
	go func() { fetched <- fetchProfile(srv.admin, fmt.Sprintf("allocs?seconds=%d", secs), p.mem) }()
	errCPU, errMem := <-fetched, <-fetched
	r := <-load
	for _, err := range []error{r.err, errCPU, errMem} {
		if err != nil {
			return nil, err
		}
	}
	p.rps = r.s.rps
	// Each profile by flat (the function's own) and by cum (with what it
	// calls); the CPU's once more by cum among onejob's own functions
	// only, as Caddy's and net/http's frames head the full list.
	var top strings.Builder
	for _, v := range []struct {
		title, file string
		args        []string
	}{
		{"CPU, by flat", p.cpu, nil},
		{"CPU, by cum", p.cpu, []string{"-cum"}},
		{"CPU, by cum, onejob's functions", p.cpu, []string{"-cum", "-show=^github.com/onejob/"}},
		{"allocations (bytes), by flat", p.mem, []string{"-sample_index=alloc_space"}},
		{"allocations (bytes), by cum", p.mem, []string{"-sample_index=alloc_space", "-cum"}},
	} {
		args := append([]string{"tool", "pprof", "-top", "-nodecount=15"}, v.args...)
		out, err := exec.Command("go", append(args, v.file)...).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("go tool pprof %s: %v\n%s", v.file, err, out)
		}
		fmt.Fprintf(&top, "  %s:\n%s", v.title, indent(trimPprofHeader(string(out))))
	}
	p.top = top.String()
	if err := os.WriteFile(filepath.Join(cfg.profiles, name+".top.txt"), []byte(p.top), 0o644); err != nil {
		return nil, err
	}
	return p, nil
}

// fetchProfile saves what the admin endpoint's /debug/pprof/<query>
// answers in file.
func fetchProfile(admin, query, file string) error {
	resp, err := http.Get("http://" + admin + "/debug/pprof/" + query)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("/debug/pprof/%s: %s: %s", query, resp.Status, body)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// trimPprofHeader drops the lines of go tool pprof's report that name the
// binary and the time of the profile: the rest (duration, totals, the
// entries) is what the bench prints.
func trimPprofHeader(s string) string {
	var keep []string
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if strings.HasPrefix(line, "File:") || strings.HasPrefix(line, "Build ID:") || strings.HasPrefix(line, "Time:") {
			continue
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "\n") + "\n"
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}

// printProfiles prints, for each profiled series, its allocations per
// request over the measured runs and the top entries of its profiles.
func printProfiles(w io.Writer, dir string, results []result) {
	shown := false
	for _, r := range results {
		if r.profile == nil {
			continue
		}
		if !shown {
			fmt.Fprintf(w, "\nProfiles of the gateway under each fresh and replay series (one extra run after the measured ones), saved in %s\n", dir)
			shown = true
		}
		p := r.profile
		fmt.Fprintf(w, "\n%s: profiled run %.0f req/s (measured median %.0f); measured runs: %.0f allocations, %.1f KiB allocated per request, %.1f GC cycles per 1,000 requests\n",
			r.name, p.rps, r.rps, r.allocs, p.allocated/1024, p.gcs)
		fmt.Fprintf(w, "  %s, %s\n%s", filepath.Base(p.cpu), filepath.Base(p.mem), p.top)
	}
}
