package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onejob/onejob/integration/ports"
)

// server is one Caddy process under test, with its own home and data
// directories.
type server struct {
	cmd   *exec.Cmd
	url   string
	admin string
	home  string
	log   *os.File
	done  chan struct{}
}

// The cores -pin puts the processes on: the load generators (wrk,
// pgbench) on one, the server under test (the gateway, plain Caddy) on the
// other.
const (
	serverCPU = "0"
	loadCPU   = "1"
)

// command returns the command that runs name with args, under taskset on
// cpu when -pin is set. taskset execs the program: the process's id, and
// so its CPU time and memory in /proc, are the program's.
func (cfg config) command(cpu, name string, args ...string) *exec.Cmd {
	if !cfg.pin {
		return exec.Command(name, args...)
	}
	return exec.Command("taskset", append([]string{"-c", cpu, name}, args...)...)
}

// startServer writes a Caddyfile with site as the body of one site block
// and runs binary on it until the admin endpoint answers.
func startServer(cfg config, binary, name, global, site string) (*server, error) {
	home, err := os.MkdirTemp(cfg.work, name+"-")
	if err != nil {
		return nil, err
	}
	port, admin := freePort(), freePort()
	s := &server{url: fmt.Sprintf("http://127.0.0.1:%d", port), admin: fmt.Sprintf("127.0.0.1:%d", admin), home: home}
	caddyfile := fmt.Sprintf("{\n\tadmin %s\n\tauto_https off\n\tpersist_config off\n\tlog {\n\t\tlevel ERROR\n\t}\n%s}\n\nhttp://127.0.0.1:%d {\n%s\n}\n",
		s.admin, global, port, site)
	config := filepath.Join(home, "Caddyfile")
	if err := os.WriteFile(config, []byte(caddyfile), 0o600); err != nil {
		return nil, err
	}
	if s.log, err = os.Create(filepath.Join(home, "caddy.log")); err != nil {
		return nil, err
	}
	s.cmd = cfg.command(serverCPU, binary, "run", "--config", config, "--adapter", "caddyfile")
	s.cmd.Env = append(os.Environ(), "HOME="+home, "XDG_DATA_HOME="+home+"/data", "XDG_CONFIG_HOME="+home+"/config")
	if cfg.pin && strings.Contains(site, "ledger file") && os.Getenv("GOMAXPROCS") == "" {
		// Pinned, Go gives the process one P, and the file ledger's
		// fdatasync would hold it: the gateway on a file ledger gets a
		// second one, as an operator gives it (docs/ledgers.md). Every
		// other server keeps Go's one; a GOMAXPROCS the bench's own
		// environment sets is kept.
		s.cmd.Env = append(s.cmd.Env, "GOMAXPROCS=2")
	}
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if resp, err := http.Get("http://" + s.admin + "/config/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("%s exited at start:\n%s", name, s.output())
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("%s did not start:\n%s", name, s.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *server) output() string {
	b, _ := os.ReadFile(s.log.Name())
	return string(b)
}

// stop ends the process (SIGTERM, then SIGKILL after 10 s).
func (s *server) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.log.Close()
}

// cpu returns the process's CPU time so far (user + system).
func (s *server) cpu() time.Duration { return processCPU(s.cmd.Process.Pid) }

// peakRSS returns the process's peak resident set size (VmHWM) in bytes.
func (s *server) peakRSS() int64 { return procStatus(s.cmd.Process.Pid, "VmHWM:") }

// rss returns the process's resident set size now (VmRSS) in bytes.
func (s *server) rss() int64 { return procStatus(s.cmd.Process.Pid, "VmRSS:") }

func processCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses.
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks
}

func procStatus(pid int, field string) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// freePort returns a loopback port for a gateway (package ports).
func freePort() int {
	p, err := ports.Free()
	if err != nil {
		panic(err)
	}
	return p
}
