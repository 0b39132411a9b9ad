package caddymodule

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
)

// The jobs page: a small operator's view of the admin API (list, detail
// with an attempt timeline, resolve, providers), served from files embedded
// in the binary. It calls only the admin endpoints of admin.go, from the
// same origin.
//
// Caddy's admin endpoint refuses what a browser fetches in no-cors mode
// (a plain <script src> or stylesheet link), and checks the Host of every
// request and the Origin (or, for a GET without one, the Referer) of every
// request a browser makes. So the page loads its script as a module and its
// stylesheet with crossorigin, both fetched in cors mode; its GET calls
// carry its Referer, which the Referrer-Policy below keeps for same-origin
// requests, and its POSTs its Origin. A browser's first navigation to the
// page carries neither: the admin endpoint lets it through only when its
// origins list the empty origin (see docs/operations.md, "Letting a browser
// in").

//go:embed ui
var uiFiles embed.FS

const uiPath = "/idempotency/ui/"

// uiContentTypes maps the extensions of the page's files to their media
// types; files with any other extension are not served.
var uiContentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

// uiSecurityPolicy lets the page load only its own files and call only its
// own origin, and keeps it out of frames (its buttons resolve jobs).
const uiSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// serveUI serves GET /idempotency/ui/ (the page) and the files below it.
func serveUI(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeProblem(w, http.StatusMethodNotAllowed, problemMethodNotAllowed, "Method not allowed",
			r.Method+" "+r.URL.Path+": use GET.", "")
		return nil
	}
	name := strings.TrimPrefix(r.URL.Path, uiPath)
	if name == "" {
		name = "index.html"
	}
	ctype, known := uiContentTypes[path.Ext(name)]
	var (
		body []byte
		err  error = fs.ErrNotExist
	)
	// Only plain names: the page has no subdirectories.
	if known && !strings.Contains(name, "/") {
		body, err = uiFiles.ReadFile("ui/" + name)
	}
	if err != nil {
		writeProblem(w, http.StatusNotFound, problemNotFound, "Not found", "No such file: "+r.URL.Path, "")
		return nil
	}
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Content-Security-Policy", uiSecurityPolicy)
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		w.Write(body)
	}
	return nil
}
