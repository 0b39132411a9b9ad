package postgres

import (
	"strings"
	"testing"
)

func TestRedacted(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://onejob:s3cret@db:5432/onejob":                   "postgres://onejob:xxxxx@db:5432/onejob",
		"postgresql://onejob@db/onejob?password=s3cret&sslmode=off": "postgresql://onejob@db/onejob?password=xxxxx&sslmode=off",
		"postgres://db/onejob":                                      "postgres://db/onejob",
		"host=db user=onejob password=s3cret dbname=onejob":         "host=db user=onejob password=xxxxx dbname=onejob",
		"host=db password = 's3 cr\\'et' dbname=onejob":             "host=db password = xxxxx dbname=onejob",
		"host=db dbname=onejob":                                     "host=db dbname=onejob",
		"postgres://onejob:s3cret@db:x/onejob":                      "postgres://…",
	} {
		got := Redacted(dsn)
		if got != want {
			t.Errorf("Redacted(%q) = %q, want %q", dsn, got, want)
		}
		if strings.Contains(got, "s3") {
			t.Errorf("Redacted(%q) shows the password: %q", dsn, got)
		}
	}
}
