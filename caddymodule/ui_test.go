package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// uiServer serves the admin routes as Caddy's admin endpoint does, on a
// ServeMux by their patterns.
func uiServer(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	for _, r := range (&adminAPI{}).Routes() {
		mux.Handle(r.Pattern, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if err := r.Handler.ServeHTTP(w, req); err != nil {
				t.Errorf("%s: %v", req.URL.Path, err)
			}
		}))
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestUIServesPageAndAssets(t *testing.T) {
	srv := uiServer(t)
	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	for _, tc := range []struct {
		path, ctype, contains string
	}{
		// Caddy's admin endpoint refuses no-cors requests: the page's
		// script and stylesheet must be fetched in cors mode.
		{"/idempotency/ui/", "text/html; charset=utf-8", `<script type="module" src="/idempotency/ui/app.js">`},
		{"/idempotency/ui/", "text/html; charset=utf-8", `<link rel="stylesheet" href="/idempotency/ui/style.css" crossorigin="anonymous">`},
		{"/idempotency/ui/index.html", "text/html; charset=utf-8", "<title>Jobs · onejob</title>"},
		{"/idempotency/ui/app.js", "text/javascript; charset=utf-8", `const API = "/idempotency";`},
		{"/idempotency/ui/style.css", "text/css; charset=utf-8", ".tl-bar"},
	} {
		resp, err := client.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", tc.path, resp.StatusCode)
			continue
		}
		if got := resp.Header.Get("Content-Type"); got != tc.ctype {
			t.Errorf("GET %s: Content-Type %q, want %q", tc.path, got, tc.ctype)
		}
		if !strings.Contains(string(body), tc.contains) {
			t.Errorf("GET %s: body lacks %q", tc.path, tc.contains)
		}
		h := resp.Header
		if h.Get("X-Content-Type-Options") != "nosniff" || !strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
			t.Errorf("GET %s: security headers %v", tc.path, h)
		}
		// The page's GET calls pass Caddy's origin check by their Referer.
		if got := h.Get("Referrer-Policy"); got != "same-origin" {
			t.Errorf("GET %s: Referrer-Policy %q", tc.path, got)
		}
	}

	// Without the slash, the mux sends the browser to the page.
	resp, err := client.Get(srv.URL + "/idempotency/ui")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 3 || resp.Header.Get("Location") != "/idempotency/ui/" {
		t.Errorf("GET /idempotency/ui: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}

	// HEAD has the headers and no body.
	resp, err = client.Head(srv.URL + "/idempotency/ui/app.js")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/javascript; charset=utf-8" || resp.ContentLength <= 0 {
		t.Errorf("HEAD app.js: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestUIUnknownAssets(t *testing.T) {
	srv := uiServer(t)
	for _, path := range []string{
		"/idempotency/ui/nothing.js",
		"/idempotency/ui/app.js.map",
		"/idempotency/ui/README",
		"/idempotency/ui/ui/app.js",
		"/idempotency/ui/index.html/",
	} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, resp.StatusCode)
			continue
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" || !strings.Contains(string(body), "urn:onejob:problem:not-found") {
			t.Errorf("GET %s: %s %s", path, ct, body)
		}
	}

	// Paths that leave the page's directory never reach a Go source file.
	for _, path := range []string{"/idempotency/ui/..%2fui.go", "/idempotency/ui/%2e%2e/admin.go", "/idempotency/ui/../ui.go"} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || strings.Contains(string(body), "package caddymodule") {
			t.Errorf("GET %s: %d %.80s", path, resp.StatusCode, body)
		}
	}

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/idempotency/ui/", strings.NewReader("{}"))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST the page: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

// The page's route is among the admin module's routes.
func TestUIRouteRegistered(t *testing.T) {
	var found bool
	for _, r := range (&adminAPI{}).Routes() {
		found = found || r.Pattern == uiPath
	}
	if !found {
		t.Fatalf("no admin route for %s", uiPath)
	}
	var _ caddy.AdminHandler = caddy.AdminHandlerFunc(serveUI)
}
