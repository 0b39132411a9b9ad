package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Prefer: wait (RFC 7240): a client chooses how long a duplicate of an
// in-flight job waits for its result, whatever in_flight says.
const (
	// HeaderPrefer carries the client's preferences.
	HeaderPrefer = "Prefer"
	// HeaderPreferenceApplied names the preferences the answer honoured.
	HeaderPreferenceApplied = "Preference-Applied"
)

// preferredWait returns the wait preference of r: the first "wait" among
// its Prefer header fields, in whole seconds. Malformed preferences are
// ignored, as RFC 7240 asks; ok is false when r states no valid wait.
func preferredWait(h http.Header) (time.Duration, bool) {
	for _, field := range h.Values(HeaderPrefer) {
		for _, pref := range splitQuoted(field, ',') {
			name, value, hasValue := strings.Cut(strings.SplitN(pref, ";", 2)[0], "=")
			if !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			if !hasValue {
				return 0, false // the first wait is malformed: no wait preference
			}
			v := strings.TrimSpace(value)
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			n, err := strconv.ParseUint(v, 10, 31)
			if err != nil {
				return 0, false
			}
			return time.Duration(n) * time.Second, true
		}
	}
	return 0, false
}

// splitQuoted splits s at sep, except inside quoted strings, and drops
// empty parts.
func splitQuoted(s string, sep byte) []string {
	var parts []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			parts = appendPart(parts, s[start:i])
			start = i + 1
		}
	}
	return appendPart(parts, s[start:])
}

func appendPart(parts []string, p string) []string {
	if p = strings.TrimSpace(p); p != "" {
		parts = append(parts, p)
	}
	return parts
}

// appliedWait is the Preference-Applied value for a wait of d: whole
// seconds, rounded up, as the client wrote it.
func appliedWait(d time.Duration) string {
	return "wait=" + strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}
