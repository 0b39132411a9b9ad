//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// chromium is the browser the page is tested in; ./integration/services.sh
// installs it when it is missing.
const chromium = "/usr/bin/chromium"

// startBrowsableGateway is startGatewayWith with an admin endpoint that a
// browser may open. A browser's first request for the page carries
// Sec-Fetch-Mode but neither Origin nor Referer, and Caddy's admin endpoint
// lets such a request through only when the empty origin is listed; the
// listener's own address stays listed for the page's calls.
func startBrowsableGateway(t *testing.T, b backend, site string) *gateway {
	t.Helper()
	g := &gateway{t: t, home: t.TempDir()}
	port, admin := freePort(t), freePort(t)
	g.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	g.admin = fmt.Sprintf("127.0.0.1:%d", admin)
	caddyfile := fmt.Sprintf(`{
	admin %[1]s {
		origins "" %[1]s localhost:%[2]d
	}
	auto_https off
	persist_config off
}

http://127.0.0.1:%[3]d {
%[4]s
}
`, g.admin, admin, port, strings.ReplaceAll(site, "{ledger}", b.line))
	g.config = filepath.Join(g.home, "Caddyfile")
	if err := os.WriteFile(g.config, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	g.start()
	t.Cleanup(g.stop)
	return g
}

// browserPage is one headless Chromium tab on the jobs page of a gateway.
type browserPage struct {
	t    *testing.T
	ctx  context.Context
	base string // the page's URL

	mu     sync.Mutex
	errors []string // exceptions and console errors of the page
}

// openJobsPage starts Chromium with a fresh profile and opens the jobs page
// of g. The flags keep Chromium from reaching for the network, which this
// machine does not have.
func openJobsPage(t *testing.T, g *gateway) *browserPage {
	t.Helper()
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("the browser tests need Chromium at %s (./integration/services.sh installs the Debian package chromium): %v", chromium, err)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 860),
	)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first action starts the browser, which lives as long as the
	// context of that action: ctx, not one with a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}

	p := &browserPage{t: t, ctx: ctx, base: "http://" + g.admin + "/idempotency/ui/"}
	err := chromedp.Listen(ctx, func(ev any) {
		var msg string
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			msg = "exception: " + ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				msg += " " + ev.ExceptionDetails.Exception.Description
			}
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				msg = "console.error"
				for _, arg := range ev.Args {
					msg += " " + string(arg.Value)
				}
			}
		}
		if msg != "" {
			p.mu.Lock()
			p.errors = append(p.errors, msg)
			p.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, e := range p.errors {
			t.Errorf("the page reported %s", e)
		}
	})

	nav, cancelNav := context.WithTimeout(ctx, 30*time.Second)
	defer cancelNav()
	resp, err := chromedp.Run(nav, chromedp.NavigateResponse(p.base))
	if err != nil {
		t.Fatalf("opening %s: %v", p.base, err)
	}
	if resp.Status != http.StatusOK {
		t.Fatalf("opening %s: HTTP %d", p.base, resp.Status)
	}
	return p
}

// do runs actions in the tab.
func (p *browserPage) do(actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("in the browser: %v", err)
	}
}

// waitUntil polls a JavaScript condition in the page until it holds.
func (p *browserPage) waitUntil(what, condition string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](condition,
		chromedp.WithPollingInterval(25*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	if err != nil {
		alert, _ := evalIn[string](p, `document.getElementById("alert").textContent`)
		p.t.Fatalf("waiting until %s: %v (page alert: %q)", what, err, alert)
	}
}

// evalIn evaluates a JavaScript expression in the page and decodes its
// value.
func evalIn[T any](p *browserPage, expression string) (T, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expression))
}

func (p *browserPage) eval(expression string, out any) {
	p.t.Helper()
	raw, err := evalIn[[]byte](p, expression)
	if err != nil {
		p.t.Fatalf("evaluating %s: %v", expression, err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		p.t.Fatalf("evaluating %s: %v: %s", expression, err, raw)
	}
}

// click clicks the middle of the element css selects with the mouse, as a
// person would. The page redraws its views: finding the element afresh
// each time keeps the click off a replaced one.
func (p *browserPage) click(css string) {
	p.t.Helper()
	var at struct {
		Found bool
		X, Y  float64
	}
	p.eval(fmt.Sprintf(`(() => {
		const el = document.querySelector(%q);
		if (!el) return {Found: false};
		el.scrollIntoView({block: "center"});
		const box = el.getBoundingClientRect();
		return {Found: true, X: box.left + box.width / 2, Y: box.top + box.height / 2};
	})()`, css), &at)
	if !at.Found {
		p.t.Fatalf("nothing to click at %s", css)
	}
	p.do(chromedp.MouseClickXY(at.X, at.Y))
}

// setValue fills a form field and tells the page, as typing would.
func (p *browserPage) setValue(css, value string) {
	p.t.Helper()
	p.do(chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => {
		const field = document.querySelector(%q);
		field.value = %q;
		field.dispatchEvent(new Event("input", {bubbles: true}));
		field.dispatchEvent(new Event("change", {bubbles: true}));
	})()`, css, value)))
}

// goTo sets the page's fragment, which chooses its view.
func (p *browserPage) goTo(fragment string) {
	p.t.Helper()
	p.do(chromedp.Evaluate[chromedp.Void](fmt.Sprintf("location.hash = %q", fragment)))
}

// screenshot writes a full-page PNG into $ONEJOB_SCREENSHOTS, when set.
func (p *browserPage) screenshot(name string) {
	p.t.Helper()
	dir := os.Getenv("ONEJOB_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// listedJob is a row of the page's jobs table.
type listedJob struct {
	ID, State, Provider, Attempts, CompletedBy string
}

const listedJobsJS = `[...document.querySelectorAll("#jobs tbody tr")].map((tr) => ({
	ID: tr.dataset.job,
	State: tr.cells[1].textContent,
	Provider: tr.cells[2].textContent,
	Attempts: tr.cells[3].textContent,
	CompletedBy: tr.cells[5].textContent,
}))`

func (p *browserPage) listedJobs() []listedJob {
	p.t.Helper()
	var jobs []listedJob
	p.eval(listedJobsJS, &jobs)
	return jobs
}

// countsJS reads the page's counts by state, in the order shown:
// "unknown=1 pending=0 failed=1 completed=2".
const countsJS = `[...document.querySelectorAll("#counts .count")].map((a) => a.dataset.state + "=" + a.dataset.count).join(" ")`

// queuedJobs returns the ids of the jobs in the queue of unknown jobs.
func (p *browserPage) queuedJobs() []string {
	p.t.Helper()
	var ids []string
	p.eval(`document.getElementById("queue").hidden ? [] : [...document.querySelectorAll("#queue-jobs tbody tr")].map((tr) => tr.dataset.job)`, &ids)
	return ids
}

// pointAt moves the mouse pointer over the middle of the element css
// selects, or to the page's top left corner when css is empty.
func (p *browserPage) pointAt(css string) {
	p.t.Helper()
	at := struct {
		Found bool
		X, Y  float64
	}{true, 2, 2}
	if css != "" {
		p.eval(fmt.Sprintf(`(() => {
			const el = document.querySelector(%q);
			if (!el) return {Found: false};
			const box = el.getBoundingClientRect();
			return {Found: true, X: box.left + box.width / 2, Y: box.top + box.height / 2};
		})()`, css), &at)
	}
	if !at.Found {
		p.t.Fatalf("nothing to point at at %s", css)
	}
	p.do(chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, at.X, at.Y))
}

// TestBrowserLiveRefresh: the page refreshes itself. A job an operator
// cancels through the admin API changes state on the page, and the counts
// by state with it, without a reload; while the pointer rests on the job's
// row the page holds still, and says so.
func TestBrowserLiveRefresh(t *testing.T) {
	b := pgBackend(t)
	release := make(chan struct{})
	defer close(release)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("Idempotency-Key") == "order-1" {
			<-release // past attempt_timeout: unknown
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"order":"created"}`)
	})
	g := startBrowsableGateway(t, b, site(up.addr()))
	stuck := g.post(t, "/orders", "order-1", auth, `{"sku":"A-1"}`)
	if stuck.status != http.StatusGatewayTimeout {
		t.Fatalf("order-1: %v", stuck)
	}
	if r := g.post(t, "/orders", "order-2", auth, `{"sku":"B-2"}`); r.status != http.StatusOK {
		t.Fatalf("order-2: %v", r)
	}
	id := stuck.header.Get("Idempotency-Job-Id")
	row := `#jobs tr[data-job="` + id + `"]`

	p := openJobsPage(t, g)
	p.do(chromedp.Evaluate[chromedp.Void](`window.sameDocument = true`))
	p.waitUntil("the counts are shown", countsJS+` === "unknown=1 pending=0 failed=0 completed=1"`)
	p.waitUntil("the page is live", `document.getElementById("live").dataset.live === "on"`)
	if got := p.queuedJobs(); len(got) != 1 || got[0] != id {
		t.Errorf("the queue of unknown jobs: %v, want [%s]", got, id)
	}
	p.screenshot("live.png")

	// The pointer on the job's row: the page pauses, and stays as it was
	// while the job changes, for two refreshes and more.
	p.pointAt(row)
	p.waitUntil("the page says it paused", `document.getElementById("live").dataset.live === "paused"`)
	var skipped int
	p.eval(`Number(document.getElementById("live").dataset.skipped)`, &skipped)
	if status, body := g.adminCall(t, http.MethodPost, "/idempotency/jobs/"+id+"/resolve", `{"outcome":"cancel"}`); status != http.StatusOK {
		t.Fatalf("cancel: %d %s", status, body)
	}
	p.waitUntil("two refreshes are skipped", fmt.Sprintf(`Number(document.getElementById("live").dataset.skipped) >= %d`, skipped+2))
	var state string
	p.eval(`document.querySelector('`+row+`').dataset.state`, &state)
	if state != "unknown" {
		t.Errorf("the row changed to %s under the pointer", state)
	}

	// The pointer leaves: the page catches up by itself.
	p.pointAt("")
	p.waitUntil("the job is failed on the page", `document.querySelector('`+row+`').dataset.state === "failed" && document.querySelector('`+row+`').cells[1].textContent === "failed"`)
	p.waitUntil("the counts follow", countsJS+` === "unknown=0 pending=0 failed=1 completed=1"`)
	p.waitUntil("the queue is empty", `document.getElementById("queue").hidden`)
	var same bool
	p.eval(`window.sameDocument === true && document.getElementById("live").dataset.live === "on"`, &same)
	if !same {
		t.Error("the page was reloaded, or is not live")
	}
}

// threeProviders is a site whose gateway has a primary, a fallback and a
// backup provider, each probed once at start.
func threeProviders(primary, fallback, backup string) string {
	return fmt.Sprintf(`	idempotency {
		{ledger}
		attempt_timeout 400ms
		attempt_deadline 20s
		probe POST /probe {
			every 1h
		}
		provider primary {
			reverse_proxy %s
		}
		provider fallback {
			reverse_proxy %s
		}
		provider backup {
			reverse_proxy %s
		}
	}
`, primary, fallback, backup)
}

// TestBrowserListsUnknownJob: the page lists the jobs of the ledger, newest
// first, among them one a real timeout left unknown; it filters them by
// state and provider, pages through them, and shows the providers' probes.
func TestBrowserListsUnknownJob(t *testing.T) {
	b := pgBackend(t)
	release := make(chan struct{})
	defer close(release)
	primary := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch key := r.Header.Get("Idempotency-Key"); {
		case r.URL.Path == "/probe":
		case key == "order-1003":
			<-release // stalls past attempt_timeout
		case key == "order-1002" || key == "order-1004":
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"order":"created"}`)
	})
	fallback := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("Idempotency-Key") == "order-1004" {
			http.Error(w, "overloaded too", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"order":"created by the fallback"}`)
	})
	backup := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		http.Error(w, "not configured", http.StatusInternalServerError)
	})
	g := startBrowsableGateway(t, b, threeProviders(primary.addr(), fallback.addr(), backup.addr()))
	eventually(t, "every provider was probed", func() bool {
		_, body := g.adminCall(t, http.MethodGet, "/idempotency/providers", "")
		return strings.Count(body, `"probe":{`) == 3
	})

	ids := map[string]string{}
	for _, tc := range []struct {
		key    string
		status int
	}{
		{"order-1001", http.StatusCreated},            // primary answers
		{"order-1002", http.StatusOK},                 // primary refuses, the fallback answers
		{"order-1003", http.StatusGatewayTimeout},     // primary stalls: unknown
		{"order-1004", http.StatusServiceUnavailable}, // both refuse: failed
	} {
		r := g.post(t, "/orders", tc.key, auth, `{"sku":"A-1","qty":1}`)
		if r.status != tc.status {
			t.Fatalf("%s: %v, want %d", tc.key, r, tc.status)
		}
		ids[tc.key] = r.header.Get("Idempotency-Job-Id")
	}
	if j := g.job(t, ids["order-1003"]); j.State != "unknown" {
		t.Fatalf("the timed-out job is %s, not unknown", j.State)
	}

	p := openJobsPage(t, g)
	p.waitUntil("the jobs are listed", `document.querySelectorAll("#jobs tbody tr").length === 4`)
	want := []listedJob{
		{ids["order-1004"], "failed", "fallback", "2", "—"},
		{ids["order-1003"], "unknown", "primary", "1", "—"},
		{ids["order-1002"], "completed", "fallback", "2", "#2 fallback"},
		{ids["order-1001"], "completed", "primary", "1", "#1 primary"},
	}
	if got := p.listedJobs(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("listed jobs, newest first:\n got %v\nwant %v", got, want)
	}
	// The page opens with the counts by state, unknown first, and the
	// queue of unknown jobs to settle.
	p.waitUntil("the counts are shown", countsJS+` === "unknown=1 pending=0 failed=1 completed=2"`)
	if got := p.queuedJobs(); len(got) != 1 || got[0] != ids["order-1003"] {
		t.Errorf("the queue of unknown jobs: %v, want [%s]", got, ids["order-1003"])
	}
	var queue string
	p.eval(`document.getElementById("queue").textContent`, &queue)
	if !strings.Contains(queue, "To settle: 1 unknown job") || strings.Contains(queue, "null") || strings.Contains(queue, "undefined") {
		t.Errorf("the queue reads %q", queue)
	}
	var first bool
	p.eval(`!!(document.getElementById("summary").compareDocumentPosition(document.getElementById("jobs")) & Node.DOCUMENT_POSITION_FOLLOWING)`, &first)
	if !first {
		t.Error("the counts do not come before the jobs")
	}
	p.waitUntil("the probes are shown", `document.querySelectorAll("#providers tbody tr").length === 3`)
	var probes map[string]string
	p.eval(`Object.fromEntries([...document.querySelectorAll("#providers tbody tr")].map((tr) => [tr.dataset.provider, tr.cells[1].textContent + " " + tr.cells[2].textContent]))`, &probes)
	if probes["primary"] != "passed 201" || probes["fallback"] != "passed 200" || probes["backup"] != "failed 500" {
		t.Errorf("probe table: %v", probes)
	}
	p.screenshot("jobs.png")

	// Filter by state with the form, as an operator does.
	p.setValue("#filter-state", "unknown")
	p.waitUntil("only the unknown job is listed", `location.hash === "#/?state=unknown&limit=20" && document.querySelectorAll("#jobs tbody tr").length === 1`)
	if got := p.listedJobs(); len(got) != 1 || got[0].ID != ids["order-1003"] || got[0].State != "unknown" {
		t.Errorf("state=unknown lists %v", got)
	}

	// By provider: the jobs with an attempt on the fallback.
	p.setValue("#filter-provider", "fallback")
	p.setValue("#filter-state", "")
	p.waitUntil("the fallback's jobs are listed", `location.hash === "#/?provider=fallback&limit=20" && document.querySelectorAll("#jobs tbody tr").length === 2`)
	if got := p.listedJobs(); len(got) != 2 || got[0].ID != ids["order-1004"] || got[1].ID != ids["order-1002"] {
		t.Errorf("provider=fallback lists %v", got)
	}

	// Pages of two: "Older" follows the cursor.
	p.goTo("#/?limit=2")
	p.waitUntil("the first page", `document.querySelectorAll("#jobs tbody tr").length === 2 && document.getElementById("older") !== null && !location.hash.includes("provider")`)
	if got := p.listedJobs(); len(got) != 2 || got[0].ID != ids["order-1004"] || got[1].ID != ids["order-1003"] {
		t.Errorf("first page: %v", got)
	}
	p.click("#older")
	p.waitUntil("the second page", `location.hash.includes("before=") && document.querySelectorAll("#jobs tbody tr").length === 2 && document.querySelector("#jobs tbody tr").dataset.job !== "`+ids["order-1004"]+`"`)
	if got := p.listedJobs(); len(got) != 2 || got[0].ID != ids["order-1002"] || got[1].ID != ids["order-1001"] {
		t.Errorf("second page: %v", got)
	}
	var hasOlder, hasNewest bool
	p.eval(`document.getElementById("older") !== null`, &hasOlder)
	p.eval(`document.getElementById("newest") !== null`, &hasNewest)
	if hasOlder || !hasNewest {
		t.Errorf("last page: older link %v, newest link %v", hasOlder, hasNewest)
	}
}

// timelineBar is one attempt's bar on the page's timeline, in pixels.
type timelineBar struct {
	Number      int
	State       string
	Won         bool
	Left, Right float64
	Label       string
}

// TestBrowserHedgeTimeline: the primary leaves first and returns last; the
// hedge on the fallback leaves second, returns first and wins. The job's
// timeline draws exactly that, and names the winner and the loser.
func TestBrowserHedgeTimeline(t *testing.T) {
	b := pgBackend(t)
	release := make(chan struct{})
	primary := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		<-release
		io.WriteString(w, `{"quote":"from the primary"}`)
	})
	fallback := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		time.Sleep(80 * time.Millisecond) // a bar wide enough to see
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"quote":"from the fallback"}`)
	})
	g := startBrowsableGateway(t, b, providers(primary.addr(), fallback.addr(), "attempt_timeout 10s", "hedge_after 150ms"))
	r := g.post(t, "/quotes", "quote-77", auth, `{"from":"LIS","to":"OSL"}`)
	if r.status != http.StatusOK || r.body != `{"quote":"from the fallback"}` {
		t.Fatalf("hedged answer: %v", r)
	}
	jobID := r.header.Get("Idempotency-Job-Id")
	// The primary answers only after the hedge has won; the pause only
	// makes its bar longer.
	time.AfterFunc(250*time.Millisecond, func() { close(release) })
	eventually(t, "the primary's late answer is recorded as lost", func() bool {
		j := g.job(t, jobID)
		return len(j.Attempts) == 2 && j.Attempts[0].State == "lost"
	})

	p := openJobsPage(t, g)
	p.waitUntil("the job is listed", `document.querySelector('a[href="#/job/`+jobID+`"]') !== null`)
	p.click(`a[href="#/job/` + jobID + `"]`)
	p.waitUntil("the timeline is drawn", `document.querySelectorAll("#timeline .tl-bar").length === 2`)

	var bars []timelineBar
	p.eval(`[...document.querySelectorAll("#timeline .tl-bar")].map((bar) => {
		const box = bar.getBoundingClientRect();
		return {
			Number: Number(bar.dataset.number),
			State: bar.dataset.state,
			Won: bar.classList.contains("won"),
			Left: box.left,
			Right: box.right,
			Label: bar.closest(".tl-row").textContent,
		};
	})`, &bars)
	if len(bars) != 2 {
		t.Fatalf("bars: %+v", bars)
	}
	first, hedge := bars[0], bars[1]
	if first.Number != 1 || first.State != "lost" || first.Won || !strings.Contains(first.Label, "#1 primary") || !strings.Contains(first.Label, "lost") {
		t.Errorf("the primary's bar: %+v", first)
	}
	if hedge.Number != 2 || hedge.State != "succeeded" || !hedge.Won || !strings.Contains(hedge.Label, "#2 fallback") || !strings.Contains(hedge.Label, "won") {
		t.Errorf("the hedge's bar: %+v", hedge)
	}
	if !(first.Left < hedge.Left) {
		t.Errorf("the hedge's bar starts at %.1fpx, not after the primary's at %.1fpx", hedge.Left, first.Left)
	}
	if !(hedge.Right < first.Right) {
		t.Errorf("the hedge's bar ends at %.1fpx, not before the primary's at %.1fpx", hedge.Right, first.Right)
	}
	var race map[string]string
	p.eval(`Object.fromEntries([...document.querySelectorAll("#race dt")].map((dt) => [dt.textContent, dt.nextElementSibling.textContent]))`, &race)
	if !strings.HasPrefix(race["Left"], "#1 primary at +0") || !strings.Contains(race["Left"], "then #2 fallback") ||
		!strings.HasPrefix(race["Returned"], "#2 fallback") || !strings.Contains(race["Returned"], "then #1 primary") ||
		race["Won"] != "#2 fallback" || race["Lost"] != "#1 primary" {
		t.Errorf("race summary: %v", race)
	}
	var fields map[string]string
	p.eval(`Object.fromEntries([...document.querySelectorAll("#job dt")].map((dt) => [dt.textContent, dt.nextElementSibling.textContent]))`, &fields)
	j := g.job(t, jobID)
	if fields["Fingerprint"] != j.Fingerprint || fields["Key hash"] != j.KeyHash || !strings.HasPrefix(fields["Completed by"], "#2 fallback") ||
		!strings.HasPrefix(fields["Response"], "status 200, 29 bytes, stored") {
		t.Errorf("job fields: %v", fields)
	}
	var resolvable bool
	p.eval(`document.getElementById("cancel-job") !== null`, &resolvable)
	if resolvable {
		t.Error("a completed job offers to be resolved")
	}
	p.screenshot("timeline.png")
}

// TestBrowserCancelUnblocksRetry: an operator opens the unknown job from
// the list, cancels it, confirms, and the next retry with the same key
// runs a new attempt that answers.
func TestBrowserCancelUnblocksRetry(t *testing.T) {
	b := pgBackend(t)
	release := make(chan struct{})
	defer close(release)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"attempt":"`+r.Header.Get("Idempotency-Attempt")+`"}`)
	})
	g := startBrowsableGateway(t, b, site(up.addr()))
	first := g.post(t, "/charges", "charge-9", auth, `{"amount":1200}`)
	jobID := first.header.Get("Idempotency-Job-Id")
	if first.status != http.StatusGatewayTimeout {
		t.Fatalf("first request: %v", first)
	}
	if r := g.post(t, "/charges", "charge-9", auth, `{"amount":1200}`); r.status != http.StatusConflict {
		t.Fatalf("a retry of the unknown job: %v", r)
	}

	p := openJobsPage(t, g)
	p.waitUntil("the unknown job is listed", `document.querySelector('tr[data-job="`+jobID+`"][data-state="unknown"] a') !== null`)
	p.click(`tr[data-job="` + jobID + `"] a`)
	p.waitUntil("the job is shown", `document.getElementById("cancel-job") !== null`)
	var race string
	p.eval(`document.getElementById("race").textContent`, &race)
	if !strings.Contains(race, "No answer#1 next: outcome unknown since +") || !strings.Contains(race, "Wonno attempt has won") {
		t.Errorf("race summary of the unknown job: %q", race)
	}

	// The first click only asks; going back leaves the job as it was.
	p.click("#cancel-job")
	p.waitUntil("the confirmation is asked", `!document.getElementById("confirm").hidden`)
	p.click("#confirm-no")
	p.waitUntil("the confirmation is gone", `document.getElementById("confirm").hidden`)
	if j := g.job(t, jobID); j.State != "unknown" {
		t.Fatalf("the job is %s before the cancel was confirmed", j.State)
	}

	p.click("#cancel-job")
	p.waitUntil("the confirmation is asked", `!document.getElementById("confirm").hidden`)
	p.screenshot("resolve.png")
	p.click("#confirm-yes")
	p.waitUntil("the page shows the cancelled job", `document.getElementById("job") && document.getElementById("job").dataset.state === "failed" && document.getElementById("notice") !== null`)
	var states []string
	p.eval(`[...document.querySelectorAll("#attempts tbody tr")].map((tr) => tr.dataset.state)`, &states)
	if len(states) != 1 || states[0] != "cancelled" {
		t.Errorf("attempts after the cancel: %v", states)
	}
	if j := g.job(t, jobID); j.State != "failed" || j.Attempts[0].State != "cancelled" {
		t.Errorf("the ledger after the cancel: %+v", j)
	}

	retry := g.post(t, "/charges", "charge-9", auth, `{"amount":1200}`)
	if retry.status != http.StatusOK || retry.body != `{"attempt":"2"}` || retry.header.Get("Idempotency-Job-Id") != jobID {
		t.Fatalf("the retry after the cancel: %v", retry)
	}
	p.click(".back button")
	p.waitUntil("the page shows the retry's attempt", `document.querySelectorAll("#attempts tbody tr").length === 2 && document.getElementById("job").dataset.state === "completed"`)
	p.eval(`[...document.querySelectorAll("#attempts tbody tr")].map((tr) => tr.dataset.state)`, &states)
	if len(states) != 2 || states[0] != "cancelled" || states[1] != "succeeded" {
		t.Errorf("attempts after the retry: %v", states)
	}
	if c := up.count("charge-9"); c != 2 {
		t.Errorf("the upstream got %d requests, want 2", c)
	}
}

// TestBrowserLookupSettles: the page shows an unknown attempt settled by
// its provider's lookup without anyone touching it: the job turns
// completed, the attempt is marked reconciled by lookup on the timeline
// and in the table.
func TestBrowserLookupSettles(t *testing.T) {
	b := backend{name: "memory", line: "ledger memory"}
	u := newRecordsUpstream(t, func(int) (bool, time.Duration) { return true, 6 * time.Second })
	site := strings.Replace(lookupSite(u.addr()), "attempt_deadline 2s", "attempt_deadline 4s", 1)
	g := startBrowsableGateway(t, b, site)
	first := g.post(t, "/charges", "bl-1", auth, `{}`)
	id := first.header.Get("Idempotency-Job-Id")
	if first.status != http.StatusGatewayTimeout {
		t.Fatalf("first: %v", first)
	}
	p := openJobsPage(t, g)
	p.goTo("/job/" + id)
	p.waitUntil("the job is shown unknown", `document.getElementById("job") && document.getElementById("job").dataset.state === "unknown"`)
	p.waitUntil("the lookup settles it on the page", `document.getElementById("job").dataset.state === "completed" && document.querySelector("#timeline .tl-lookup.settled") !== null`)
	var label, cell string
	p.eval(`document.querySelector("#timeline .reconciled").textContent`, &label)
	p.eval(`document.querySelector("#attempts td.reconcile").textContent`, &cell)
	if label != "lookup" || !strings.HasPrefix(cell, "settled by lookup (1 lookup, last answered 200)") {
		t.Errorf("the page shows %q on the timeline and %q in the table", label, cell)
	}
	p.screenshot("lookup.png")
}
