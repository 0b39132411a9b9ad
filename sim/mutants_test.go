package sim

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/onejob/onejob/ledger"
)

// Each mutant breaks one transition of a ledger the way a bug would; the
// checker must catch it within a few hundred schedules, under the
// invariant the break offends.
type (
	// reopensUnknown cancels an unknown job and reserves it again: a job a
	// provider may have acted for runs twice.
	reopensUnknown struct{ ledger.Ledger }
	// failsUnknown records a failure where the outcome is unknown.
	failsUnknown struct{ ledger.Ledger }
	// altersAnswer stores an answer other than the provider's.
	altersAnswer struct{ ledger.Ledger }
	// hidesWin reports a won compare-and-swap as lost.
	hidesWin struct{ ledger.Ledger }
	// promisesLease tells the gateway of a lease the ledger never gave.
	promisesLease struct{ ledger.Ledger }
	// dropsUnsent acknowledges never-sent attempts without recording them.
	dropsUnsent struct{ ledger.Ledger }
	// mergesOwners reserves every owner's key in one namespace.
	mergesOwners struct{ ledger.Ledger }
	// forgetsCompletion acknowledges a completion it never recorded.
	forgetsCompletion struct{ ledger.Ledger }
	// remembersAnswers keeps, per instance, the answers it reserved and
	// replays them when the store has none: a replay memory a purge does
	// not reach.
	remembersAnswers struct {
		ledger.Ledger
		mu   *sync.Mutex
		done map[string]ledger.Reservation
	}
)

func (m reopensUnknown) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	r, err := m.Ledger.Reserve(ctx, p)
	if err == nil && r.Outcome == ledger.Unknown {
		if _, err := m.Ledger.Resolve(ctx, r.Job.ID, ledger.Resolution{Cancel: true}); err == nil {
			return m.Ledger.Reserve(ctx, p)
		}
	}
	return r, err
}

func (m failsUnknown) MarkUnknown(ctx context.Context, ref ledger.AttemptRef, reason string) error {
	_, err := m.Ledger.Fail(ctx, ref, reason, nil)
	return err
}

func (m altersAnswer) Complete(ctx context.Context, ref ledger.AttemptRef, resp ledger.Response) (ledger.Completion, error) {
	resp.Body = append(slices.Clone(resp.Body), ' ')
	resp.Size = int64(len(resp.Body))
	return m.Ledger.Complete(ctx, ref, resp)
}

func (m hidesWin) Complete(ctx context.Context, ref ledger.AttemptRef, resp ledger.Response) (ledger.Completion, error) {
	c, err := m.Ledger.Complete(ctx, ref, resp)
	c.Won = false
	return c, err
}

func (m promisesLease) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	lease := p.Attempt.Lease
	p.Attempt.Lease = 0
	r, err := m.Ledger.Reserve(ctx, p)
	if r.Attempt != nil {
		a := *r.Attempt
		a.Deadline = a.Deadline.Add(lease)
		r.Attempt = &a
	}
	return r, err
}

func (m dropsUnsent) Unsent(context.Context, ledger.AttemptRef) error { return nil }

func (m mergesOwners) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	p.OwnerHash = []byte("everyone")
	return m.Ledger.Reserve(ctx, p)
}

func (m mergesOwners) Find(ctx context.Context, _, key []byte) (*ledger.Job, error) {
	return m.Ledger.Find(ctx, []byte("everyone"), key)
}

func (m forgetsCompletion) Complete(ctx context.Context, ref ledger.AttemptRef, resp ledger.Response) (ledger.Completion, error) {
	j, err := m.Ledger.Job(ctx, ref.JobID)
	return ledger.Completion{Won: true, Job: j}, err
}

func (m remembersAnswers) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	r, err := m.Ledger.Reserve(ctx, p)
	k := string(p.OwnerHash) + "\x00" + string(p.KeyHash)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case err != nil:
	case r.Outcome == ledger.Done:
		m.done[k] = r
	case r.Outcome == ledger.Created && m.done[k].Job != nil:
		return m.done[k], nil
	}
	return r, err
}

// TestCheckerCatchesBrokenTransitions runs the first schedules against
// each mutant until the checker reports the invariant it offends.
func TestCheckerCatchesBrokenTransitions(t *testing.T) {
	for _, m := range []struct {
		invariant string
		mutate    func(ledger.Ledger) ledger.Ledger
	}{
		{"once", func(l ledger.Ledger) ledger.Ledger { return reopensUnknown{l} }},
		{"acted", func(l ledger.Ledger) ledger.Ledger { return failsUnknown{l} }},
		{"stored", func(l ledger.Ledger) ledger.Ledger { return altersAnswer{l} }},
		{"replayed", func(l ledger.Ledger) ledger.Ledger { return hidesWin{l} }},
		{"lease", func(l ledger.Ledger) ledger.Ledger { return promisesLease{l} }},
		{"unsent", func(l ledger.Ledger) ledger.Ledger { return dropsUnsent{l} }},
		{"owner", func(l ledger.Ledger) ledger.Ledger { return mergesOwners{l} }},
		{"durable", func(l ledger.Ledger) ledger.Ledger { return forgetsCompletion{l} }},
		{"purged", func(l ledger.Ledger) ledger.Ledger {
			return remembersAnswers{Ledger: l, mu: new(sync.Mutex), done: map[string]ledger.Reservation{}}
		}},
	} {
		t.Run(m.invariant, func(t *testing.T) {
			const limit = 300
			for seed := int64(1); seed <= limit; seed++ {
				var w *world
				synctest.Test(t, func(t *testing.T) { w = run(t, virtual, stores[0], m.mutate, seed) })
				for _, v := range w.check() {
					if strings.HasPrefix(v, m.invariant+":") {
						t.Logf("seed %d: %s", seed, v)
						return
					}
				}
			}
			t.Errorf("no schedule of %d broke %q", limit, m.invariant)
		})
	}
}
