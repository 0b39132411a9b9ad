// Package proxy is the idempotent request flow as plain net/http middleware.
// It knows nothing of Caddy: the next handler returns an error, as Caddy
// handlers do, and Caddy's specifics come in through Config hooks.
//
// The files follow one request:
//
//   - middleware.go: Middleware and its ServeHTTP, which hands the request
//     to the steps below in turn;
//   - admit.go: the key, the owner and the body (key.go parses keys and
//     hashes owners; the fingerprint package hashes the request);
//   - reserve.go: the reservation in the ledger, whose answer says who is
//     first;
//   - dispatch.go: what that answer means for this client: run, replay,
//     wait (prefer.go) or say why not (problem.go);
//   - run.go: a job's attempts against its providers, with failover and
//     hedging (the fallback package decides), and the client's wait for
//     them; pool.go runs them;
//   - try.go: one attempt, from sending the request to the end of its
//     answer (capture.go records it as it streams, live.go lets duplicates
//     join it);
//   - cas.go: the answer offered to the job by compare-and-swap; a loser is
//     discarded;
//   - reply.go: the answer to the client, fresh or replayed.
//
// Beside the flow: ledgercall.go bounds and repeats every ledger call;
// unsent.go records the attempts reserved but never sent; resend.go and
// reconcile.go settle attempts whose outcome is unknown (a re-send to a
// deduplicating provider, a lookup); status.go answers GET
// status_path/<key>.
package proxy
