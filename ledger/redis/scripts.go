package redis

import (
	"context"
	"embed"
	"fmt"
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
// ("<number>:<name>"), in the order scripts return one attempt.
var attemptFields = []string{"id", "p", "s", "v", "t0", "dl", "t1", "e", "rs"}

// script is a Lua script with its source, which preload sends.
type script struct {
	*redis.Script
	src string
}

// scriptSet holds the transition scripts and find (a read), each lib.lua
// plus its own file.
type scriptSet struct {
	reserve, complete, saveBody, fail, unsent, markUnknown, start, resolve, sweepScan, sweep, find, purge script
}

var scripts = buildScripts()

func buildScripts() scriptSet {
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
	return []script{s.reserve, s.complete, s.saveBody, s.fail, s.unsent, s.markUnknown, s.start, s.resolve, s.sweepScan, s.sweep, s.find, s.purge}
}

// preload loads every script into the server's script cache in one round
// trip, so that each transition is then a single EVALSHA. (Script.Run still
// falls back to EVAL if the cache was flushed since, e.g. by a restart.)
// It sends SCRIPT LOAD itself: redis.Script.Load in a pipeline would record
// the digest before the server answered, as empty.
func preload(ctx context.Context, c *redis.Client) error {
	all := scripts.all()
	cmds := make([]*redis.StringCmd, len(all))
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, s := range all {
			cmds[i] = p.ScriptLoad(ctx, s.src)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i, s := range all {
		if got := cmds[i].Val(); got != s.Hash() {
			return fmt.Errorf("script digest %s, server says %s", s.Hash(), got)
		}
	}
	return nil
}
