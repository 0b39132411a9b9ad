package caddymodule

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestGuestModulesRegistered: every ledger and the cache are modules of
// their namespaces, each with its own Caddyfile syntax.
func TestGuestModulesRegistered(t *testing.T) {
	for ns, want := range map[string][]string{
		ledgerNamespace: {"file", "memory", "postgres", "redis"},
		cacheNamespace:  {"redis"},
	} {
		var got []string
		for _, m := range caddy.GetModules(ns) {
			got = append(got, m.ID.Name())
			if _, ok := m.New().(caddyfile.Unmarshaler); !ok {
				t.Errorf("%s has no Caddyfile syntax", m.ID)
			}
		}
		for _, name := range want {
			if !slices.Contains(got, name) {
				t.Errorf("%s: modules %v, want %s among them", ns, got, name)
			}
		}
	}
}

// TestGuestCaddyfile pins the Caddyfile syntax of the ledgers and the
// cache (docs/caddyfile.md, and each module's block form) to their JSON.
func TestGuestCaddyfile(t *testing.T) {
	for _, tc := range []struct{ in, ledger, cache string }{
		{"ledger memory", `{"backend":"memory"}`, ""},
		{"ledger file", `{"backend":"file"}`, ""},
		{"ledger file /var/lib/onejob.db", `{"backend":"file","path":"/var/lib/onejob.db"}`, ""},
		{"ledger file {\n\t\tpath /var/lib/onejob.db\n\t}", `{"backend":"file","path":"/var/lib/onejob.db"}`, ""},
		{"ledger postgres postgres://u@db/onejob", `{"backend":"postgres","dsn":"postgres://u@db/onejob"}`, ""},
		{"ledger postgres {env.DATABASE_URL} billing", `{"backend":"postgres","dsn":"{env.DATABASE_URL}","schema":"billing"}`, ""},
		{"ledger postgres {\n\t\tdsn \"host=db dbname=onejob\"\n\t\tschema billing\n\t}", `{"backend":"postgres","dsn":"host=db dbname=onejob","schema":"billing"}`, ""},
		{"ledger postgres postgres://db/onejob {\n\t\tschema billing\n\t}", `{"backend":"postgres","dsn":"postgres://db/onejob","schema":"billing"}`, ""},
		{"ledger redis redis://h:6379/2 pre:", `{"backend":"redis","prefix":"pre:","url":"redis://h:6379/2"}`, ""},
		{"ledger redis {\n\t\turl redis://h\n\t}", `{"backend":"redis","url":"redis://h"}`, ""},
		{"ledger redis redis://h {\n\t\treplicas 1\n\t\treplica_timeout 250ms\n\t}", `{"backend":"redis","replica_timeout":250000000,"replicas":1,"url":"redis://h"}`, ""},
		{"cache redis redis://h/0", "", `{"backend":"redis","url":"redis://h/0"}`},
		{"ledger memory\n\tcache redis redis://h/0 p:", `{"backend":"memory"}`, `{"backend":"redis","prefix":"p:","url":"redis://h/0"}`},
		{"cache redis {\n\t\turl rediss://h\n\t\tprefix p:\n\t}\n\tretention 1h", "", `{"backend":"redis","prefix":"p:","url":"rediss://h"}`},
	} {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n\t" + tc.in + "\n}")); err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if string(h.LedgerRaw) != tc.ledger || string(h.CacheRaw) != tc.cache {
			t.Errorf("%q: ledger %s, cache %s; want %s and %s", tc.in, h.LedgerRaw, h.CacheRaw, tc.ledger, tc.cache)
		}
	}
}

func TestGuestCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"ledger", "wrong argument count or unexpected line ending after 'ledger', at Testfile:2"},
		{"ledger memory x", "usage: ledger memory, at Testfile:2"},
		{"ledger memory {\n\t\tpath x\n\t}", `unknown subdirective "path" (usage: ledger memory), at Testfile:3`},
		{"ledger file a b", "usage: ledger file [<path>], at Testfile:2"},
		{"ledger file {\n\t\tpath\n\t}", "wrong argument count or unexpected line ending after 'path', at Testfile:3"},
		{"ledger file {\n\t\tpath a b\n\t}", "wrong argument count"},
		{"ledger file /a {\n\t\tpath /b\n\t}", "path is given twice, at Testfile:3"},
		{"ledger postgres", "usage: ledger postgres <dsn> [<schema>]"},
		{"ledger postgres {\n\t\tschema s\n\t}", "usage: ledger postgres <dsn> [<schema>]"},
		{"ledger postgres a b c", "usage: ledger postgres <dsn> [<schema>]"},
		{"ledger postgres {\n\t\tdsn a\n\t\tdsn b\n\t}", "dsn is given twice, at Testfile:4"},
		{"ledger postgres a {\n\t\tport 5432\n\t}", `unknown subdirective "port"`},
		{"ledger redis", "usage: ledger redis <url> [<prefix>]"},
		{"ledger redis {\n\t\tprefix a\n\t\tprefix b\n\t}", "prefix is given twice"},
		{"ledger redis redis://h p: 1", "usage: ledger redis <url> [<prefix>]"},
		{"ledger mysql x", `unknown ledger "mysql" (want file, `},
		{"ledger memory\n\tledger file", `duplicate subdirective "ledger", at Testfile:3`},
		{"cache", "wrong argument count or unexpected line ending after 'cache'"},
		{"cache redis", "usage: cache redis <url> [<prefix>]"},
		{"cache redis a b c", "usage: cache redis <url> [<prefix>]"},
		{"cache memcached x", `unknown cache "memcached" (want redis), at Testfile:2`},
		{"cache redis redis://a\n\tcache redis redis://b", `duplicate subdirective "cache"`},
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n\t" + tc.in + "\n}"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.in, err, tc.want)
		}
	}
}

// TestGuestJSON: today's JSON config of a ledger and a cache decodes into
// the modules, field by field.
func TestGuestJSON(t *testing.T) {
	var h Handler
	in := `{"ledger":{"backend":"postgres","dsn":"postgres://db/x","schema":"s"},"cache":{"backend":"redis","url":"redis://h","prefix":"p:"}}`
	if err := json.Unmarshal([]byte(in), &h); err != nil {
		t.Fatal(err)
	}
	var p PostgresLedger
	var c RedisCache
	if err := json.Unmarshal(h.LedgerRaw, &p); err != nil || p.DSN != "postgres://db/x" || p.Schema != "s" {
		t.Errorf("ledger %+v, %v", p, err)
	}
	if err := json.Unmarshal(h.CacheRaw, &c); err != nil || c.URL != "redis://h" || c.Prefix != "p:" {
		t.Errorf("cache %+v, %v", c, err)
	}
}

// TestServerURL: a Redis URL is shown without its password, and one that
// does not parse is refused without showing it.
func TestServerURL(t *testing.T) {
	t.Setenv("ONEJOB_TEST_REDIS_URL", "redis://u:s3cret@h:6379/0")
	raw, shown, err := serverURL("redis ledger", "{env.ONEJOB_TEST_REDIS_URL}")
	if err != nil || raw != "redis://u:s3cret@h:6379/0" || shown != "redis://u:xxxxx@h:6379/0" {
		t.Errorf("serverURL: %q %q %v", raw, shown, err)
	}
	_, _, err = serverURL("redis ledger", "redis://u:s3cret@h:port/0")
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.HasPrefix(err.Error(), "redis ledger: invalid url") {
		t.Errorf("error %v, want one without the password", err)
	}
	if _, _, err := serverURL("redis cache", ""); err == nil || err.Error() != "redis cache: url is required" {
		t.Errorf("empty url: %v", err)
	}
}
