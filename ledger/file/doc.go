// Package file is the embedded Ledger: durable across restarts with no
// server to run, for one gateway process on one machine.
//
// The jobs live on disk, in a Pebble database in the ledger's directory
// (github.com/cockroachdb/pebble/v2): memory holds Pebble's block cache
// and memtables, of sizes that do not grow with the jobs, and the answers
// replayed lately. No change is acknowledged, and no reader sees a job,
// before Pebble's log holds it on disk: every write is a batch committed
// with an fsync, which concurrent batches share (Pebble's commit pipeline
// groups them). Opening the ledger reads no job.
//
// Keys: k<owner, key> holds the record (package record) of the job of an
// owner's key, so that a reservation, and a replay of a stored answer,
// reads one key; j<id> names the key of job id, for the reads by id;
// x<expiry><id> lists the jobs by when their retention ends, so a sweep
// reads only what expires; o<id> lists the jobs not at rest (pending,
// unknown, failed, or an answer still streaming), so that listing and
// counting them, and applying their leases, never walks the completed
// ones; n counts the jobs. A transition locks its job's key, reads the
// job, applies the rules of package fsm, and writes the job and its index
// entries in one batch. An owner's keys are one range of keys: a purge
// reads those only.
//
// A directory of the previous release (a log and snapshots, package wal)
// is read into a new database at the first start and kept beside it as
// <path>.wal; a bbolt file of the release before that is migrated too.
package file
