package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// sample is one measured run of one series.
type sample struct {
	rps      float64
	p50, p99 time.Duration
	requests int64
	cpu      time.Duration // the server's CPU time per request; 0 if not measured
	shares                 // where the machine's CPU went (withShares)
}

// runWrk drives url for d with wrk and request.lua in the given mode.
func runWrk(cfg config, url string, d time.Duration, mode, prefix string, keys int) (sample, error) {
	args := []string{"-t", strconv.Itoa(cfg.threads), "-c", strconv.Itoa(cfg.connections),
		"-d", fmt.Sprintf("%.0fs", d.Seconds()), "--latency", "--timeout", "10s",
		"-s", filepath.Join(cfg.dir, "request.lua"), url + "/charges",
		"--", mode, prefix, strconv.Itoa(keys), strconv.Itoa(recentJobs)}
	cmd := cfg.command(loadCPU, cfg.wrk, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return sample{}, fmt.Errorf("wrk: %v\n%s", err, out)
	}
	s, err := parseWrk(out)
	s.load = exitedCPU(cmd)
	return s, err
}

// exitedCPU returns the CPU time (user + system) of cmd's process, which
// has exited.
func exitedCPU(cmd *exec.Cmd) time.Duration {
	if cmd.ProcessState == nil {
		return 0
	}
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

var (
	wrkRequests = regexp.MustCompile(`(?m)^\s*(\d+) requests in`)
	wrkRate     = regexp.MustCompile(`(?m)^Requests/sec:\s*([\d.]+)`)
	wrkLatency  = regexp.MustCompile(`(?m)^\s*(50|99)%\s+([\d.]+)(us|ms|s)\s*$`)
	wrkNon2xx   = regexp.MustCompile(`(?m)^\s*Non-2xx or 3xx responses: (\d+)`)
	wrkErrors   = regexp.MustCompile(`(?m)^\s*Socket errors: (.*)$`)
)

// parseWrk reads wrk's report; answers other than 2xx and socket errors
// make the sample invalid: a benchmark of failures measures nothing.
func parseWrk(out []byte) (sample, error) {
	var s sample
	if m := wrkNon2xx.FindSubmatch(out); m != nil {
		return s, fmt.Errorf("wrk: %s answers were not 2xx:\n%s", m[1], out)
	}
	if m := wrkErrors.FindSubmatch(out); m != nil {
		return s, fmt.Errorf("wrk: socket errors (%s):\n%s", m[1], out)
	}
	m := wrkRequests.FindSubmatch(out)
	r := wrkRate.FindSubmatch(out)
	if m == nil || r == nil {
		return s, fmt.Errorf("wrk: unexpected output:\n%s", out)
	}
	s.requests, _ = strconv.ParseInt(string(m[1]), 10, 64)
	s.rps, _ = strconv.ParseFloat(string(r[1]), 64)
	for _, l := range wrkLatency.FindAllSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(string(l[2]), 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[string(l[3])]
		d := time.Duration(v * float64(unit))
		if string(l[1]) == "50" {
			s.p50 = d
		} else {
			s.p99 = d
		}
	}
	return s, nil
}

// runPgbench runs ledger.pgbench against the ledger's schema for d with as
// many clients as wrk has connections, and reads the latencies from its
// per-transaction log.
func runPgbench(cfg config, dsn, schema string, d time.Duration) (sample, error) {
	logDir, err := os.MkdirTemp(cfg.work, "pgbench-")
	if err != nil {
		return sample{}, err
	}
	defer os.RemoveAll(logDir)
	cmd := cfg.command(loadCPU, cfg.pgbench, "-n", "-M", "prepared",
		"-c", strconv.Itoa(cfg.connections), "-j", strconv.Itoa(cfg.threads),
		"-T", fmt.Sprintf("%.0f", d.Seconds()),
		"-f", filepath.Join(cfg.dir, "ledger.pgbench"),
		"-l", "--log-prefix", filepath.Join(logDir, "tx"), dsn)
	cmd.Env = append(os.Environ(), "PGOPTIONS=-c search_path="+schema)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return sample{}, fmt.Errorf("pgbench: %v\n%s", err, out)
	}
	s := sample{shares: shares{load: exitedCPU(cmd)}}
	m := regexp.MustCompile(`tps = ([\d.]+) \(without initial connection time\)`).FindSubmatch(out)
	if m == nil {
		return s, fmt.Errorf("pgbench: unexpected output:\n%s", out)
	}
	s.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	if f := regexp.MustCompile(`number of failed transactions: (\d+)`).FindSubmatch(out); f != nil && string(f[1]) != "0" {
		return s, fmt.Errorf("pgbench: %s transactions failed:\n%s", f[1], out)
	}
	// Each log line: client_id transaction_no time_us script_no epoch us.
	var lat []time.Duration
	files, _ := filepath.Glob(filepath.Join(logDir, "tx*"))
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return s, err
		}
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 3 {
				continue
			}
			us, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil {
				continue
			}
			lat = append(lat, time.Duration(us)*time.Microsecond)
		}
	}
	s.requests = int64(len(lat))
	s.p50, s.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	return s, nil
}

// percentile returns the q-quantile of ds (sorted in place).
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[int(q*float64(len(ds)-1))]
}
