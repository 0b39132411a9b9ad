package caddymodule

import (
	"slices"
	"sync"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/sealed"
	"github.com/onejob/onejob/proxy"
)

// stack is a provisioned handler's ledger as the admin API needs it to
// purge an owner and to seal an operator's answer: the ledger (with its
// cache in front, if any), how the handler hashes owners, and its keys.
// The admin API is provisioned apart from the handlers, so handlers
// register their stacks here, and take them off on Cleanup.
type stack struct {
	store  string        // the ledger's pool key
	cache  string        // the cache's pool key; "" when none
	ledger ledger.Ledger // the cache in front of the ledger, or the ledger; answers unopened
	secret string        // the handler's owner_secret
	hasher proxy.Hasher
	keys   *sealed.Keyring // nil when answers are stored in clear
	hold   func() func()   // keeps the ledger (and cache) open while used
}

// same reports whether s and o purge the same jobs: one store, one cache,
// one owner hash.
func (s *stack) same(o *stack) bool {
	return s.store == o.store && s.cache == o.cache && s.secret == o.secret
}

var stacks struct {
	sync.Mutex
	list []*stack // in registration order
}

// registerStack lists s until the returned function is called.
func registerStack(s *stack) (unregister func()) {
	stacks.Lock()
	stacks.list = append(stacks.list, s)
	stacks.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			stacks.Lock()
			defer stacks.Unlock()
			stacks.list = slices.DeleteFunc(stacks.list, func(x *stack) bool { return x == s })
		})
	}
}

// listStacks returns the registered stacks, oldest first, without two
// that purge the same jobs.
func listStacks() []*stack {
	stacks.Lock()
	defer stacks.Unlock()
	var out []*stack
	for _, s := range stacks.list {
		if !slices.ContainsFunc(out, s.same) {
			out = append(out, s)
		}
	}
	return out
}

// storeKeys returns the keys of the first registered handler that seals
// the answers of the ledger in the pool under store, or nil.
func storeKeys(store string) *sealed.Keyring {
	stacks.Lock()
	defer stacks.Unlock()
	for _, s := range stacks.list {
		if s.store == store && s.keys != nil {
			return s.keys
		}
	}
	return nil
}

// poolKeys names the pool entries of a handler's ledger module: its
// ledger's, and its cache's when one stands in front.
func poolKeys(m LedgerModule) (store, cache string) {
	if f, ok := m.(*cacheFront); ok {
		store, _ = poolKeys(f.truth)
		return store, f.key
	}
	if k, ok := m.(interface{ poolKey() string }); ok {
		return k.poolKey(), ""
	}
	return "", ""
}
