package record

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

func codecJob() *ledger.Job {
	at := time.Date(2026, 12, 2, 15, 4, 5, 123456789, time.UTC)
	return &ledger.Job{
		ID: "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", OwnerHash: []byte{1, 2, 3}, KeyHash: []byte{4, 5},
		Fingerprint: []byte{6}, FingerprintVersion: 2, FingerprintScheme: `{"body":"json","exclude":["/ts"]}`,
		State: ledger.JobCompleted, Version: 3,
		CompletedBy: "a2", Retention: 24 * time.Hour, CreatedAt: at, CompletedAt: at.Add(time.Second),
		ExpiresAt: at.Add(25 * time.Hour),
		Response: &ledger.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}, "X-Two": {"a", ""}},
			Body: []byte(`{"id":"ch_1"}`), Size: 13, Stored: true},
		Attempts: []ledger.Attempt{
			{ID: "a1", JobID: "j", Number: 1, Provider: "primary", State: ledger.AttemptUnknown, JobVersion: 1,
				StartedAt: at, Deadline: at.Add(time.Minute), Error: "attempt_timeout"},
			{ID: "a2", JobID: "j", Number: 2, Provider: "fallback", State: ledger.AttemptSucceeded, JobVersion: 1,
				StartedAt: at, Deadline: at.Add(time.Minute), FinishedAt: at.Add(time.Second), Resend: true},
		},
	}
}

// equalJobs compares jobs field by field, times by instant.
func equalJobs(t *testing.T, got, want *ledger.Job) {
	t.Helper()
	norm := func(j *ledger.Job) *ledger.Job {
		c := *j
		for _, p := range []*time.Time{&c.CreatedAt, &c.CompletedAt, &c.ExpiresAt} {
			if !p.IsZero() {
				*p = p.UTC()
			}
		}
		c.Attempts = append([]ledger.Attempt(nil), j.Attempts...)
		for i := range c.Attempts {
			a := &c.Attempts[i]
			for _, p := range []*time.Time{&a.StartedAt, &a.Deadline, &a.FinishedAt} {
				if !p.IsZero() {
					*p = p.UTC()
				}
			}
			if a.Lookup != nil {
				l := *a.Lookup
				for _, p := range []*time.Time{&l.LastAt, &l.NextAt, &l.Until} {
					if !p.IsZero() {
						*p = p.UTC()
					}
				}
				a.Lookup = &l
			}
		}
		return &c
	}
	if g, w := norm(got), norm(want); !reflect.DeepEqual(g, w) {
		t.Fatalf("decoded %+v\nwant    %+v", g, w)
	}
}

// TestCodecFormat1 reads a record of format 1, written by the release
// before jobs had a fingerprint scheme and attempts a resend flag (this
// record is that release's encoding of codecJob, with one header).
func TestCodecFormat1(t *testing.T) {
	const v1 = "012430313933613162322d633364342d376535662d386139622d3063316432653366346135620301020302040501060209636f6d706c65746564060261328080f89492a52701aafcdb9ac084bced3101aaa4b2d4c784bced3101aafc98bb98fbe4ed31019203010c436f6e74656e742d5479706501106170706c69636174696f6e2f6a736f6e010d7b226964223a2263685f31227d1a0102026131016a02077072696d61727907756e6b6e6f776e0201aafcdb9ac084bced3101aadc969fff87bced31000f617474656d70745f74696d656f7574026132016a040866616c6c6261636b097375636365656465640201aafcdb9ac084bced3101aadc969fff87bced3101aaa4b2d4c784bced3100"
	raw, err := hex.DecodeString(v1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := codecJob()
	want.FingerprintVersion, want.FingerprintScheme = 1, ""
	want.Response.Header = map[string][]string{"Content-Type": {"application/json"}}
	for i := range want.Attempts {
		want.Attempts[i].Resend = false
	}
	equalJobs(t, got, want)
}

func TestCodecRoundTrip(t *testing.T) {
	for name, j := range map[string]*ledger.Job{
		"completed": codecJob(),
		"pending":   {ID: "p", OwnerHash: []byte{1}, KeyHash: []byte{2}, State: ledger.JobPending, Version: 1, CreatedAt: time.Unix(1, 0)},
		"not stored": func() *ledger.Job {
			j := codecJob()
			j.Response = &ledger.Response{Status: 200, Size: -1}
			return j
		}(),
		"looked up": func() *ledger.Job {
			j := codecJob()
			at := j.CreatedAt.Add(time.Hour)
			j.Attempts[0].Lookup = &ledger.Lookup{Tries: 2, LastStatus: 503, LastAt: at, NextAt: at.Add(time.Minute),
				Holder: "r1", Until: at.Add(time.Second)}
			j.Attempts[1].Lookup = &ledger.Lookup{Tries: 1, LastStatus: 200, LastAt: at, Settled: true, Holder: "r2"}
			return j
		}(),
		"scoped": func() *ledger.Job {
			j := codecJob()
			j.Attempts[0].Scope, j.Attempts[1].Scope = "srv0", "srv0#2"
			j.Attempts[1].Lookup = &ledger.Lookup{Tries: 1, LastStatus: 404, Settled: true, Holder: "r1"}
			return j
		}(),
		"empty body": func() *ledger.Job {
			j := codecJob()
			j.Response = &ledger.Response{Status: 204, Body: []byte{}, Stored: true}
			return j
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Decode(Encode(j))
			if err != nil {
				t.Fatal(err)
			}
			equalJobs(t, got, j)
		})
	}
}

// A job no lookup touched is written in format 2, which gateways from
// before lookups read; one with a lookup in format 3; one with a scoped
// attempt in format 4.
func TestCodecOldestFormat(t *testing.T) {
	j := codecJob()
	if f := Encode(j)[0]; f != recordV2 {
		t.Errorf("format %d without lookups, want %d", f, recordV2)
	}
	j.Attempts[1].Lookup = &ledger.Lookup{Tries: 1}
	if f := Encode(j)[0]; f != recordV3 {
		t.Errorf("format %d with a lookup, want %d", f, recordV3)
	}
	j.Attempts[0].Scope = "srv0"
	if f := Encode(j)[0]; f != recordV4 {
		t.Errorf("format %d with a scope, want %d", f, recordV4)
	}
}

// Records written by earlier releases are JSON.
func TestCodecReadsJSONRecords(t *testing.T) {
	j := codecJob()
	v, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(v)
	if err != nil {
		t.Fatal(err)
	}
	equalJobs(t, got, j)
}

func TestCodecRefusesCorruptRecords(t *testing.T) {
	v := Encode(codecJob())
	for _, bad := range [][]byte{nil, {0x03}, v[:len(v)-1], append(append([]byte(nil), v...), 0), {recordV1, 0xff}} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("Decode(%x) accepted a corrupt record", bad)
		}
	}
}

func FuzzDecodeJob(f *testing.F) {
	f.Add(Encode(codecJob()))
	f.Add([]byte(`{"ID":"x"}`))
	f.Fuzz(func(t *testing.T, v []byte) {
		j, err := Decode(v)
		if err != nil || v[0] == '{' {
			return
		}
		// What decodes is what encodes back to the same job.
		again, err := Decode(Encode(j))
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		equalJobs(t, again, j)
	})
}

// TestEncodeIsStable: a job encodes to the same bytes every time, however
// its headers' map is walked, so that a ledger can tell a change from none
// by its record.
func TestEncodeIsStable(t *testing.T) {
	h := map[string][]string{}
	for i := range 20 {
		h[fmt.Sprintf("X-H%d", i)] = []string{fmt.Sprint(i)}
	}
	j := &ledger.Job{ID: "j", State: ledger.JobCompleted, Response: &ledger.Response{Status: 200, Header: h, Stored: true}}
	first := Encode(j)
	for range 20 {
		if !bytes.Equal(Encode(j), first) {
			t.Fatal("two encodings of one job differ")
		}
	}
}
