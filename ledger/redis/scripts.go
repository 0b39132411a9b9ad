package redis

import (
	"embed"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
)

//go:embed scripts/*.lua
var luaFiles embed.FS

// jobFields are the job hash's fields that scripts return and listings read,
// in this order; the body is read only where needed.
var jobFields = []string{
	"id", "owner", "key", "ident", "fp", "fpv", "fps", "state", "ver", "by", "ret",
	"created", "done", "exp", "n", "status", "hdr", "size", "stored",
}

// attemptFields are the names of an attempt's fields in the attempts hash
// ("<number>:<name>"), in the order scripts return one attempt; the
// fields from lt on record the reconciler's lookups (lookup.lua), and only
// an attempt a lookup touched has them.
var attemptFields = []string{"id", "p", "s", "v", "t0", "dl", "t1", "e", "rs", "lt", "ls", "la", "ln", "ld", "lh", "lu"}

// script is a Lua script with its source, which preload sends.
type script struct {
	*redis.Script
	src string
}

// scriptSet holds the transition scripts and find (a read), each lib.lua
// plus its own file.
type scriptSet struct {
	reserve, complete, saveBody, fail, unsent, markUnknown, start, lookup, resolve, sweepScan, sweep, find, purge script
}

// The script sets of a single server (waiters woken by PUBLISH) and of a
// cluster (SPUBLISH, on a shard channel in the slot of the keys).
var (
	plainScripts   = buildScripts("PUBLISH")
	shardedScripts = buildScripts("SPUBLISH")
)

// scriptsFor returns the script set that publishes with publish.
func scriptsFor(publish string) *scriptSet {
	if publish == "SPUBLISH" {
		return &shardedScripts
	}
	return &plainScripts
}

func buildScripts(publish string) scriptSet {
	var b strings.Builder
	quote := func(fields []string) string {
		q := make([]string, len(fields))
		for i, f := range fields {
			q[i] = strconv.Quote(f)
		}
		return strings.Join(q, ", ")
	}
	b.WriteString("local JOB_FIELDS = {" + quote(jobFields) + "}\n")
	b.WriteString("local JOB_FIELDS_BODY = {" + quote(append(jobFields[:len(jobFields):len(jobFields)], "body")) + "}\n")
	b.WriteString("local ATTEMPT_FIELDS = {" + quote(attemptFields) + "}\n")
	b.WriteString("local LEASE_EXPIRED = " + strconv.Quote(ledger.ReasonLeaseExpired) + "\n")
	b.WriteString("local PUBLISH = " + strconv.Quote(publish) + "\n")
	b.WriteString(read("lib.lua"))
	lib := b.String()
	mk := func(name string) script {
		src := lib + "\n-- " + name + "\n" + read(name)
		return script{Script: redis.NewScript(src), src: src}
	}
	return scriptSet{
		reserve:     mk("reserve.lua"),
		complete:    mk("complete.lua"),
		saveBody:    mk("save_body.lua"),
		fail:        mk("fail.lua"),
		unsent:      mk("unsent.lua"),
		markUnknown: mk("mark_unknown.lua"),
		start:       mk("start.lua"),
		lookup:      mk("lookup.lua"),
		resolve:     mk("resolve.lua"),
		sweepScan:   mk("sweep_scan.lua"),
		sweep:       mk("sweep.lua"),
		find:        mk("find.lua"),
		purge:       mk("purge.lua"),
	}
}

func read(name string) string {
	b, err := luaFiles.ReadFile("scripts/" + name)
	if err != nil {
		panic(err) // embedded: cannot happen
	}
	return string(b)
}

func (s scriptSet) all() []script {
	return []script{s.reserve, s.complete, s.saveBody, s.fail, s.unsent, s.markUnknown, s.start, s.lookup, s.resolve, s.sweepScan, s.sweep, s.find, s.purge}
}
