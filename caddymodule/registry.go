package caddymodule

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// The provider registry lists the providers of every provisioned handler in
// this process, for the admin API, with each one's latest probe, which
// failover and hedging consult. A provider is known by its handler's scope
// and its name: two handlers' providers of the same name are two entries.
// Handlers of an old and a new config overlap during a reload, and a
// handler keeps its scope across reloads, so an entry is counted, not
// owned: it is listed once, and disappears when its last registration is
// gone.
var providerRegistry = struct {
	sync.Mutex
	byKey map[providerKey]*providerEntry
	seq   uint64 // order of first registration
}{byKey: make(map[providerKey]*providerEntry)}

// providerKey is a provider as the registry knows it.
type providerKey struct {
	scope, name string
}

type providerEntry struct {
	refs  int
	seq   uint64
	probe *ProbeResult
}

// ProbeResult is the latest probe of a provider (docs/contract.md, section 9).
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
	// Scope is the scope of the handler that declares the provider.
	Scope string
	// Name is the provider's name in its handler.
	Name string
	// Probe is the provider's latest probe result.
	Probe *ProbeResult
}

// registerProviders records a provisioned handler's providers, in order,
// under the handler's scope. The returned function removes this
// registration; call it on Cleanup. Calling it more than once has no
// further effect.
func registerProviders(scope string, names []string) (unregister func()) {
	names = uniqueNames(names)
	providerRegistry.Lock()
	for _, n := range names {
		k := providerKey{scope, n}
		e := providerRegistry.byKey[k]
		if e == nil {
			providerRegistry.seq++
			e = &providerEntry{seq: providerRegistry.seq}
			providerRegistry.byKey[k] = e
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
				k := providerKey{scope, n}
				e := providerRegistry.byKey[k]
				if e == nil {
					continue
				}
				if e.refs--; e.refs <= 0 {
					delete(providerRegistry.byKey, k)
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
func setProbe(scope, name string, r ProbeResult) {
	providerRegistry.Lock()
	defer providerRegistry.Unlock()
	if e := providerRegistry.byKey[providerKey{scope, name}]; e != nil {
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
	items := make([]item, 0, len(providerRegistry.byKey))
	for k, e := range providerRegistry.byKey {
		st := ProviderStatus{Scope: k.scope, Name: k.name}
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
func probeOf(scope, name string) *ProbeResult {
	providerRegistry.Lock()
	defer providerRegistry.Unlock()
	e := providerRegistry.byKey[providerKey{scope, name}]
	if e == nil || e.probe == nil {
		return nil
	}
	r := *e.probe
	return &r
}

// probedEligible says which of a handler's providers (by index into names)
// may take a failover or a hedge: those whose latest probe, in the
// handler's scope, passed.
func probedEligible(scope string, names []string) func(int) bool {
	names = slices.Clone(names)
	return func(i int) bool {
		r := probeOf(scope, names[i])
		return r != nil && r.OK
	}
}
