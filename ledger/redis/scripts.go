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

// The places of the job hash's fields in jobFields, the order in which
// scripts return them and listings read them; a reply that carries the
// body has it after them (jfBody), as it is read only where needed.
const (
	jfID = iota
	jfOwner
	jfKey
	jfIdent
	jfFP
	jfFPV
	jfFPS
	jfState
	jfVer
	jfBy
	jfRet
	jfCreated
	jfDone
	jfExp
	jfN
	jfStatus
	jfHdr
	jfSize
	jfStored
	jfBody
)

// jobFields names the job hash's fields, each at its place.
var jobFields = []string{
	jfID: "id", jfOwner: "owner", jfKey: "key", jfIdent: "ident", jfFP: "fp", jfFPV: "fpv", jfFPS: "fps",
	jfState: "state", jfVer: "ver", jfBy: "by", jfRet: "ret", jfCreated: "created", jfDone: "done", jfExp: "exp",
	jfN: "n", jfStatus: "status", jfHdr: "hdr", jfSize: "size", jfStored: "stored",
}

// The places of an attempt's fields in attemptFields, the order in which
// scripts return one attempt; the fields from afLT to afLU record the
// reconciler's lookups (lookup.lua), and only an attempt a lookup touched
// has them; afSC is the attempt's scope, absent when it has none.
const (
	afID = iota
	afP
	afS
	afV
	afT0
	afDL
	afT1
	afE
	afRS
	afLT
	afLS
	afLA
	afLN
	afLD
	afLH
	afLU
	afSC
	afCount
)

// attemptFields names an attempt's fields in the attempts hash
// ("<number>:<name>"), each at its place.
var attemptFields = []string{
	afID: "id", afP: "p", afS: "s", afV: "v", afT0: "t0", afDL: "dl", afT1: "t1", afE: "e", afRS: "rs",
	afLT: "lt", afLS: "ls", afLA: "la", afLN: "ln", afLD: "ld", afLH: "lh", afLU: "lu",
	afSC: "sc",
}

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
	for _, c := range [][2]string{
		{"LEASE_EXPIRED", ledger.ReasonLeaseExpired},
		{"LATE_SETTLED", ledger.ReasonLateSettled},
		{"LATE_DEADLINE", ledger.ReasonLateDeadline},
		{"RESOLVED", ledger.ReasonResolved},
	} {
		b.WriteString("local " + c[0] + " = " + strconv.Quote(c[1]) + "\n")
	}
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
