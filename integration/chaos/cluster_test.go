package main

import (
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestProcessPlan(t *testing.T) {
	got := processPlan([]string{faultKill, faultMasterKill, faultMigrateSlot}, []int{3, 2, 1})
	want := []string{faultKill, faultMasterKill, faultMigrateSlot, faultKill, faultMasterKill, faultKill}
	if !slices.Equal(got, want) {
		t.Fatalf("plan %q, want %q", got, want)
	}
	if got := processPlan([]string{faultKill, faultRestart}, []int{0, 0}); len(got) != 0 {
		t.Fatalf("an empty plan has %q", got)
	}
}

func TestBucketSlot(t *testing.T) {
	seen := map[int]bool{}
	for k := range 5000 {
		s := bucketSlot("aa", hex.EncodeToString([]byte{byte(k), byte(k >> 8)}))
		if s%256 != 128 || s < 0 || s >= clusterSlots {
			t.Fatalf("slot %d is no bucket's", s)
		}
		seen[s] = true
	}
	if len(seen) != clusterBuckets {
		t.Fatalf("%d buckets used, want %d", len(seen), clusterBuckets)
	}
}

// lostReservation is a sound run in which bob's first job was executed,
// then lost with the master that acknowledged it, and bob's retry created
// and executed job-b.
func lostReservation() (*evidence, string) {
	ev := sound()
	ev.OnCluster = true
	t0 := ev.Arrivals[2].Start
	lost := "0190aaaa-0000-7000-8000-000000000001"
	ev.Arrivals = append(ev.Arrivals, arrival{Provider: "primary", JobID: lost, Attempt: 1, Owner: "bob", Key: "k-00000",
		Seq: 7, Behaviour: answerFast, Start: t0.Add(-3 * time.Second), End: t0.Add(-3*time.Second + time.Millisecond),
		Executed: true, Status: 200, Answered: true})
	ev.Exchanges = append(ev.Exchanges, exchange{ID: identity{"bob", "k-00000"}, Request: 19,
		Start: t0.Add(-3 * time.Second), End: t0.Add(-3*time.Second + 2*time.Millisecond), Status: 200, JobID: lost,
		Up: &answerBody{Owner: "bob", Key: "k-00000", Job: lost, Attempt: 1, Provider: "primary", Seq: 7, Executed: true}})
	ev.ArrivalsAfter++
	return ev, lost
}

func TestCheckLostReservation(t *testing.T) {
	ev, lost := lostReservation()
	r := check(ev)
	if !slices.Equal(r.Duplicates, []identity{{"bob", "k-00000"}}) {
		t.Errorf("duplicates %v, want bob/k-00000", r.Duplicates)
	}
	for _, want := range []string{"bob/k-00000 was executed 2 times, in 2 jobs", "job " + lost + " (bob/k-00000), which the ledger does not have"} {
		if !mentions(r.Violations, want) {
			t.Errorf("no violation mentions %q; got:\n%s", want, strings.Join(r.Violations, "\n"))
		}
	}
	slot := bucketSlot(hex.EncodeToString(ev.Hasher.Owner("Bearer bob")), hex.EncodeToString(ev.Hasher.Key("k-00000")))
	kill := func(slots [2]int, after time.Duration) []clusterEvent {
		at := ev.Arrivals[3].Start.Add(after)
		return []clusterEvent{{Kind: clusterKill, At: at, Promoted: at.Add(3 * time.Second), End: at.Add(8 * time.Second),
			Node: "127.0.0.1:7001", Slots: [][2]int{slots}}}
	}
	tests := []struct {
		name     string
		cluster  []clusterEvent
		replicas int
		want     string // in every violation's note; "" for none
	}{
		{"the slot's master killed just after", kill([2]int{slot, slot}, 500*time.Millisecond), 0, "without replicas"},
		{"with replicas", kill([2]int{slot, slot}, 500*time.Millisecond), 1, "replication's window does not explain this"},
		{"another master killed", kill([2]int{slot + 1, slot + 1}, 500*time.Millisecond), 0, ""},
		{"the slot's master killed long after", kill([2]int{slot, slot}, 5*time.Second), 0, ""},
		{"the slot's master killed after both executions", kill([2]int{slot, slot}, 3*time.Second+500*time.Millisecond), 0, ""},
		{"no kill", nil, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev.Cluster = tt.cluster
			x := newExplainer(ev, tt.replicas, nil, nil, nil)
			for _, v := range r.Violations {
				note := x.note(v)
				if tt.want == "" && note != "" || !strings.Contains(note, tt.want) {
					t.Errorf("%s\n  noted %q, want %q", v, note, tt.want)
				}
			}
			if n, want := x.afterKill(r.Duplicates), len(r.Duplicates); tt.want != "" && n != want || tt.want == "" && n != 0 {
				t.Errorf("%d duplicates after a kill (want them all: %v)", n, tt.want != "")
			}
		})
	}
}

// TestLedgerDownBySlot: a cluster fault excuses only the jobs of its slots.
func TestLedgerDownBySlot(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &checker{ev: &evidence{OnCluster: true, Cluster: []clusterEvent{
		{Kind: clusterMigration, At: t0, End: t0.Add(time.Second), Slots: [][2]int{{128, 128}}},
	}}}
	if got := c.ledgerDown(128, t0.Add(500*time.Millisecond), t0.Add(600*time.Millisecond)); got != "cluster: slot migrated" {
		t.Errorf("the migrated slot: %q", got)
	}
	if got := c.ledgerDown(384, t0, t0.Add(time.Second)); got != "" {
		t.Errorf("another slot: %q", got)
	}
	if got := c.ledgerDown(128, t0.Add(2*time.Second), t0.Add(3*time.Second)); got != "" {
		t.Errorf("after the migration: %q", got)
	}
}
