package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	const stat = `cpu  1000 20 300 90000 50 4 6 700 100 0
cpu0 500 10 150 45000 25 2 3 350 50 0
cpu1 500 10 150 45000 25 2 3 350 50 0
intr 123 4 5
ctxt 999
processes 42
`
	busy, cores := parseStat(strings.NewReader(stat))
	// user, nice, system, irq, softirq of the "cpu" line: not idle,
	// iowait or steal, and guest only inside user.
	if want := (1000 + 20 + 300 + 4 + 6) * time.Second / procTicks; busy != want {
		t.Errorf("busy %v, want %v", busy, want)
	}
	if cores != 2 {
		t.Errorf("cores %d, want 2", cores)
	}
}

func TestPrintShares(t *testing.T) {
	us := time.Microsecond
	results := []result{
		{name: "plain_reverse_proxy", rps: 10000, cpu: 100 * us, shares: shares{machine: 190 * us, load: 40 * us, upstream: 30 * us, busy: 0.95, cores: 2}},
		// 0.6x of 10,000 req/s on 2 cores: 333.3 us a request; all but
		// the server took 260: the server could take 73.3.
		{name: "near", rps: 4000, cpu: 240 * us, shares: shares{machine: 500 * us, load: 40 * us, upstream: 30 * us, busy: 1, cores: 2},
			baseline: "plain_reverse_proxy", target: target{ratio: 0.6}},
		// All but the server took 400, more than 333.3.
		{name: "far", rps: 3000, cpu: 100 * us, shares: shares{machine: 500 * us, load: 40 * us, upstream: 30 * us, busy: 0.75, cores: 2},
			baseline: "plain_reverse_proxy", target: target{ratio: 0.6}},
		// No ratio target: no budget.
		{name: "cpu_only", rps: 3000, cpu: 100 * us, shares: shares{machine: 500 * us, cores: 2},
			baseline: "plain_reverse_proxy", target: target{cpuRatio: 1.15}},
	}
	var b strings.Builder
	printShares(&b, results)
	out := b.String()
	lines := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			lines[f[0]] = l
		}
	}
	for name, want := range map[string][]string{
		"plain_reverse_proxy": {"190.0", "95%", "100.0", "40.0", "30.0", " 20.0", "10526"},
		"near":                {"500.0", "190.0", "4000", "<= 73.3 us (took 240.0)"},
		"far":                 {"nothing: all but the server take 400.0 us of the 333.3 a request may cost at 6000 req/s"},
	} {
		l, ok := lines[name]
		if !ok {
			t.Errorf("no line for %s in:\n%s", name, out)
			continue
		}
		for _, w := range want {
			if !strings.Contains(l, w) {
				t.Errorf("%s: %q lacks %q", name, l, w)
			}
		}
	}
	if l := lines["cpu_only"]; strings.Contains(l, "<=") || strings.Contains(l, "nothing") {
		t.Errorf("a target without a ratio got a budget: %q", l)
	}
}
