package postgres

import (
	"context"
	"regexp"
	"strings"
	"testing"
)

// released holds the checksum of functions.sql for each functions version
// a release shipped. Gateways of different releases share a ledger, each
// calling the functions of its own version, so a version's text never
// changes once released.
var released = map[int]string{
	3:  "38194d1bcedd3e8b5e51ec31899d6eaf7ac0bd78b8de7c31ab02f89a3d0b42c7",
	4:  "e9018e160f6dc7c6a4b540ca538789388f124d263b3121fc34fc35200c57aa91",
	5:  "f30f86b5ab51d07a6c8c2a06c62e9da1f37b64e39f4a6d1df8a0e9568e9e6ee9",
	6:  "4374db376de6e4c210d96d351e9240e91c7b48953b0c979d1a102b79cfeb4870",
	7:  "4279791cd980031d3ef43daa1287dfde120cf16fd83d8606fe93bc340d00050a",
	8:  "7c279f2af0e43f94a94be8e1d0781bb03d2dfd09387dc883650f401cc3e095ed",
	9:  "eebefb627f4a18f0b22cbd2826d2ff903b6f6164a82d23f1994c63d26d7d0dae",
	10: "03b369d9b35e25915b76b287d25671bcccd153cfec4a800836aaef688f2ce14d",
	11: "ea4a879edf67e6ba8f5ced25c9ff0345dc0e941bac58fb099eff45f1582efee5",
	12: "4eeabb342857537db40a1ada8641e750545a765a1e724a418995f3bcf652301e",
}

// quotedFn is the functions' schema of schema onejob as functions.sql
// names it.
var quotedFn = `"` + functionsSchema("onejob") + `"`

func TestFunctionsVersion(t *testing.T) {
	sum, ok := released[functionsVersion]
	if !ok {
		t.Fatalf("functions version %d has no recorded checksum: record %s", functionsVersion, functionsChecksum)
	}
	if sum != functionsChecksum {
		t.Fatalf("functions.sql changed under version %d (checksum %s, recorded %s): running gateways of that version "+
			"would keep the old text; raise functionsVersion, record the new checksum here, and update the "+
			"functions' schema named in integration/bench/ledger.pgbench", functionsVersion, functionsChecksum, sum)
	}
}

// TestFunctionsSQL: the placeholders are all replaced, and every call from
// one function to another names the functions' schema, so that it reaches
// this version whatever the caller's search_path (pgbench, an operator).
func TestFunctionsSQL(t *testing.T) {
	sql := functionsSQL("onejob")
	if strings.Contains(sql, "{{") {
		t.Fatalf("a placeholder is left in functions.sql: %q", regexp.MustCompile(`\{\{\w*\}\}`).FindString(sql))
	}
	if !strings.Contains(sql, `pg_notify('onejob.jobs', `) {
		t.Errorf("notifications do not go to the channel onejob.jobs")
	}
	created := regexp.MustCompile(`(?m)^CREATE FUNCTION (\S+?)\.(\w+)\(`).FindAllStringSubmatch(sql, -1)
	if len(created) == 0 {
		t.Fatal("no functions found")
	}
	for _, c := range created {
		if c[1] != quotedFn {
			t.Errorf("function %s is created in %s, not in the functions' schema", c[2], c[1])
		}
		calls := regexp.MustCompile(`([\w".]*)\b`+c[2]+`\(`).FindAllStringSubmatch(sql, -1)
		for _, call := range calls {
			if call[1] != quotedFn+"." {
				t.Errorf("%s is called as %q: name the functions' schema", c[2], call[0])
			}
		}
	}
}

func TestSchemaNameLength(t *testing.T) {
	long := strings.Repeat("s", maxIdentifier-len(functionsSchema(""))+1)
	_, err := Open(context.Background(), "postgres://127.0.0.1:1/none", Options{Schema: long})
	if err == nil || !strings.Contains(err.Error(), "too long") {
		t.Errorf("Open with a %d-byte schema: err = %v, want too long", len(long), err)
	}
	if fn := functionsSchema(long[1:]); len(fn) != maxIdentifier {
		t.Errorf("functions schema %q is %d bytes", fn, len(fn))
	}
}

// TestCompleteLeavesNotifyingToAnnounce: complete, the transition of every
// request, does not notify inside its transaction, where the notification
// queue's lock would be held until its commit is flushed and completions
// would commit one at a time; announce notifies, without waiting for the
// flush.
func TestCompleteLeavesNotifyingToAnnounce(t *testing.T) {
	sql := functionsSQL("onejob")
	body := func(name string) string {
		start := strings.Index(sql, "CREATE FUNCTION "+quotedFn+"."+name+"(")
		if start < 0 {
			t.Fatalf("no function %s", name)
		}
		end := strings.Index(sql[start:], "END $$;")
		if end < 0 {
			t.Fatalf("function %s has no end", name)
		}
		return sql[start : start+end]
	}
	if c := body("complete"); strings.Contains(c, "notify_job(") {
		t.Error("complete notifies inside its own transaction")
	}
	if a := body("announce"); !strings.Contains(a, "set_config('synchronous_commit', 'off', true)") || !strings.Contains(a, "notify_job(") {
		t.Error("announce does not notify in a transaction of its own that skips the flush")
	}
}
