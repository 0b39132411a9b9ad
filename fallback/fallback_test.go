package fallback

import (
	"errors"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	f := DefaultFailoverOn()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name   string
		a      Answer
		want   Verdict
		reason string
	}{
		{"success", Answer{Status: 200}, Result, ""},
		{"created", Answer{Status: 201}, Result, ""},
		{"client error is a result", Answer{Status: 400}, Result, ""},
		{"server error is a result", Answer{Status: 500}, Result, ""},
		{"503 is definitive", Answer{Status: 503}, Failed, "503"},
		{"429 is definitive", Answer{Status: 429}, Failed, "429"},
		{"dial error", Answer{Err: boom, Connect: true}, Failed, ReasonConnect},
		{"error after sending", Answer{Err: boom}, Unknown, "upstream error: boom"},
		{"499 from below", Answer{Status: 499}, Unknown, "request cancelled below the gateway (499)"},
		{"cut short", Answer{Status: 200, Cut: true}, Unknown, "answer cut short"},
		{"cut 503 is still unknown", Answer{Status: 503, Cut: true}, Unknown, "answer cut short"},
		{"nothing at all", Answer{}, Unknown, "no answer"},
		{"connect flag without error", Answer{Status: 200, Connect: true}, Result, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, r := f.Classify(tc.a)
			if v != tc.want || r != tc.reason {
				t.Errorf("Classify(%+v) = %v %q, want %v %q", tc.a, v, r, tc.want, tc.reason)
			}
		})
	}
	custom, err := ParseFailoverOn([]string{"502"})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := custom.Classify(Answer{Status: 503}); v != Result {
		t.Errorf("503 without failover_on 503 = %v, want result", v)
	}
	if v, _ := custom.Classify(Answer{Status: 502}); v != Failed {
		t.Errorf("502 with failover_on 502 = %v, want failed", v)
	}
	if v, _ := custom.Classify(Answer{Err: boom, Connect: true}); v != Failed {
		t.Errorf("a connect error is definitive even when not named: %v", v)
	}
}

func TestParseFailoverOn(t *testing.T) {
	f, err := ParseFailoverOn([]string{"connect_error", "contract", "503", "429"})
	if err != nil || !f.ConnectError || !f.Contract || !f.Statuses[503] || !f.Statuses[429] || f.Statuses[500] {
		t.Errorf("parsed %+v, %v", f, err)
	}
	for _, bad := range []string{"teapot", "99", "600", ""} {
		if _, err := ParseFailoverOn([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if !(FailoverOn{}).IsZero() || DefaultFailoverOn().IsZero() {
		t.Error("IsZero")
	}
}

func TestFailover(t *testing.T) {
	p := Policy{Providers: []string{"a", "b", "c"}, FailoverOn: DefaultFailoverOn()}
	if i, ok := p.Failover(0, "503"); !ok || i != 1 {
		t.Errorf("after a: %d %v", i, ok)
	}
	if i, ok := p.Failover(1, ReasonConnect); !ok || i != 2 {
		t.Errorf("after b: %d %v", i, ok)
	}
	if _, ok := p.Failover(2, "503"); ok {
		t.Error("failover past the last provider")
	}
	p.FailoverOn.ConnectError = false
	if _, ok := p.Failover(0, ReasonConnect); ok {
		t.Error("failover on a connect error that failover_on does not name")
	}
	p.Eligible = func(i int) bool { return i != 1 }
	if i, ok := p.Failover(0, "503"); !ok || i != 2 {
		t.Errorf("an ineligible provider is skipped: %d %v", i, ok)
	}
	p.Eligible = func(int) bool { return false }
	if _, ok := p.Failover(0, "503"); ok {
		t.Error("failover to an ineligible provider")
	}
}

func TestHedge(t *testing.T) {
	p := Policy{Providers: []string{"a", "b"}}
	if _, ok := p.Hedge(0); ok {
		t.Error("hedge without hedge_after")
	}
	p.HedgeAfter = time.Second
	if i, ok := p.Hedge(0); !ok || i != 1 {
		t.Errorf("hedge from a: %d %v", i, ok)
	}
	if _, ok := p.Hedge(1); ok {
		t.Error("hedge past the last provider")
	}
	p.Eligible = func(i int) bool { return i == 0 }
	if _, ok := p.Hedge(0); ok {
		t.Error("hedge to an ineligible provider")
	}
	if p.Index("b") != 1 || p.Index("zzz") != 0 {
		t.Error("Index")
	}
}
