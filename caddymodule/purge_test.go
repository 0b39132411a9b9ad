package caddymodule

import (
	"strings"
	"testing"
)

func TestCLIPurge(t *testing.T) {
	f := newFakeAdmin(t, map[string]cannedAnswer{
		"POST " + adminPurgePath: {200, "application/json", `{"removed":3,"kept":1,"ledgers":2,"unsupported":0}`},
	})
	out, errOut, err := runCLI(t, "", "purge", "--owner", "authorization:Bearer alice", "--address", f.addr())
	if err != nil {
		t.Fatalf("purge: %v\n%s", err, errOut)
	}
	want := "Removed 3 settled jobs of the owner from 2 ledgers.\n" +
		"Kept 1 pending or unknown jobs: settle them (caddy idempotency resolve), then purge again.\n"
	if out != want {
		t.Errorf("purge printed\n%s\nwant\n%s", out, want)
	}
	if req := f.only(t); req.body != `{"owner":"authorization:Bearer alice"}` {
		t.Errorf("request: %+v", req)
	}

	out, _, err = runCLI(t, "", "purge", "--owner", "x", "--json", "--address", f.addr())
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, out, `{"removed":3,"kept":1,"ledgers":2,"unsupported":0}`)

	if _, _, err := runCLI(t, "", "purge", "--address", f.addr()); err == nil || !strings.Contains(err.Error(), "purge needs --owner") {
		t.Errorf("purge without --owner: %v", err)
	}
}
