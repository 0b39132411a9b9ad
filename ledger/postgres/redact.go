package postgres

import (
	"net/url"
	"regexp"
	"strings"
)

// Redacted returns a connection string fit for logs and errors: in the URL
// form, the password of its user information replaced by url.URL.Redacted
// and a password query parameter's value too; in the key=value form, the
// value of password. A URL that does not parse is shown as its scheme.
func Redacted(dsn string) string {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return passwordSetting.ReplaceAllString(dsn, "${1}xxxxx")
	}
	u, err := url.Parse(dsn)
	if err != nil {
		scheme, _, _ := strings.Cut(dsn, "://")
		return scheme + "://…"
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// passwordSetting is the password of a key=value connection string, its
// value bare or single-quoted (with backslash escapes).
var passwordSetting = regexp.MustCompile(`(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']\S*)`)
