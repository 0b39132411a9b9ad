// Package redis is a Ledger on Redis, for many gateway instances sharing one
// Redis server or one Redis Cluster. Every transition is one Lua script run
// with EVALSHA: one round trip, atomic on the server, with deadlines and
// expiry judged by the server's clock (TIME inside the script, never the
// gateway's). Waiters are woken through pub/sub on one subscription per
// Ledger (on a cluster, sharded pub/sub: one connection per master).
//
// The scripts (scripts/*.lua, each run with the shared scripts/lib.lua)
// implement the rules of ledger/internal/fsm, and every transition is
// idempotent by the ids the caller chose: a script applied twice has the
// effect of once and answers as the first time. The client never re-sends
// a command on its own (MaxRetries -1), and scripts go out as commands
// that go-redis's cluster client does not re-send after a network error
// either (onceCmd), though it follows MOVED and ASK: a script whose reply
// was lost is repeated, if at all, by the caller.
//
// # Keyspace
//
// Every key starts with Options.Prefix (default "onejob:") and lives in a
// bucket; <b> below is the bucket's key prefix. On a single server there is
// one bucket and <b> is the prefix itself: the keyspace of every earlier
// release, unchanged, so that a ledger they wrote reads on and gateways of
// both releases can share one during an upgrade. On Redis Cluster there are
// 64 buckets and <b> is the prefix followed by the bucket's hash tag,
// "{j18958}" for bucket 0 (bucketTags: each tag hashes to the middle of
// its bucket's 1/64 of the slots, so the buckets divide evenly among masters
// that own ranges of slots). A job lives in the bucket of its identity
// (CRC-32 of the identity below, modulo 64), with its identity key and its
// entries in the bucket's indexes: every script and every MULTI touches one
// slot. The prefix must not contain braces on a cluster.
//
//	<b>k:<hex owner hash>:<hex key hash>   string: the id of the job that
//	                                       holds the identity (owner, key)
//	<b>j:<job id>                          hash: the job (id, owner, key,
//	                                       ident, fp, fpv, fps (scheme),
//	                                       state, ver, by, ret, created,
//	                                       done, exp, n) and
//	                                       its answer (status, hdr as JSON,
//	                                       body, size, stored)
//	<b>a:<job id>                          hash: the job's attempts, fields
//	                                       "<number>:<name>" with names id,
//	                                       p (provider), s (state), v (job
//	                                       version), t0, dl (deadline), t1
//	                                       (finished), e (error), rs ("1"
//	                                       for a re-send: Ledger.Resend),
//	                                       and, once a reconciler's lookup
//	                                       touched the attempt, lt (tries),
//	                                       ls (last status), la (last at),
//	                                       ln (next at), ld ("1": a lookup
//	                                       settled it), lh (holder), lu
//	                                       (the holder's lease's end;
//	                                       absent once released)
//	<b>idx                                 sorted set, score 0: the bucket's
//	                                       job ids; UUIDv7 ids sort by
//	                                       creation, so listing is
//	                                       ZREVRANGEBYLEX, merged over the
//	                                       buckets (walk)
//	<b>leases                              sorted set: job id, scored by the
//	                                       earliest deadline of its starting
//	                                       attempts (for the sweeper)
//	<b>expiry                              sorted set: "<job id>|<hex owner
//	                                       hash>:<hex key hash>", scored by
//	                                       the job's expiry (for the sweeper)
//	<b>jobs                                channel: the id of every job of
//	                                       the bucket whose state changed
//	                                       (PUBLISH; on a cluster a shard
//	                                       channel, SPUBLISH)
//	<b>ack                                 string "1", written after each
//	                                       transition when
//	                                       Options.Replicas is set, just
//	                                       before WAIT (ack.go)
//
// A job id names no bucket: the ledger remembers the bucket of every job a
// reply showed it (the gateway's transitions follow its own reservation),
// and otherwise asks every bucket's index for the id, in one pipeline (a
// round trip per master), as the admin API's reads by id may need.
//
// Times are microseconds since the Unix epoch by the server's clock. The
// identity key is the uniqueness constraint: the reserve script creates a
// job only while it names none (or names one that expired), so two
// reservations of one key can never both create a job.
//
// Retention: when a job completes or fails, its j: and a: keys get a
// PEXPIREAT at the end of its retention and it enters the expiry index.
// Every script also checks the expiry itself, so an expired job counts as
// absent at once. The sweeper (Sweep) removes expired jobs from the
// indexes and deletes their identity key unless a new job took it; a
// reservation of the same key replaces an expired job in place, with the
// job id that reservation chose. Pending and unknown jobs never expire; re-opening a failed job
// removes its expiry.
//
// Leases: a starting attempt whose deadline passed reads as unknown at once.
// Transition scripts record it so before they decide (fsm.ApplyLeases);
// reads (Job, Jobs, Wait, Find) apply it in Go with the server's time read
// in the same MULTI or script; Sweep records it for jobs nobody touches.
//
// # Deployment limits
//
// A single Redis server, version 5 or newer (tested with 7.0), optionally
// with replicas; or Redis Cluster, version 7 or newer (sharded pub/sub),
// tested with three masters and three replicas and slots migrated under
// it. Scripts name the keys they touch in KEYS, computed in Go, except
// reserve and find (the read of a job by owner and key), which follow the
// identity key to the job it names (j: and a: of that job id, in the same
// bucket) to answer in one round trip.
//
// The promise of no duplicate execution is only as strong as the server's
// persistence: with appendonly off, with appendfsync other than always (or
// everysec, which can lose the last second), with an eviction policy other
// than noeviction, or across a failover to an asynchronous replica, a
// reservation that was acknowledged can be lost and the same key executed
// again. Options.Replicas closes part of the failover window: a transition
// answers only once that many replicas hold its writes (WAIT), which
// survive a failover to one of them. Ledger.CheckDurability reports such
// settings (on a cluster, of every master, and masters whose clocks differ
// by more than a second); the gateway warns at start.
package redis
