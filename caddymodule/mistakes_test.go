package caddymodule

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// mistake is a config value that cannot work, written in a Caddyfile, in
// JSON, or both.
type mistake struct {
	// field is the JSON field the mistake is in: a field of the handler
	// ("retention"), of its contract, probe or providers
	// ("contract.status", "providers.name"), a guest module
	// ("ledger.memory") or a guest module's field ("ledger.redis.url").
	field string
	// caddyfile is the body of an idempotency block; its first line is
	// line 3 of the Testfile. "" is no Caddyfile case.
	caddyfile string
	// line is the line of the Testfile the error names.
	line int
	// json is the handler's JSON fields, after "handler" (and a memory
	// ledger, unless it names a ledger). "" is no JSON case.
	json string
	// want is in the error.
	want string
}

// Two providers, in each form.
const (
	twoProviders     = "provider a {\n\treverse_proxy 127.0.0.1:1\n}\nprovider b {\n\treverse_proxy 127.0.0.1:2\n}\n"
	twoProvidersJSON = `"providers":[{"name":"a","routes":[{"handle":[{"handler":"static_response"}]}]},{"name":"b","routes":[{"handle":[{"handler":"static_response"}]}]}]`
	oneProviderJSON  = `"providers":[{"name":"a","routes":[{"handle":[{"handler":"static_response"}]}]}]`
)

// mistakes covers every field of the handler's JSON config and of its guest
// modules, each at least once in a Caddyfile and once in JSON (checked by
// TestConfigMistakesCoverEveryField).
var mistakes = []mistake{
	{field: "scope", caddyfile: `scope ""`, line: 3, want: `scope "": want 1 to 100 visible characters, no spaces`},
	{field: "scope", caddyfile: `scope "a b"`, line: 3, json: `"scope":"a b"`, want: `scope "a b": want 1 to 100 visible characters, no spaces`},

	{field: "ledger", caddyfile: "ledger mysql x", line: 3, want: `unknown ledger "mysql" (want file, `},
	{field: "ledger", json: `"ledger":{"backend":"mysql"}`, want: "idempotency.ledgers.mysql"},
	{field: "ledger.memory", caddyfile: "ledger memory x", line: 3, want: "usage: ledger memory"},
	{field: "ledger.memory", json: `"ledger":{"backend":"memory","path":"x"}`, want: `unknown field "path"`},
	{field: "ledger.file", caddyfile: "ledger file a b", line: 3, want: "usage: ledger file [<path>]"},
	{field: "ledger.file", json: `"ledger":{"backend":"file","dsn":"x"}`, want: `unknown field "dsn"`},
	{field: "ledger.file.path", caddyfile: `ledger file ""`, line: 3, want: "path must not be empty; leave it out for the default"},
	{field: "ledger.file.path", caddyfile: "ledger file {\n\tpath \"\"\n}", line: 4, want: "path must not be empty"},
	{field: "ledger.file.path", json: `"ledger":{"backend":"file","path":"/"}`, want: "file ledger"},
	{field: "ledger.file.cache_size", caddyfile: "ledger file {\n\tcache_size 0\n}", line: 4, want: `cache_size: invalid size "0": it must be more than 0`},
	{field: "ledger.file.cache_size", json: `"ledger":{"backend":"file","cache_size":-1}`, want: "cache_size -1: want 1 byte to 1TiB"},
	{field: "ledger.postgres", caddyfile: "ledger postgres", line: 3, json: `"ledger":{"backend":"postgres"}`, want: "dsn"},
	{field: "ledger.postgres.dsn", caddyfile: `ledger postgres ""`, line: 3, want: "dsn must not be empty"},
	{field: "ledger.postgres.dsn", json: `"ledger":{"backend":"postgres","dsn":""}`, want: "postgres ledger: dsn is required"},
	{field: "ledger.postgres.schema", caddyfile: `ledger postgres postgres://db/x ""`, line: 3, want: "schema must not be empty"},
	{field: "ledger.postgres.schema", json: `"ledger":{"backend":"postgres","dsn":"postgres://127.0.0.1:1/x","schema":"Bad-Name"}`, want: `invalid schema name "Bad-Name"`},
	{field: "ledger.redis", caddyfile: "ledger redis", line: 3, json: `"ledger":{"backend":"redis"}`, want: "url"},
	{field: "ledger.redis.url", caddyfile: "ledger redis http://h:6379", line: 3, json: `"ledger":{"backend":"redis","url":"http://h:6379"}`,
		want: `redis ledger: invalid url: the scheme must be redis, rediss or unix, not "http"`},
	{field: "ledger.redis.url", caddyfile: "ledger redis {\n\turl \"\"\n}", line: 4, want: "url must not be empty"},
	{field: "ledger.redis.prefix", caddyfile: `ledger redis redis://h ""`, line: 3, want: "prefix must not be empty"},
	{field: "ledger.redis.prefix", json: `"ledger":{"backend":"redis","url":"redis://h","prefix":1}`, want: "cannot unmarshal number"},
	{field: "ledger.redis.replicas", caddyfile: "ledger redis redis://h {\n\treplicas 0\n}", line: 4, want: `replicas: invalid count "0": it must be a whole number more than 0`},
	{field: "ledger.redis.replicas", caddyfile: "ledger redis redis://h {\n\treplicas two\n}", line: 4, want: `replicas: invalid count "two"`},
	{field: "ledger.redis.replicas", json: `"ledger":{"backend":"redis","url":"redis://h","replicas":-1}`, want: "replicas must not be negative, not -1"},
	{field: "ledger.redis.replica_timeout", caddyfile: "ledger redis redis://h {\n\treplica_timeout 1s\n}", line: 5,
		json: `"ledger":{"backend":"redis","url":"redis://h","replica_timeout":"1s"}`, want: "a replica timeout (1s) has no meaning without replicas"},
	{field: "ledger.redis.replica_timeout", caddyfile: "ledger redis redis://h {\n\treplicas 1\n\treplica_timeout 100us\n}", line: 6,
		json: `"ledger":{"backend":"redis","url":"redis://h","replicas":1,"replica_timeout":"-1s"}`, want: "replica timeout must be 1ms or more"},
	{field: "ledger.redis.replica_timeout", caddyfile: "ledger redis redis://h {\n\treplicas 1\n\treplica_timeout 0s\n}", line: 5, want: `replica_timeout: invalid duration "0s": it must be more than 0`},

	{field: "cache", caddyfile: "cache memcached x", line: 3, json: `"cache":{"backend":"memcached"}`, want: "memcached"},
	{field: "cache.redis", caddyfile: "cache redis", line: 3, json: `"cache":{"backend":"redis"}`, want: "url"},
	{field: "cache.redis.url", caddyfile: "cache redis tcp://h", line: 3, json: `"cache":{"backend":"redis","url":"tcp://h"}`,
		want: `redis cache: invalid url: the scheme must be redis, rediss or unix, not "tcp"`},
	{field: "cache.redis.prefix", caddyfile: "cache redis {\n\turl redis://h\n\tprefix \"\"\n}", line: 5, want: "prefix must not be empty"},
	{field: "cache.redis.prefix", json: `"cache":{"backend":"redis","url":"redis://h","prefix":false}`, want: "cannot unmarshal bool"},

	{field: "owner", caddyfile: `owner ""`, line: 3, want: `owner must not be empty or blank, not ""`},
	{field: "owner", caddyfile: `owner " "`, line: 3, json: `"owner":" "`, want: `owner must not be empty or blank, not " "`},
	{field: "owner_secret", caddyfile: `owner_secret ""`, line: 3, want: "owner_secret must not be empty"},
	{field: "owner_secret", json: `"owner_secret":42`, want: "Handler.owner_secret"},
	{field: "key_header", caddyfile: `key_header ""`, line: 3, want: `key_header: invalid header name ""`},
	{field: "key_header", caddyfile: "key_header X:Key", line: 3, json: `"key_header":"X:Key"`, want: `key_header: invalid header name "X:Key"`},
	{field: "key_header", caddyfile: "key_header idempotency-job-id", line: 3, json: `"key_header":"Idempotency-Attempt"`, want: "is set by the gateway on every upstream request"},
	{field: "key_header", caddyfile: "key_header Idempotency-Deadline", line: 3, json: `"key_header":"idempotency-deadline"`, want: "Idempotency-Deadline is set by the gateway on every upstream request"},
	{field: "methods", caddyfile: `methods POST ""`, line: 3, json: `"methods":["POST",""]`, want: `methods: "" is not an HTTP method`},
	{field: "methods", caddyfile: `methods "PO ST"`, line: 3, json: `"methods":["PO ST"]`, want: `methods: "PO ST" is not an HTTP method`},
	{field: "methods", caddyfile: "methods", line: 3, want: "wrong argument count"},
	{field: "require_key", caddyfile: "require_key yes", line: 3, want: "wrong argument count"},
	{field: "require_key", json: `"require_key":"yes"`, want: "Handler.require_key"},
	{field: "implicit_key", caddyfile: "require_key\nimplicit_key 1m", line: 4, json: `"require_key":true,"implicit_key":"1m"`, want: "implicit_key"},
	{field: "implicit_key", caddyfile: "implicit_key 0s", line: 3, json: `"implicit_key":"-1m"`, want: "implicit_key"},
	{field: "fingerprint", caddyfile: `fingerprint ""`, line: 3, want: `fingerprint must be raw, json or graphql, not ""`},
	{field: "fingerprint", caddyfile: "fingerprint xml", line: 3, json: `"fingerprint":"xml"`, want: `fingerprint must be raw, json or graphql, not "xml"`},
	{field: "fingerprint_include", caddyfile: "fingerprint json {\n\tinclude\n}", line: 4, want: "include needs at least one JSON pointer"},
	{field: "fingerprint_include", caddyfile: "fingerprint json {\n\tinclude \"\"\n}", line: 4, json: `"fingerprint_include":[""]`, want: `the JSON pointer "" is the whole body, not a member`},
	{field: "fingerprint_include", caddyfile: "fingerprint raw {\n\tinclude /a\n}", line: 4, json: `"fingerprint":"raw","fingerprint_include":["/a"]`, want: "fingerprint raw"},
	{field: "fingerprint_exclude", caddyfile: "fingerprint json {\n\texclude meta\n}", line: 4, json: `"fingerprint_exclude":["meta"]`, want: `JSON pointer "meta" must start with /`},
	{field: "fingerprint_exclude", caddyfile: "fingerprint json {\n\tinclude /a\n\texclude /b\n}", line: 5, want: "fingerprint json: include and exclude together"},
	{field: "fingerprint_exclude", json: `"fingerprint_include":["/a"],"fingerprint_exclude":["/b"]`, want: "fingerprint json takes include or exclude, not both"},
	{field: "fingerprint_headers", caddyfile: `fingerprint_headers X-A ""`, line: 3, json: `"fingerprint_headers":["X-A",""]`, want: `fingerprint_headers: invalid header name ""`},
	{field: "status_path", caddyfile: `status_path ""`, line: 3, want: `status_path must be a path starting with / other than /, not ""`},
	{field: "status_path", caddyfile: "status_path jobs", line: 3, json: `"status_path":"jobs"`, want: `not "jobs"`},
	{field: "max_request_body", caddyfile: "max_request_body 0", line: 3, want: `max_request_body: invalid size "0": it must be more than 0`},
	{field: "max_request_body", caddyfile: "max_request_body 2PiB", line: 3, want: "more than 1TiB"},
	{field: "max_request_body", json: `"max_request_body":-1`, want: "max_request_body must not be negative, not -1"},
	{field: "max_request_body", json: `"max_request_body":2199023255552`, want: "max_request_body: 2199023255552 bytes is more than 1TiB"},
	{field: "max_response_body", caddyfile: "max_response_body 0B", line: 3, want: `max_response_body: invalid size "0B": it must be more than 0`},
	{field: "max_response_body", json: `"max_response_body":-5`, want: "max_response_body must not be negative, not -5"},
	{field: "retention", caddyfile: "retention 0", line: 3, want: `retention: invalid duration "0": it must be more than 0`},
	{field: "retention", caddyfile: "retention -1h", line: 3, json: `"retention":"-1h"`, want: "retention must not be negative, not -1h0m0s"},
	{field: "attempt_timeout", caddyfile: "attempt_timeout 0s", line: 3, want: `attempt_timeout: invalid duration "0s"`},
	{field: "attempt_timeout", json: `"attempt_timeout":-1`, want: "attempt_timeout must not be negative, not -1ns"},
	{field: "attempt_timeout", caddyfile: "attempt_timeout 10m", line: 3, json: `"attempt_timeout":"10m"`, want: "attempt_deadline (5m0s) is shorter than attempt_timeout (10m0s)"},
	{field: "attempt_deadline", caddyfile: "attempt_timeout 10s\nattempt_deadline 5s", line: 4, json: `"attempt_timeout":"10s","attempt_deadline":"5s"`, want: "attempt_deadline (5s) is shorter than attempt_timeout (10s)"},
	{field: "attempt_deadline", caddyfile: "attempt_deadline soon", line: 3, json: `"attempt_deadline":"soon"`, want: "soon"},
	{field: "attempt_deadline", json: `"attempt_deadline":"-2m"`, want: "attempt_deadline must not be negative"},
	{field: "in_flight", caddyfile: `in_flight ""`, line: 3, want: `in_flight must be wait [<duration>] or reject, not ""`},
	{field: "in_flight", caddyfile: "in_flight maybe", line: 3, json: `"in_flight":"maybe"`, want: `"maybe"`},
	{field: "in_flight", caddyfile: "in_flight reject 1s", line: 3, want: "wrong argument count"},
	{field: "in_flight", json: `"in_flight":"reject","in_flight_wait":"1s"`, want: "in_flight_wait has no meaning with it"},
	{field: "in_flight_wait", caddyfile: "in_flight wait 0s", line: 3, want: `in_flight wait: invalid duration "0s": it must be more than 0`},
	{field: "in_flight_wait", caddyfile: "in_flight wait -1s", line: 3, want: "in_flight wait must not be negative"},
	{field: "in_flight_wait", json: `"in_flight_wait":"-1s"`, want: "in_flight_wait must not be negative, not -1s"},
	{field: "max_wait", caddyfile: "max_wait 0", line: 3, want: `max_wait: invalid duration "0": it must be more than 0`},
	{field: "max_wait", json: `"max_wait":"-1s"`, want: "max_wait must not be negative, not -1s"},
	{field: "failover_on", caddyfile: `failover_on connect_error ""`, line: 3, json: `"failover_on":["connect_error",""]`, want: `failover_on: "" is not connect_error, contract or a status code`},
	{field: "failover_on", caddyfile: "failover_on 503 200", line: 3, json: `"failover_on":["200"]`, want: "failover_on: 200 is a success: it shows the provider acted"},
	{field: "failover_on", caddyfile: "failover_on 101", line: 3, json: `"failover_on":["101"]`, want: "failover_on: 101 is not a final answer"},
	{field: "failover_on", caddyfile: "failover_on connect_error contract", line: 3, json: `"failover_on":["contract"]`, want: "failover_on contract needs a contract"},
	{field: "hedge_after", caddyfile: "hedge_after 100ms", line: 3, json: `"hedge_after":"100ms"`, want: "hedge_after needs two provider blocks or more"},
	{field: "hedge_after", caddyfile: "hedge_after 100ms\nprovider a {\n\treverse_proxy 127.0.0.1:1\n}", line: 3, json: `"hedge_after":"100ms",` + oneProviderJSON, want: "hedge_after needs two provider blocks or more"},
	{field: "hedge_after", caddyfile: twoProviders + "hedge_after 30s", line: 9, json: `"hedge_after":"30s",` + twoProvidersJSON, want: "hedge_after (30s) must be shorter than attempt_timeout (30s)"},
	{field: "hedge_after", caddyfile: "hedge_after 0s", line: 3, json: `"hedge_after":"-1s",` + twoProvidersJSON, want: "hedge_after"},

	{field: "providers", caddyfile: "provider a {\n\treverse_proxy 127.0.0.1:1\n}\nprovider a {\n\treverse_proxy 127.0.0.1:2\n}", line: 6,
		json: `"providers":[{"name":"a","routes":[{"handle":[{"handler":"static_response"}]}]},{"name":"a","routes":[{"handle":[{"handler":"static_response"}]}]}]`,
		want: `provider "a" is defined twice`},
	{field: "providers", caddyfile: "provider a", line: 3, json: `"providers":{"name":"a"}`, want: "provider"},
	{field: "providers.name", caddyfile: "provider admin {\n\treverse_proxy 127.0.0.1:1\n}", line: 3,
		json: `"providers":[{"name":"admin","routes":[{"handle":[{"handler":"static_response"}]}]}]`, want: `provider name "admin" is reserved`},
	{field: "providers.name", caddyfile: "provider \"a b\" {\n\treverse_proxy 127.0.0.1:1\n}", line: 3,
		json: `"providers":[{"name":"a b","routes":[{"handle":[{"handler":"static_response"}]}]}]`, want: `provider name "a b": want 1 to 100 visible characters, no spaces`},
	{field: "providers.name", json: `"providers":[{"routes":[{"handle":[{"handler":"static_response"}]}]}]`, want: "provider 1 has no name"},
	{field: "providers.routes", caddyfile: "provider a {\n}", line: 3, json: `"providers":[{"name":"a"}]`, want: "provider a has no handlers"},
	{field: "providers.routes", caddyfile: "provider a {\n\treverse_proxy 127.0.0.1:1 {\n\t\trequest_buffers 1k\n\t}\n}", line: 5,
		json: `"providers":[{"name":"a","routes":[{"handle":[{"handler":"reverse_proxy","request_buffers":1024}]}]}]`, want: "reverse_proxy request_buffers is not allowed inside a provider"},

	{field: "never_store", caddyfile: "never_store X-A \"Bad Name\"", line: 3, json: `"never_store":["X-A","Bad Name"]`, want: `invalid header name "Bad Name"`},
	{field: "never_store", caddyfile: "never_store Idempotency-Job-Id", line: 3, json: `"never_store":["Idempotency-Job-Id"]`, want: "Idempotency-Job-Id is the gateway's own header, never stored"},
	{field: "encryption", caddyfile: "encryption {\n}", line: 4, json: `"encryption":{"keys":[]}`, want: "encryption: needs at least one key"},
	{field: "encryption", caddyfile: "encryption {\n\tkey k1 c2hvcnQ=\n}", line: 4, json: `"encryption":{"keys":[{"id":"k1","key":"c2hvcnQ="}]}`, want: `key "k1" is 5 bytes, want 32`},

	{field: "providers.deduplicates", caddyfile: "provider a {\n\treverse_proxy 127.0.0.1:1\n\tdeduplicates \"Idem Key\"\n}", line: 5,
		json: `"providers":[{"name":"a","deduplicates":"Idem Key","routes":[{"handle":[{"handler":"static_response"}]}]}]`, want: `provider a: deduplicates: invalid header name "Idem Key"`},
	{field: "providers.deduplicates", caddyfile: "provider a {\n\tdeduplicates A B\n\treverse_proxy 127.0.0.1:1\n}", line: 4, want: "provider a: usage: deduplicates [<header>]"},

	{field: "providers.lookup", caddyfile: "provider a {\n\treverse_proxy 127.0.0.1:1\n\tlookup GET charges/{idempotency.job_id}\n}", line: 5,
		json: `"providers":[{"name":"a","lookup":{"method":"GET","uri":"charges/1"},"routes":[{"handle":[{"handler":"static_response"}]}]}]`, want: `provider a: lookup: the URI must be a path starting with /`},
	{field: "providers.lookup", caddyfile: "provider a {\n\treverse_proxy 127.0.0.1:1\n\tlookup GET /c/{idempotency.job_id} {\n\t\tabsent 404 200\n\t}\n}", line: 5,
		json: `"providers":[{"name":"a","lookup":{"method":"GET","uri":"/c","absent":[200]},"routes":[{"handle":[{"handler":"static_response"}]}]}]`, want: "provider a: lookup: absent 200: want a status from 300 to 599"},
	{field: "providers.lookup", caddyfile: "provider a {\n\treverse_proxy 127.0.0.1:1\n\tlookup \"G T\" /c\n}", line: 5,
		json: `"providers":[{"name":"a","lookup":{"method":"","uri":"/c"},"routes":[{"handle":[{"handler":"static_response"}]}]}]`, want: "is not an HTTP method"},
	{field: "providers.lookup", caddyfile: "provider a {\n\tlookup GET\n\treverse_proxy 127.0.0.1:1\n}", line: 4, want: "provider a: usage: lookup <method> <uri>"},
	{field: "providers.lookup", caddyfile: "provider a {\n\treverse_proxy 127.0.0.1:1\n\tlookup GET /c {\n\t\tgone 404\n\t}\n}", line: 6, want: `provider a: lookup: unknown option "gone"`},
	{field: "providers.lookup", caddyfile: "provider a {\n\treverse_proxy 127.0.0.1:1\n\tlookup GET /c {\n\t\tabsent x\n\t}\n}", line: 6, want: `provider a: lookup: absent "x" is not a status`},
	{field: "providers.lookup", caddyfile: "provider a {\n\treverse_proxy 127.0.0.1:1\n\tlookup GET /c\n\tlookup GET /d\n}", line: 6, want: "provider a: lookup is given twice"},
	{field: "reconcile_every", caddyfile: "reconcile_every 10s", line: 3, json: `"reconcile_every":"10s"`, want: "reconcile_every needs a provider with a lookup"},
	{field: "reconcile_every", caddyfile: "reconcile_every 0s", line: 3, json: `"reconcile_every":"-1s"`, want: "reconcile_every"},

	{field: "contract", caddyfile: "contract {\n}", line: 3, json: `"contract":{}`, want: "contract names nothing to check"},
	{field: "contract", caddyfile: "contract x", line: 3, want: "wrong argument count"},
	{field: "contract.status", caddyfile: "contract {\n\tstatus 7xx\n}", line: 4, json: `"contract":{"status":["7xx"]}`, want: `contract: status "7xx" is not a class 1xx to 5xx`},
	{field: "contract.status", caddyfile: "contract {\n\tstatus 200 \"\"\n}", line: 4, json: `"contract":{"status":[""]}`, want: `contract: status "" is not a status code`},
	{field: "contract.content_type", caddyfile: "contract {\n\tcontent_type \"\"\n}", line: 4, want: "contract: content_type must not be empty"},
	{field: "contract.content_type", caddyfile: "contract {\n\tcontent_type json\n}", line: 4, json: `"contract":{"content_type":"json"}`, want: `contract: content_type "json" is not a media type`},
	{field: "contract.json_schema", caddyfile: "contract {\n\tstatus 2xx\n\tjson_schema \"\"\n}", line: 5, want: "contract: json_schema must not be empty"},
	{field: "contract.json_schema_at", caddyfile: "contract {\n\tstatus 2xx\n\tjson_schema s.json at choices/0\n}", line: 5,
		json: `"contract":{"json_schema":"../examples/answer.schema.json","json_schema_at":"choices/0"}`, want: `JSON pointer "choices/0" must start with /`},
	{field: "contract.json_schema", json: `"contract":{"json_schema":"/nonexistent/onejob/charge.json"}`, want: "contract: json_schema /nonexistent/onejob/charge.json"},
	{field: "contract.graphql_schema", caddyfile: "contract {\n\tgraphql_schema \"\"\n}", line: 4, want: "contract: graphql_schema must not be empty"},
	{field: "contract.graphql_schema", json: `"contract":{"graphql_schema":"/nonexistent/onejob/api.graphql"}`, want: "contract: graphql_schema /nonexistent/onejob/api.graphql"},

	{field: "probe", caddyfile: "probe GET /health", line: 3, json: `"probe":{"method":"GET","path":"/health"}`, want: "probe needs provider blocks"},
	{field: "probe", caddyfile: "probe GET", line: 3, want: "usage: probe <method> <path>"},
	{field: "probe", json: `"probe":{"method":"GET","path":"/health","timeout":"1s"}`, want: `unknown field "timeout"`},
	{field: "probe.method", caddyfile: "probe G(T /health", line: 3, json: `"probe":{"method":"G(T","path":"/health"},` + twoProvidersJSON, want: `probe: invalid method "G(T"`},
	{field: "probe.method", json: `"probe":{"path":"/health"},` + twoProvidersJSON, want: `probe: invalid method ""`},
	{field: "probe.path", caddyfile: twoProviders + "probe GET health", line: 9, json: `"probe":{"method":"GET","path":"health"},` + twoProvidersJSON, want: `probe: the path must start with /, not "health"`},
	{field: "probe.path", caddyfile: "probe GET /%zz", line: 3, json: `"probe":{"method":"GET","path":"/%zz"},` + twoProvidersJSON, want: `probe: the path "/%zz" cannot be requested`},
	{field: "probe.body_file", caddyfile: `probe GET /health ""`, line: 3, want: "probe: the body file must not be empty"},
	{field: "probe.body_file", json: `"probe":{"method":"POST","path":"/health","body_file":"/nonexistent/onejob/probe.json"},` + twoProvidersJSON, want: "probe: open /nonexistent/onejob/probe.json"},
	{field: "probe.every", caddyfile: "probe GET /health {\n\tevery 0\n}", line: 4, want: `probe: every: invalid duration "0": it must be more than 0`},
	{field: "probe.every", json: `"probe":{"method":"GET","path":"/health","every":"-1s"},` + twoProvidersJSON, want: "probe: every must not be negative, not -1s"},
}

// mistakeConfig is a whole JSON config whose one server runs the handler
// with these fields, as `caddy validate` reads it.
func mistakeConfig(fields string) []byte {
	h := `{"handler":"idempotency"`
	if !strings.Contains(fields, `"ledger":`) {
		h += `,"ledger":{"backend":"memory"}`
	}
	if fields != "" {
		h += "," + fields
	}
	return []byte(`{"admin":{"disabled":true},"apps":{"http":{"servers":{"api":{"listen":["127.0.0.1:0"],
		"automatic_https":{"disable":true},"routes":[{"handle":[` + h + `}]}]}}}}}`)
}

// mistakeCaddyfile is a site whose idempotency block holds body, from
// line 3 on.
func mistakeCaddyfile(body string) string {
	return ":8080 {\n\tidempotency {\n\t\t" + strings.ReplaceAll(body, "\n", "\n\t\t") + "\n\t}\n}\n"
}

// TestConfigMistakes: every mistake is refused, in a Caddyfile with the
// file and line of the value, and in JSON when the config is provisioned
// (`caddy validate`).
func TestConfigMistakes(t *testing.T) {
	// The harness itself accepts what is right.
	if _, err := adaptAs(mistakeCaddyfile("ledger memory\n" + twoProviders + "hedge_after 1s\nprobe GET /health")); err != nil {
		t.Fatalf("a good Caddyfile: %v", err)
	}
	if err := validate(t, mistakeConfig(`"hedge_after":"1s","probe":{"method":"GET","path":"/health"},`+twoProvidersJSON)); err != nil {
		t.Fatalf("a good JSON config: %v", err)
	}
	for _, m := range mistakes {
		if m.caddyfile != "" {
			t.Run("Caddyfile/"+m.field+"/"+m.caddyfile, func(t *testing.T) {
				_, err := adaptAs(mistakeCaddyfile(m.caddyfile))
				at := fmt.Sprintf("Testfile:%d", m.line)
				if err == nil || !strings.Contains(err.Error(), m.want) || !strings.Contains(err.Error(), at) {
					t.Errorf("error %v,\nwant one containing %q at %s", err, m.want, at)
				}
			})
		}
		if m.json != "" {
			t.Run("JSON/"+m.field+"/"+m.json, func(t *testing.T) {
				err := validate(t, mistakeConfig(m.json))
				if err == nil || !strings.Contains(err.Error(), m.want) {
					t.Errorf("error %v,\nwant one containing %q", err, m.want)
				}
			})
		}
	}
}

// adaptAs adapts a Caddyfile named Testfile.
func adaptAs(in string) ([]byte, error) {
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(in), map[string]any{"filename": "Testfile"})
	return out, err
}

// TestConfigMistakesCoverEveryField: every JSON field of the handler, of
// its contract, probe and providers, and of each guest module this package
// registers, has a mistake in a Caddyfile and one in JSON. A new field
// fails here until it has both.
func TestConfigMistakesCoverEveryField(t *testing.T) {
	fields := map[string]bool{}
	addFields := func(prefix string, typ reflect.Type) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			fields[prefix+name] = true
		}
	}
	addFields("", reflect.TypeFor[Handler]())
	addFields("contract.", reflect.TypeFor[ContractConfig]())
	addFields("probe.", reflect.TypeFor[ProbeConfig]())
	addFields("providers.", reflect.TypeFor[Provider]())
	for ns, field := range map[string]string{ledgerNamespace: "ledger", cacheNamespace: "cache"} {
		for _, mi := range caddy.GetModules(ns) {
			typ := reflect.TypeOf(mi.New()).Elem()
			if typ.PkgPath() != reflect.TypeFor[Handler]().PkgPath() || strings.HasSuffix(mi.ID.Name(), "test") {
				continue // a third party's, or a test's
			}
			fields[field+"."+mi.ID.Name()] = true
			addFields(field+"."+mi.ID.Name()+".", typ)
		}
	}
	if !fields["ledger.postgres.dsn"] || !fields["cache.redis.url"] || !fields["retention"] || !fields["probe.every"] {
		t.Fatalf("the walk missed fields: %v", fields)
	}

	inCaddyfile, inJSON := map[string]bool{}, map[string]bool{}
	for _, m := range mistakes {
		if !fields[m.field] {
			t.Errorf("mistake of %q: no such JSON field", m.field)
		}
		if m.caddyfile != "" {
			inCaddyfile[m.field] = true
		}
		if m.json != "" {
			inJSON[m.field] = true
		}
	}
	for f := range fields {
		if !inCaddyfile[f] {
			t.Errorf("%s has no Caddyfile mistake", f)
		}
		if !inJSON[f] {
			t.Errorf("%s has no JSON mistake", f)
		}
	}
}
