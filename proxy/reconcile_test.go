package proxy

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
	"github.com/onejob/onejob/ledger/memory"
)

// absentLookup is a lookup of provider "pay" that answers 404 and
// records the jobs it was asked about.
func absentLookup(looked *[]string) Lookup {
	return Lookup{Provider: "pay", Send: func(_ context.Context, a *ledger.Attempt) (int, http.Header, []byte, error) {
		*looked = append(*looked, a.JobID)
		return http.StatusNotFound, nil, nil, nil
	}}
}

// TestReconcilerLooksUpOnlyItsScope: two handlers on one ledger both call
// their provider "pay"; a reconciler asks its own "pay" only about its own
// scope's attempts, never about the other scope's, nor about one recorded
// without a scope, whose upstream it cannot know.
func TestReconcilerLooksUpOnlyItsScope(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := memory.New()
		var looked []string
		rc := &Reconciler{Ledger: l, Scope: "site", Lookups: []Lookup{absentLookup(&looked)}, Every: 10 * time.Second,
			Timeout: time.Second, Logger: zap.NewNop()}
		mine, theirs, unscoped := ledgertest.UnknownJob(t, l, "site"), ledgertest.UnknownJob(t, l, "site#2"), ledgertest.UnknownJob(t, l, "")
		time.Sleep(2 * time.Minute)
		rc.Round(context.Background())
		if want := []string{mine.Job.ID}; !slices.Equal(looked, want) {
			t.Errorf("looked up %v, want %v", looked, want)
		}
		for name, r := range map[string]ledger.Reservation{"site#2": theirs, "unscoped": unscoped} {
			if j, _ := l.Job(context.Background(), r.Job.ID); j.State != ledger.JobUnknown || j.Attempts[0].Lookup != nil {
				t.Errorf("the %s job: %s, lookups %+v; want unknown, never looked up", name, j.State, j.Attempts[0].Lookup)
			}
		}
	})
}

func TestLookupBackoff(t *testing.T) {
	for tries, want := range map[int]time.Duration{0: 30 * time.Second, 1: time.Minute, 3: 4 * time.Minute, 7: time.Hour, 100: time.Hour} {
		if got := lookupBackoff(30*time.Second, tries); got != want {
			t.Errorf("backoff after %d tries: %v, want %v", tries, got, want)
		}
	}
}

// blackHole is a ledger whose link swallows the calls named in hole: they
// never answer, until their context ends. Its listings leave the attempts
// out, as a listing may, so that the reconciler reads each job.
type blackHole struct {
	ledger.Ledger
	hole string
}

func (b *blackHole) swallow(ctx context.Context, op string) error {
	if op != b.hole {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (b *blackHole) Jobs(ctx context.Context, q ledger.JobQuery) (ledger.JobPage, error) {
	if err := b.swallow(ctx, "jobs"); err != nil {
		return ledger.JobPage{}, err
	}
	page, err := b.Ledger.Jobs(ctx, q)
	for i, j := range page.Jobs {
		page.Jobs[i] = &ledger.Job{ID: j.ID, State: j.State}
	}
	return page, err
}

func (b *blackHole) Job(ctx context.Context, id string) (*ledger.Job, error) {
	if err := b.swallow(ctx, "job"); err != nil {
		return nil, err
	}
	return b.Ledger.Job(ctx, id)
}

func (b *blackHole) ClaimLookup(ctx context.Context, ref ledger.AttemptRef, holder string, lease time.Duration) (*ledger.Job, error) {
	if err := b.swallow(ctx, "claim"); err != nil {
		return nil, err
	}
	return b.Ledger.ClaimLookup(ctx, ref, holder, lease)
}

func (b *blackHole) SettleLookup(ctx context.Context, ref ledger.AttemptRef, holder string, r ledger.LookupResult) (*ledger.Job, error) {
	if err := b.swallow(ctx, "settle"); err != nil {
		return nil, err
	}
	return b.Ledger.SettleLookup(ctx, ref, holder, r)
}

// TestReconcilerLedgerCallsAreBounded: a ledger link that black-holes any
// one of the reconciler's calls does not hold its round forever (on the
// virtual clock of synctest, where a round that never ends is a deadlock);
// the attempt stays unknown for a later round. With no hole, the same round
// settles it: the setup reaches every call.
func TestReconcilerLedgerCallsAreBounded(t *testing.T) {
	for _, hole := range []string{"", "jobs", "job", "claim", "settle"} {
		t.Run("hole="+hole, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memory.New()
				r := ledgertest.UnknownJob(t, mem, "")
				time.Sleep(2 * time.Minute) // past the attempt's deadline
				var looked []string
				rc := &Reconciler{Ledger: &blackHole{Ledger: mem, hole: hole}, Lookups: []Lookup{absentLookup(&looked)},
					Every: 10 * time.Second, Timeout: time.Second, Logger: zap.NewNop()}
				rc.Round(context.Background())
				j, err := mem.Job(context.Background(), r.Job.ID)
				if err != nil {
					t.Fatal(err)
				}
				want, wantLooked := ledger.JobUnknown, 0
				switch hole {
				case "":
					want, wantLooked = ledger.JobFailed, 1
				case "settle":
					wantLooked = 1
				}
				if j.State != want || len(looked) != wantLooked {
					t.Errorf("job %s after %d lookups, want %s after %d", j.State, len(looked), want, wantLooked)
				}
			})
		})
	}
}

// TestLookupFoundWhileAnotherAttemptMayHaveAnswered: a hedged job's two
// attempts are unknown and either may have answered its client. A lookup
// that finds the first acted does not complete the job while the second
// is unknown (its answer may be the one the client got); once the
// second's lookup says it never acted, the first's answer completes it.
func TestLookupFoundWhileAnotherAttemptMayHaveAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		l := memory.New()
		p := ledger.ReserveParams{JobID: ledger.NewID(), OwnerHash: []byte("o"), KeyHash: []byte("k"),
			Fingerprint: []byte("f"), FingerprintVersion: 1, Retention: 24 * time.Hour, Attempt: ledger.NewAttempt("pay", time.Minute)}
		p.Attempt.Scope = "site"
		r, err := l.Reserve(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		next := ledger.NewAttempt("pay", time.Minute)
		next.Scope = "site"
		second, err := l.Hedge(ctx, r.Attempt.Ref(), next)
		if err != nil {
			t.Fatal(err)
		}
		j, _ := l.Job(ctx, r.Job.ID)
		for _, a := range j.Attempts {
			if err := l.MarkUnknown(ctx, a.Ref(), "attempt_timeout"); err != nil {
				t.Fatal(err)
			}
		}
		secondStatus := http.StatusServiceUnavailable
		send := func(_ context.Context, a *ledger.Attempt) (int, http.Header, []byte, error) {
			if a.Number == second.Number {
				return secondStatus, nil, nil, nil
			}
			return http.StatusCreated, nil, []byte(`{"charge":"ch_1"}`), nil
		}
		mw, err := New(Config{Ledger: l, Scope: "site", Providers: []Provider{{Name: "pay"}}})
		if err != nil {
			t.Fatal(err)
		}
		rc := mw.Reconciler([]Lookup{{Provider: "pay", Send: send}})
		rc.Logger = zap.NewNop()

		time.Sleep(2 * time.Minute) // past both deadlines
		rc.Round(ctx)
		if j, _ := l.Job(ctx, r.Job.ID); j.State != ledger.JobUnknown {
			t.Fatalf("the first attempt's lookup found an answer while the second was unknown: job %s", j.State)
		}
		secondStatus = http.StatusNotFound
		for range 4 { // past both attempts' lookup backoff
			time.Sleep(10 * time.Minute)
			rc.Round(ctx)
		}
		j, _ = l.Job(ctx, r.Job.ID)
		if j.State != ledger.JobCompleted || j.Response == nil || string(j.Response.Body) != `{"charge":"ch_1"}` ||
			j.Attempts[1].State != ledger.AttemptFailed {
			t.Errorf("once the second never acted: job %s, attempts %+v", j.State, j.Attempts)
		}
	})
}
