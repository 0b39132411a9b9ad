package redis

import (
	"reflect"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

// completedReply is a script's reply for a completed job with two
// attempts, the second with a reconciler's lookup, as go-redis hands it
// over: the job's fields in jobFields order (nil where absent), then its
// attempts hash as a flat array.
func completedReply() (fields, attempts []any) {
	fields = []any{
		"0190a1b2-c3d4-7e5f-8a9b-0123456789ab", "owner-hash", "key-hash", "6964656e74", "fp", "2", "json",
		"completed", "3", "attempt-2", "86400000000", "1764806400000000", "1764806401000000",
		"1764892801000000", "2", "201", `{"Content-Type":["application/json"]}`, "13", "1",
	}
	attempts = []any{
		"1:id", "attempt-1", "1:p", "primary", "1:s", "unknown", "1:v", "1", "1:t0", "1764806400000000",
		"1:dl", "1764806400500000", "1:t1", "1764806400500000", "1:e", ledger.ReasonLeaseExpired,
		"2:id", "attempt-2", "2:p", "fallback", "2:s", "succeeded", "2:v", "2", "2:t0", "1764806400600000",
		"2:dl", "1764806401600000", "2:t1", "1764806401000000", "2:e", "", "2:rs", "1",
		"2:lt", "2", "2:ls", "404", "2:la", "1764806400900000", "2:ld", "1",
	}
	return fields, attempts
}

// A script's reply reads as the job it describes: every field in its
// place, the body where the reply carries it, the attempts in order with
// their lookups.
func TestScriptJob(t *testing.T) {
	at := func(us int64) time.Time { return time.UnixMicro(us).UTC() }
	fields, attempts := completedReply()
	want := &ledger.Job{
		ID: "0190a1b2-c3d4-7e5f-8a9b-0123456789ab", OwnerHash: []byte("owner-hash"), KeyHash: []byte("key-hash"),
		Fingerprint: []byte("fp"), FingerprintVersion: 2, FingerprintScheme: "json", State: ledger.JobCompleted,
		Version: 3, CompletedBy: "attempt-2", Retention: 24 * time.Hour, CreatedAt: at(1764806400000000),
		CompletedAt: at(1764806401000000), ExpiresAt: at(1764892801000000),
		Response: &ledger.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Size: 13, Stored: true},
		Attempts: []ledger.Attempt{
			{ID: "attempt-1", JobID: "0190a1b2-c3d4-7e5f-8a9b-0123456789ab", Number: 1, Provider: "primary",
				State: ledger.AttemptUnknown, JobVersion: 1, StartedAt: at(1764806400000000), Deadline: at(1764806400500000),
				FinishedAt: at(1764806400500000), Error: ledger.ReasonLeaseExpired},
			{ID: "attempt-2", JobID: "0190a1b2-c3d4-7e5f-8a9b-0123456789ab", Number: 2, Provider: "fallback",
				State: ledger.AttemptSucceeded, JobVersion: 2, StartedAt: at(1764806400600000), Deadline: at(1764806401600000),
				FinishedAt: at(1764806401000000), Resend: true,
				Lookup: &ledger.Lookup{Tries: 2, LastStatus: 404, LastAt: at(1764806400900000), Settled: true}},
		},
	}
	j, err := scriptJob("test", fields, attempts)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(j, want) {
		t.Fatalf("got  %+v\nwant %+v", j, want)
	}
	want.Response.Body = []byte(`{"id":"ch_1"}`)
	if j, err = scriptJob("test", append(fields, `{"id":"ch_1"}`), attempts); err != nil || !reflect.DeepEqual(j, want) {
		t.Fatalf("with the body: %v\ngot  %+v\nwant %+v", err, j, want)
	}
	if _, err := scriptJob("test", append([]any{nil}, fields[1:]...), attempts); err == nil {
		t.Error("a reply without the job's id read as a job")
	}
}

// BenchmarkScriptJob measures reading a script's reply into a job, which
// every transition on the Redis ledger does once.
//
//	go test -run '^$' -bench ScriptJob -benchmem ./ledger/redis
func BenchmarkScriptJob(b *testing.B) {
	fields, attempts := completedReply()
	for b.Loop() {
		if _, err := scriptJob("bench", fields, attempts); err != nil {
			b.Fatal(err)
		}
	}
}
