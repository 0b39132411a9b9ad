package fsm

import (
	"fmt"

	"github.com/onejob/onejob/ledger"
)

// OutcomeError maps an outcome name that a transition written in another
// language (plpgsql, Lua) returns to the ledger error it stands for: "ok"
// is nil, and a name that is none of them is an error that names backend
// (the ledger, for messages) and the transition.
func OutcomeError(backend, transition, outcome string) error {
	switch outcome {
	case "ok":
		return nil
	case "not_found":
		return ledger.ErrNotFound
	case "stale":
		return ledger.ErrStale
	case "blocked":
		return ledger.ErrBlocked
	case "completed":
		return ledger.ErrCompleted
	}
	return UnexpectedOutcome(backend, transition, outcome)
}

// UnexpectedOutcome is the error of a transition that answered with an
// outcome it should never return.
func UnexpectedOutcome(backend, transition, outcome string) error {
	return fmt.Errorf("%s: %s returned unexpected outcome %q", backend, transition, outcome)
}
