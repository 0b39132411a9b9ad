// Package sim explores fault schedules of the idempotent request flow: a
// schedule, drawn from a seed, runs several gateway instances (the real
// proxy.Middleware, with its never-sent queue and replay memory) over one
// shared ledger, each through a link that refuses calls, loses replies
// after the call ran, delays replies past deadlines or goes down for a
// while; providers that answer, refuse, hang, break the connection after
// acting or answer after the deadline; clients that retry with jitter and
// send duplicates in flight. After every schedule one checker tests the
// invariants of docs/reliability.md.
//
// It lives beside proxy and drives the middleware through its exported
// API only, as caddymodule does, so what it checks is what ships; time is
// virtual (testing/synctest), so a schedule of minutes runs in
// milliseconds. With the integration tag the same schedules run on the
// PostgreSQL and Redis ledgers in real time, compressed (servers_test.go):
// a server cannot join a bubble. The tests are the package: see
// sim_test.go.
package sim
