// Package notify is for ledger backends, onejob's and third parties':
// it wakes the requests that wait for a job (Ledger.Wait) when the job
// changes, in this process or in another that shares the ledger.
//
// Waiters holds one channel per waited job and wakes it (Wake); a
// Subscriber runs a backend's notification session (a PostgreSQL LISTEN, a
// Redis subscription: a Session) and wakes its Waiters from it, hears
// purges (PurgeNotice) for the Watchers that keep answers in memory, and
// lets the waiters of one job share their reads of it (Subscriber.Wait).
// WaitSettled is the read loop of a backend without notifications of its
// own.
package notify
