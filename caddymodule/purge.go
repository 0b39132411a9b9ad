package caddymodule

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/sealed"
)

// adminPurgePath purges one owner's jobs: POST {"owner": "<value>"}.
const adminPurgePath = "/idempotency/purge"

// maxPurgeBody bounds a purge request.
const maxPurgeBody = 64 << 10

// purgeJSON is the answer to a purge.
type purgeJSON struct {
	// Removed counts the settled jobs removed, with their answers.
	Removed int `json:"removed"`
	// Kept counts the owner's pending and unknown jobs, which a purge
	// never removes (settle them, resolve, then purge again), and answers
	// still streaming (purge again once they end).
	Kept int `json:"kept"`
	// Ledgers counts the ledgers purged (one per ledger, cache and owner
	// secret that a handler uses).
	Ledgers int `json:"ledgers"`
	// Unsupported counts the ledgers that cannot purge (a third party's
	// that does not implement ledger.Purger).
	Unsupported int `json:"unsupported"`
}

// handlePurge serves POST /idempotency/purge: it removes the settled jobs
// of one owner, given as the handlers resolve it (the value of their
// owner setting; by default "user:<id>" or "authorization:<header>"),
// from every ledger a handler of the running config uses, hashed as each
// handler hashes owners (its owner_secret), and from the replay caches in
// front of them.
func (a *adminAPI) handlePurge(w http.ResponseWriter, r *http.Request) error {
	if !allowMethod(w, r, http.MethodPost) {
		return nil
	}
	var req struct {
		Owner string `json:"owner"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxPurgeBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	if err == nil && dec.Decode(&struct{}{}) != io.EOF {
		err = errors.New("trailing data after the JSON object")
	}
	if err != nil {
		writeProblem(w, http.StatusBadRequest, problemInvalidRequest, "Invalid request", "invalid JSON body: "+err.Error(), "")
		return nil
	}
	if req.Owner == "" {
		writeProblem(w, http.StatusBadRequest, problemInvalidRequest, "Invalid request", `"owner" is required`, "")
		return nil
	}
	var out purgeJSON
	for _, s := range listStacks() {
		p, ok := s.ledger.(ledger.Purger)
		if !ok {
			out.Unsupported++
			continue
		}
		owner := s.hasher.Owner(req.Owner)
		release := s.hold()
		st, err := p.Purge(r.Context(), owner)
		release()
		if errors.Is(err, errCannotPurge) {
			out.Unsupported++
			continue
		}
		if err != nil {
			a.unavailable(w, err, "")
			return nil
		}
		out.Removed += st.Removed
		out.Kept += st.Kept
		out.Ledgers++
		// The owner's hash, never the owner.
		a.log().Info("owner purged", zap.String("owner_hash", hex.EncodeToString(owner)),
			zap.Int("removed", st.Removed), zap.Int("kept", st.Kept))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// sealing returns l as an operator's answer reaches it: sealed with the
// keys of the handlers that use it, if they seal answers.
func sealing(l ledger.Ledger) ledger.Ledger {
	if s, ok := l.(*shared); ok {
		if keys := storeKeys(s.key); keys != nil {
			return sealed.New(l, keys)
		}
	}
	return l
}

// purgeCommand is "caddy idempotency purge --owner <owner>".
func purgeCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "purge --owner <owner>",
		Short: "Removes one owner's settled jobs and their stored answers from every ledger",
		Long: `Removes the completed and failed jobs of one owner, with their stored
answers, from every ledger (and replay cache) the running config's
handlers use. The owner is given as the handlers resolve it: the value of
their owner setting, or by default user:<id> or authorization:<header
value>. Pending and unknown jobs are kept and counted: settle them with
resolve, then purge again. A purged key is a new intent.`,
		Args: cobra.NoArgs,
		RunE: cliRun(func(ctx context.Context, c *adminClient, cmd *cobra.Command, _ []string) error {
			owner, _ := cmd.Flags().GetString("owner")
			if owner == "" {
				return errors.New("purge needs --owner")
			}
			req := map[string]string{"owner": owner}
			if wantJSON(cmd) {
				return c.printJSON(ctx, cmd.OutOrStdout(), http.MethodPost, adminPurgePath, req)
			}
			var out purgeJSON
			if err := c.call(ctx, http.MethodPost, adminPurgePath, req, &out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Removed %d settled jobs of the owner from %d ledgers.\n", out.Removed, out.Ledgers)
			if out.Kept > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "Kept %d pending or unknown jobs: settle them (caddy idempotency resolve), then purge again.\n", out.Kept)
			}
			if out.Unsupported > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "%d ledgers cannot purge: their jobs were not touched.\n", out.Unsupported)
			}
			return nil
		}),
	}
	c.Flags().String("owner", "", "The owner, as the handlers resolve it")
	return c
}

// errCannotPurge: the ledger module's ledger does not implement
// ledger.Purger.
var errCannotPurge = errors.New("this ledger cannot purge")

// Purge purges the pooled ledger, when it can (errCannotPurge otherwise).
func (s *shared) Purge(ctx context.Context, ownerHash []byte) (ledger.PurgeStats, error) {
	p, ok := s.Ledger.(ledger.Purger)
	if !ok {
		return ledger.PurgeStats{}, fmt.Errorf("%w: %T", errCannotPurge, s.Ledger)
	}
	return p.Purge(ctx, ownerHash)
}

// Interface guards
var _ ledger.Purger = (*shared)(nil)
