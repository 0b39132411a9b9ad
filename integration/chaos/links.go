package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/onejob/onejob/integration/faultproxy"
)

// Ledger links: every gateway instance reaches its ledger's server (and
// its Redis cache, when it has one) through a fault proxy of its own, so
// that the soak can break one instance's link while the others keep
// theirs.

// ledgerLink is one instance's connection to one server, through a fault
// proxy.
type ledgerLink struct {
	Gateway int
	Name    string // "postgres", "redis" or "cache"
	proxy   *faultproxy.Proxy
}

func (l *ledgerLink) String() string { return fmt.Sprintf("gateway %d's %s link", l.Gateway, l.Name) }

// viaProxy starts a fault proxy toward the server of rawURL and returns it
// with the URL to reach the server through it.
func viaProxy(rawURL string) (*faultproxy.Proxy, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, "", err
	}
	p, err := faultproxy.New(u.Host)
	if err != nil {
		return nil, "", err
	}
	proxied := *u
	proxied.Host = p.Addr()
	return p, proxied.String(), nil
}

// linkEvent is one fault a ledger link's proxy injected.
type linkEvent struct {
	Gateway int
	Link    string
	faultproxy.Event
}

// span is when the fault may have touched a call: from its start to its
// end, or a moment for a drop or a reset.
func (e linkEvent) span() (time.Time, time.Time) {
	if e.End.IsZero() {
		return e.At, e.At
	}
	return e.At, e.End
}

// linkEvents returns every link fault of the run, in time order.
func linkEvents(links []*ledgerLink) []linkEvent {
	var out []linkEvent
	for _, l := range links {
		for _, e := range l.proxy.Log() {
			out = append(out, linkEvent{Gateway: l.Gateway, Link: l.Name, Event: e})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].At.Before(out[b].At) })
	return out
}

// linkPlan is how many faults of each kind the links get over a run.
type linkPlan struct {
	Drops  int           // replies dropped after their command ran
	Delays int           // windows of replies delayed past the client's timeout
	Resets int           // every open connection of a link reset with RST
	Cuts   int           // a link cut for a few seconds
	Delay  time.Duration // how long a delayed reply is held
}

// Link fault kinds, in the plan and in the summary.
const (
	faultDrop  = "lost reply"
	faultDelay = "delayed replies"
	faultReset = "connections reset"
	faultCut   = "ledger unreachable"
)

// dropMarkers are what a dropped reply's command carries, in turn: the
// provider names, which every reservation (primary), failover (fallback)
// and stored answer (the upstream's body names its provider) carries;
// and nothing, for whatever command comes next.
var dropMarkers = []string{"primary", "", "fallback"}

// order spreads the plan's faults evenly and interleaves their kinds.
func (p linkPlan) order() []string {
	type slot struct {
		at   float64
		kind string
	}
	var slots []slot
	for _, k := range []struct {
		kind string
		n    int
	}{{faultDrop, p.Drops}, {faultReset, p.Resets}, {faultDelay, p.Delays}, {faultCut, p.Cuts}} {
		for i := range k.n {
			slots = append(slots, slot{(float64(i) + 0.5) / float64(k.n), k.kind})
		}
	}
	sort.SliceStable(slots, func(a, b int) bool { return slots[a].at < slots[b].at })
	out := make([]string, len(slots))
	for i, s := range slots {
		out[i] = s.kind
	}
	return out
}

// runLinks injects the plan's link faults one at a time, spread over the
// middle of a load of length d (from 10% to 80% of it), so that every one
// has ended, and its repeats and never-sent records had time to go
// through, well before the checks.
func (f *faults) runLinks(ctx context.Context, d time.Duration, plan linkPlan) {
	kinds := plan.order()
	start := time.Now()
	drops := 0
	for i, kind := range kinds {
		at := time.Duration(float64(d) * (0.1 + 0.7*float64(i)/float64(len(kinds))))
		if !sleep(ctx, time.Until(start.Add(at))) {
			return
		}
		switch kind {
		case faultDrop:
			f.dropReply(ctx, dropMarkers[drops%len(dropMarkers)])
			drops++
		case faultDelay:
			l := f.ledgerLink()
			window := 1500 * time.Millisecond
			l.proxy.DelayReplies(plan.Delay, window)
			f.logf("%s: replies delayed by %s for %s", l, plan.Delay, window)
			sleep(ctx, window)
		case faultReset:
			l := f.anyLink()
			n := l.proxy.Reset()
			f.logf("%s: %d connections reset (RST)", l, n)
		case faultCut:
			l := f.ledgerLink()
			down := randDuration(2*time.Second, 4*time.Second)
			l.proxy.Cut()
			f.logf("%s cut for %s", l, down.Round(time.Millisecond))
			sleep(ctx, down)
			l.proxy.Restore()
		}
	}
}

// dropReply arms a random link to drop the reply of the next command
// carrying marker, and waits for it (3 s at most).
func (f *faults) dropReply(ctx context.Context, marker string) {
	l := f.ledgerLink()
	if marker == "" && rand.IntN(3) == 0 {
		l = f.anyLink() // a cache's command, sometimes
	}
	d := l.proxy.DropReply(marker, false)
	t := time.NewTimer(3 * time.Second)
	defer t.Stop()
	select {
	case <-d.Done():
	case <-t.C:
	case <-ctx.Done():
	}
	if !d.Cancel() {
		f.logf("%s: no command carried %q within 3s: no reply dropped", l, marker)
		return
	}
	f.logf("%s: reply lost after its command ran (%s)", l, describeCommand(d.Command(), marker))
}

// describeCommand prints a dropped command briefly: its printable bytes
// around the marker.
func describeCommand(b []byte, marker string) string {
	s := strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '.'
		}
		return r
	}, string(b))
	if marker == "" {
		return fmt.Sprintf("any command: %q", s[:min(len(s), 48)])
	}
	return fmt.Sprintf("carrying %q: %q", marker, s)
}

// ledgerLink picks the ledger link of a random instance.
func (f *faults) ledgerLink() *ledgerLink {
	var ls []*ledgerLink
	for _, l := range f.links {
		if l.Name != "cache" {
			ls = append(ls, l)
		}
	}
	return ls[rand.IntN(len(ls))]
}

// anyLink picks any link of a random instance: its ledger's or its cache's.
func (f *faults) anyLink() *ledgerLink { return f.links[rand.IntN(len(f.links))] }

// linkCounts sums the links' faults by kind, as the proxies counted them:
// on every link, and on the caches' links alone; and the connections the
// resets closed.
func linkCounts(events []linkEvent) (all, cache map[string]int, conns int) {
	all, cache = map[string]int{}, map[string]int{}
	for _, e := range events {
		name := kindName(e.Kind)
		all[name]++
		if e.Link == "cache" {
			cache[name]++
		}
		conns += e.Conns
	}
	return all, cache, conns
}

// kindName names a fault proxy's kind of fault for the summary.
func kindName(kind string) string {
	switch kind {
	case faultproxy.KindDrop:
		return faultDrop
	case faultproxy.KindDelay:
		return faultDelay
	case faultproxy.KindReset:
		return faultReset
	case faultproxy.KindCut:
		return faultCut
	}
	return kind
}
