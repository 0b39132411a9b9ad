package caddymodule

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// The provider registry lists the providers of every provisioned handler in
// this process, for the admin API. Handlers of an old and a new config
// overlap during a reload, so a name is counted, not owned: it is listed
// once, and disappears when its last registration is gone.
var providerRegistry = struct {
	sync.Mutex
	byName map[string]*providerEntry
	seq    uint64 // order of first registration
}{byName: make(map[string]*providerEntry)}

type providerEntry struct {
	refs  int
	seq   uint64
	probe *ProbeResult
}

// ProbeResult is the latest probe of a provider (SPEC section 4).
type ProbeResult struct {
	// OK is true when the probe's answer passed the contract.
	OK bool
	// Error says why it did not; empty when OK.
	Error string
	// At is when the probe ran.
	At time.Time
	// Status is the probe answer's status; 0 when none came.
	Status int
}

// ProviderStatus is a provider as the admin API lists it. Probe is nil
// while the provider has no probe result.
type ProviderStatus struct {
	Name  string
	Probe *ProbeResult
}

// registerProviders records a provisioned handler's providers, in order.
// The returned function removes this registration; call it on Cleanup.
// Calling it more than once has no further effect.
func registerProviders(names []string) (unregister func()) {
	names = uniqueNames(names)
	providerRegistry.Lock()
	for _, n := range names {
		e := providerRegistry.byName[n]
		if e == nil {
			providerRegistry.seq++
			e = &providerEntry{seq: providerRegistry.seq}
			providerRegistry.byName[n] = e
		}
		e.refs++
	}
	providerRegistry.Unlock()

	var once sync.Once
	return func() {
		once.Do(func() {
			providerRegistry.Lock()
			defer providerRegistry.Unlock()
			for _, n := range names {
				e := providerRegistry.byName[n]
				if e == nil {
					continue
				}
				if e.refs--; e.refs <= 0 {
					delete(providerRegistry.byName, n)
				}
			}
		})
	}
}

// uniqueNames returns names without repeats, in first-seen order, so that
// one handler holds one reference to each of its providers.
func uniqueNames(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// setProbe records the latest probe result of a registered provider. A
// result for a provider no handler registers (a probe loop outliving its
// config) is dropped.
func setProbe(name string, r ProbeResult) {
	providerRegistry.Lock()
	defer providerRegistry.Unlock()
	if e := providerRegistry.byName[name]; e != nil {
		e.probe = &r
	}
}

// listProviders returns the registered providers in the order they were
// first registered, each with a copy of its latest probe result.
func listProviders() []ProviderStatus {
	type item struct {
		seq uint64
		st  ProviderStatus
	}
	providerRegistry.Lock()
	items := make([]item, 0, len(providerRegistry.byName))
	for n, e := range providerRegistry.byName {
		st := ProviderStatus{Name: n}
		if e.probe != nil {
			p := *e.probe
			st.Probe = &p
		}
		items = append(items, item{e.seq, st})
	}
	providerRegistry.Unlock()
	slices.SortFunc(items, func(a, b item) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]ProviderStatus, len(items))
	for i, it := range items {
		out[i] = it.st
	}
	return out
}

// probeOf returns a copy of the provider's latest probe result, or nil.
func probeOf(name string) *ProbeResult {
	providerRegistry.Lock()
	defer providerRegistry.Unlock()
	e := providerRegistry.byName[name]
	if e == nil || e.probe == nil {
		return nil
	}
	r := *e.probe
	return &r
}
