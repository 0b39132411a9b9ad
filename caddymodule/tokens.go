package caddymodule

import (
	"fmt"
	"net/http"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/onejob/onejob/proxy"
)

// The HTTP syntax rules that the Caddyfile parser, Provision and the admin
// API share, each written once, on the grammar net/http itself checks.

// validMethod reports whether m is a method: an RFC 9110 token.
func validMethod(m string) bool {
	return m != "" && strings.IndexFunc(m, func(r rune) bool { return !httpguts.IsTokenRune(r) }) < 0
}

// checkHeaderName refuses a header name that is not an RFC 9110 token.
func checkHeaderName(name string) error {
	if !httpguts.ValidHeaderFieldName(name) {
		return fmt.Errorf("invalid header name %q", name)
	}
	return nil
}

// checkStoredHeader refuses a header that no stored answer can carry: an
// invalid name or value, or one that proxy.NeverStored names.
func checkStoredHeader(name string, values []string) error {
	if err := checkHeaderName(name); err != nil {
		return err
	}
	key := http.CanonicalHeaderKey(name)
	if proxy.OwnHeader(key) {
		return fmt.Errorf("header %s is the gateway's own: it sets it on every answer, and never stores it", key)
	}
	if proxy.NeverStored(key) {
		return fmt.Errorf("header %s is never stored: it is not end-to-end, or belongs to the first client alone", key)
	}
	for _, v := range values {
		if !httpguts.ValidHeaderFieldValue(v) {
			return fmt.Errorf("invalid value for header %s", key)
		}
	}
	return nil
}

// checkNeverStore refuses a never_store entry that is not a header name,
// or that names a header the gateway itself sets on every answer.
func checkNeverStore(name string) error {
	if err := checkHeaderName(name); err != nil {
		return err
	}
	if key := http.CanonicalHeaderKey(name); proxy.OwnHeader(key) {
		return fmt.Errorf("%s is the gateway's own header, never stored", key)
	}
	return nil
}
