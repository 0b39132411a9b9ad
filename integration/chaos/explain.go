package main

import (
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"time"
)

// On Redis Cluster a master acknowledges a write before its replica has
// it (replication is asynchronous), so a master killed at the wrong moment
// takes acknowledged writes with it: the replica promoted in its place
// never saw them. A reservation lost that way lets a retry create the job
// again and run it a second time; a lost completion leaves a job whose
// answer a client already got running, then unknown. The ledger's
// replicas setting (WAIT) closes that window. The soak reports every such
// violation as any other, and says next to it which master kill preceded
// it: the kill of a master that served the slot of the violation's intent
// while that intent had requests or attempts in flight. That is an
// explanation, never an excuse: the violation stays one, and the run
// fails.

// lostWindow is how long before a master's kill a write it acknowledged
// may not have reached its replica: far more than replication takes on
// loopback, as a busy machine schedules late.
const lostWindow = time.Second

// explainer attributes violations to master kills.
type explainer struct {
	ev       *evidence
	replicas int
	ids      map[string]identity         // job id → intent, from the ledger, the upstreams' and the clients' records
	spans    map[identity][][2]time.Time // when each intent had requests or attempts in flight
	execs    map[identity][]time.Time    // when the upstream began executing each intent, in order
	owners   map[string]bool
}

var identityPattern = regexp.MustCompile(`\b([a-z]+)/([a-z]-[0-9]+)\b`)

// newExplainer indexes the run's evidence, with the deduplicating route's
// jobs and exchanges.
func newExplainer(ev *evidence, replicas int, dedupJobs map[string]*adminJob, dedupEx []exchange, dedupIDs []identity) *explainer {
	x := &explainer{ev: ev, replicas: replicas, ids: map[string]identity{}, spans: map[identity][][2]time.Time{},
		execs: map[identity][]time.Time{}, owners: map[string]bool{}}
	byHash := map[string]identity{}
	for _, id := range append(slices.Clone(ev.IDs), dedupIDs...) {
		x.owners[id.Owner] = true
		byHash[hex.EncodeToString(ev.Hasher.Owner("Bearer "+id.Owner))+"/"+hex.EncodeToString(ev.Hasher.Key(id.Key))] = id
	}
	for _, jobs := range []map[string]*adminJob{ev.Jobs, dedupJobs} {
		for _, j := range jobs {
			if id, ok := byHash[j.OwnerHash+"/"+j.KeyHash]; ok {
				x.ids[j.ID] = id
			}
		}
	}
	for _, a := range ev.Arrivals {
		id := identity{Owner: a.Owner, Key: a.Key}
		if a.JobID != "" {
			x.ids[a.JobID] = id
		}
		x.spans[id] = append(x.spans[id], [2]time.Time{a.Start, a.End})
		if a.Executed {
			x.execs[id] = append(x.execs[id], a.Start)
		}
	}
	for _, ts := range x.execs {
		slices.SortFunc(ts, time.Time.Compare)
	}
	for _, ex := range [][]exchange{ev.Exchanges, dedupEx} {
		for _, e := range ex {
			if e.JobID != "" {
				x.ids[e.JobID] = e.ID
			}
			x.spans[e.ID] = append(x.spans[e.ID], [2]time.Time{e.Start, e.End})
		}
	}
	return x
}

// slot returns the cluster slot of an intent's job.
func (x *explainer) slot(id identity) int {
	return bucketSlot(hex.EncodeToString(x.ev.Hasher.Owner("Bearer "+id.Owner)), hex.EncodeToString(x.ev.Hasher.Key(id.Key)))
}

// intents returns the intents a violation names: by owner and key, or by
// the id of one of their jobs.
func (x *explainer) intents(v string) []identity {
	var out []identity
	for _, m := range identityPattern.FindAllStringSubmatch(v, -1) {
		if id := (identity{Owner: m[1], Key: m[2]}); x.owners[m[1]] && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	for _, jid := range jobIDPattern.FindAllString(v, -1) {
		if id, ok := x.ids[jid]; ok && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// busy reports whether an intent had a request or an attempt in flight
// between from and to.
func (x *explainer) busy(id identity, from, to time.Time) bool {
	for _, s := range x.spans[id] {
		if !s[0].After(to) && !s[1].Before(from) {
			return true
		}
	}
	return false
}

// killBefore returns the master kill that may have taken an intent's
// acknowledged writes with it: a kill of the master that served its slot
// while it had requests or attempts in flight, in the lostWindow before;
// and, when the upstream executed the intent more than once, a kill
// between the first execution (give or take the window: a reservation
// acknowledged before the kill may be forwarded just after) and the last,
// as a lost write can only have caused the executions after it.
func (x *explainer) killBefore(id identity) *clusterEvent {
	slot := x.slot(id)
	ex := x.execs[id]
	for i := range x.ev.Cluster {
		k := &x.ev.Cluster[i]
		if k.Kind != clusterKill || !k.holds(slot) || !x.busy(id, k.At.Add(-lostWindow), k.At) {
			continue
		}
		if len(ex) > 1 && (ex[0].After(k.At.Add(lostWindow)) || ex[len(ex)-1].Before(k.At)) {
			continue
		}
		return k
	}
	return nil
}

// note returns what precedes violation v, "" when no master kill does.
func (x *explainer) note(v string) string {
	for _, id := range x.intents(v) {
		k := x.killBefore(id)
		if k == nil {
			continue
		}
		why := "without replicas, writes it had acknowledged but not yet sent to its replica were lost with it"
		if x.replicas > 0 {
			why = fmt.Sprintf("yet with replicas %d every write it acknowledged was on a replica: replication's window does not explain this", x.replicas)
		}
		return fmt.Sprintf("follows the kill of master %s at %s: slot %d of %s was on it, and %s had requests or attempts in flight in the %s before; %s",
			k.Node, k.At.Format("15:04:05.000"), x.slot(id), id, id, lostWindow, why)
	}
	return ""
}

// afterKill counts the intents of ids that a master kill may have touched.
func (x *explainer) afterKill(ids []identity) int {
	n := 0
	for _, id := range ids {
		if x.killBefore(id) != nil {
			n++
		}
	}
	return n
}
