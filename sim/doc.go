// Package sim explores fault schedules of the idempotent request flow: a
// schedule, drawn from a seed, runs several gateway instances (the real
// proxy.Middleware, with its never-sent queue, and proxy.Reconciler) over
// one shared ledger, each through a link that refuses calls, loses
// replies after the call ran, delays replies past deadlines or goes down
// for a while; two routes whose providers share names; providers that
// answer, refuse, hang, break the connection after acting, answer after
// the deadline, fail at the TLS layer after the request was written and
// answer lookups; clients that retry with jitter, send duplicates in
// flight or no key; an operator who cancels and purges; the ledger's
// clock off the gateways'; kill -9 of a gateway (the file ledger
// reopened). After every schedule one checker tests the invariants of
// docs/reliability.md.
//
// It lives beside proxy and drives the middleware through its exported
// API only, as caddymodule does, so what it checks is what ships; time is
// virtual (testing/synctest), so a schedule of minutes runs in
// milliseconds. With the integration tag the same schedules run on the
// PostgreSQL and Redis ledgers in real time, compressed (servers_test.go):
// a server cannot join a bubble. The tests are the package: see
// sim_test.go.
package sim
