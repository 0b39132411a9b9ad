package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/onejob/onejob/ledger"
)

// errLookupsUnbuilt: this backend's lookup transitions are being built
// (issue 19); until then a reconciler here settles nothing.
var errLookupsUnbuilt = errors.New("postgres ledger: lookups are not built yet")

// ClaimLookup implements ledger.Ledger.
func (l *Ledger) ClaimLookup(context.Context, ledger.AttemptRef, string, time.Duration) (*ledger.Job, error) {
	return nil, errLookupsUnbuilt
}

// SettleLookup implements ledger.Ledger.
func (l *Ledger) SettleLookup(context.Context, ledger.AttemptRef, string, ledger.LookupResult) (*ledger.Job, error) {
	return nil, errLookupsUnbuilt
}
