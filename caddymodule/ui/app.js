// The jobs page of the onejob admin API. It only calls, from the same
// origin, the endpoints documented in docs/operations.md:
//   GET  /idempotency/jobs?state=&provider=&limit=&before=
//   GET  /idempotency/jobs/<id>
//   POST /idempotency/jobs/<id>/resolve
//   GET  /idempotency/providers
//   GET  /idempotency/counts
// Views are chosen by the URL fragment: "#/?state=unknown" lists jobs,
// "#/job/<id>" shows one.
"use strict";

const API = "/idempotency";
const JOB_STATES = ["pending", "unknown", "completed", "failed"];
// COUNTED_STATES are the states the counts show, the one to act on first.
const COUNTED_STATES = ["unknown", "pending", "failed", "completed"];
// QUEUE_SIZE is how many unknown jobs the queue at the top lists.
const QUEUE_SIZE = 10;

// --- small helpers ----------------------------------------------------------

// el builds an element: el("a", {href: "#/", class: "x"}, "text", child).
// Text is always set as text, never parsed as HTML.
function el(tag, attrs, ...children) {
	const node = document.createElement(tag);
	for (const [name, value] of Object.entries(attrs || {})) {
		if (value === null || value === undefined || value === false) continue;
		if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
		else if (name === "dataset") Object.assign(node.dataset, value);
		else node.setAttribute(name, value === true ? "" : String(value));
	}
	for (const child of children.flat(Infinity)) {
		if (child === null || child === undefined || child === false) continue;
		node.append(child instanceof Node ? child : String(child));
	}
	return node;
}

function show(...nodes) {
	document.getElementById("main").replaceChildren(...nodes.filter((n) => n));
}

function alertMessage(message) {
	const box = document.getElementById("alert");
	box.textContent = message || "";
	box.hidden = !message;
}

// api calls the admin API and returns its JSON. A failure throws an Error
// whose message is the problem's "title: detail" (or Caddy's own error).
async function api(method, path, body) {
	const init = {method, headers: {Accept: "application/json"}, cache: "no-store"};
	if (body !== undefined) {
		init.headers["Content-Type"] = "application/json";
		init.body = JSON.stringify(body);
	}
	let resp;
	try {
		resp = await fetch(API + path, init);
	} catch (err) {
		throw new Error("The admin endpoint did not answer: " + err.message);
	}
	const text = await resp.text();
	let data = null;
	try {
		data = text ? JSON.parse(text) : null;
	} catch (err) {
		// not JSON: reported below if the status is an error
	}
	if (!resp.ok) {
		if (data && data.title) throw new Error(data.detail ? data.title + ": " + data.detail : data.title);
		if (data && data.error) throw new Error("HTTP " + resp.status + ": " + data.error);
		throw new Error("HTTP " + resp.status + ": " + (text.trim() || resp.statusText));
	}
	return data;
}

// parseTime reads an RFC 3339 time with its fraction (nanoseconds from Go)
// into milliseconds since the epoch, keeping sub-millisecond digits.
function parseTime(s) {
	if (!s) return null;
	const m = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$/.exec(s);
	if (!m) return Date.parse(s);
	return Date.parse(m[1] + m[3]) + (m[2] ? parseFloat("0" + m[2]) * 1000 : 0);
}

function pad(n, width) {
	return String(n).padStart(width || 2, "0");
}

// formatTime shows a time in UTC: "2026-01-02 03:04:05" (withMillis adds
// ".678").
function formatTime(s, withMillis) {
	const ms = parseTime(s);
	if (ms === null || isNaN(ms)) return "—";
	const d = new Date(ms);
	let out = d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " +
		pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds());
	if (withMillis) out += "." + pad(d.getUTCMilliseconds(), 3);
	return out;
}

// formatDuration shows milliseconds the way a person reads them.
function formatDuration(ms) {
	if (ms === 0) return "0 ms";
	if (ms < 1) return ms.toFixed(2) + " ms";
	if (ms < 10) return ms.toFixed(1) + " ms";
	if (ms < 1000) return Math.round(ms) + " ms";
	if (ms < 10000) return (ms / 1000).toFixed(2) + " s";
	if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
	const min = Math.floor(ms / 60000);
	return min + " min " + Math.round((ms - min * 60000) / 1000) + " s";
}

function formatBytes(n) {
	if (n < 1024) return n + (n === 1 ? " byte" : " bytes");
	if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
	return (n / 1024 / 1024).toFixed(1) + " MiB";
}

function badge(state, what) {
	return el("span", {class: "badge " + what + "-" + state, dataset: {state}}, state);
}

function lastAttempt(job) {
	return job.attempts && job.attempts.length ? job.attempts[job.attempts.length - 1] : null;
}

function winner(job) {
	return (job.attempts || []).find((a) => a.id === job.completed_by) || null;
}

function attemptName(a) {
	return "#" + a.number + " " + a.provider;
}

// --- staying live -------------------------------------------------------------

// The page refreshes itself by polling the admin API it already calls,
// every REFRESH_MS, rather than by a stream of server-sent events: the
// jobs of the file and memory ledgers change without any notification to
// stream, Caddy's admin endpoint is restarted on config changes (a stream
// would break with it, and would have to be re-opened and re-read anyway),
// and a poll needs no long-lived connection on the admin endpoint nor
// anything that survives an error: the next poll is the retry. The server
// counts jobs at most every few seconds however many pages poll it.
const REFRESH_MS = 2000;

// live is the state of the refreshing: the current view's refresh, and why
// it may be paused. A view redraws only what changed, and never while the
// pointer rests on a row of a table (a person reading or about to click
// it) or while the resolve form is being filled in.
const live = {
	view: 0,          // incremented by every route: a late answer for an old view is dropped
	refresh: null,    // the current view's refresh
	timer: null,
	overRow: false,   // the pointer is over a row of a table
	failed: null,     // the last refresh's error message, or null
	refreshes: 0,     // refreshes done, for the curious (and the tests)
	skipped: 0,       // refreshes skipped while paused
	updated: null,    // when the page last had fresh data
};

// follow makes refresh the current view's refresh, from now on.
function follow(view, refresh) {
	if (view !== live.view) return;
	live.refresh = refresh;
	live.failed = null;
	live.updated = new Date();
	schedule();
}

function schedule() {
	clearTimeout(live.timer);
	live.timer = setTimeout(tick, REFRESH_MS);
	showLive();
}

async function tick() {
	const refresh = live.refresh;
	if (!refresh) return;
	if (paused() || document.hidden) {
		live.skipped++;
		schedule();
		return;
	}
	try {
		await refresh();
		live.failed = null;
		live.refreshes++;
		live.updated = new Date();
	} catch (err) {
		live.failed = err.message;
	}
	if (refresh === live.refresh) schedule();
}

// paused says why the page does not redraw now, or "".
function paused() {
	if (live.overRow) return "the pointer is on a row";
	if (editing()) return "a resolution is being written";
	return "";
}

// editing reports whether the operator is in the middle of resolving a job:
// a confirmation asked, or the answer's fields touched.
function editing() {
	const confirm = document.getElementById("confirm");
	if (confirm && !confirm.hidden) return true;
	const form = document.getElementById("complete-form");
	if (!form) return false;
	return form.contains(document.activeElement) ||
		[...form.elements].some((f) => "defaultValue" in f && f.value !== f.defaultValue);
}

// showLive draws the live state in the top bar: live, paused, or failing.
function showLive() {
	const box = document.getElementById("live");
	if (!box) return;
	const why = paused();
	const state = !live.refresh ? "off" : live.failed ? "failing" : why ? "paused" : "on";
	const at = live.updated ? formatClock(live.updated) : "—";
	const text = {on: "Live", paused: "Paused", failing: "Reconnecting", off: "Not live"}[state];
	box.dataset.live = state;
	box.dataset.refreshes = live.refreshes;
	box.dataset.skipped = live.skipped;
	box.replaceChildren(el("span", {class: "live-dot", "aria-hidden": "true"}), text);
	box.title = state === "on" ? "Refreshes every " + REFRESH_MS / 1000 + " s; updated " + at :
		state === "paused" ? "Not refreshing while " + why + "; updated " + at :
		state === "failing" ? "The last refresh failed (" + live.failed + "); trying again every " + REFRESH_MS / 1000 + " s; updated " + at :
		"";
}

// formatClock shows a local time of day: "14:03:07".
function formatClock(d) {
	return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
}

// The pointer on a row of any table pauses the refreshing; leaving it, or
// the page, resumes it.
document.addEventListener("pointerover", (ev) => {
	const over = !!(ev.target instanceof Element && ev.target.closest("tbody tr"));
	if (over !== live.overRow) {
		live.overRow = over;
		showLive();
	}
});
document.documentElement.addEventListener("pointerleave", () => {
	live.overRow = false;
	showLive();
});
document.addEventListener("visibilitychange", showLive);

// drawnIn holds, for each part of a view, the data it last drew, as JSON.
const drawnIn = new WeakMap();

// changed reports whether data differs from what slot last drew, and
// remembers it: a refresh redraws only what changed.
function changed(slot, data) {
	const text = JSON.stringify(data);
	if (drawnIn.get(slot) === text) return false;
	drawnIn.set(slot, text);
	return true;
}

// --- routing ----------------------------------------------------------------

function route() {
	alertMessage("");
	const view = ++live.view;
	live.refresh = null;
	clearTimeout(live.timer);
	showLive();
	const hash = location.hash.replace(/^#/, "") || "/";
	const [path, query] = hash.split("?");
	const job = /^\/job\/([0-9a-fA-F-]+)$/.exec(path);
	const shown = job ? showJob(view, job[1]) : showJobs(view, new URLSearchParams(query || ""));
	shown.catch((err) => {
		alertMessage(err.message);
		// Keep trying: the view appears once the admin API answers.
		if (view === live.view) follow(view, () => (view === live.view ? route() : null));
	});
}

function jobsHash(params) {
	const q = new URLSearchParams();
	for (const name of ["state", "provider", "limit", "before"]) {
		if (params[name]) q.set(name, params[name]);
	}
	const s = q.toString();
	return "#/" + (s ? "?" + s : "");
}

// --- the jobs list and the providers -----------------------------------------

// showJobs lists jobs: first the counts by state and the queue of unknown
// jobs (the ones a person must settle), then the jobs the filter selects,
// then the providers. Each refresh redraws only the parts that changed.
async function showJobs(view, query) {
	const filter = {
		state: query.get("state") || "",
		provider: query.get("provider") || "",
		limit: query.get("limit") || "20",
		before: query.get("before") || "",
	};
	const q = new URLSearchParams({limit: filter.limit});
	if (filter.state) q.set("state", filter.state);
	if (filter.provider) q.set("provider", filter.provider);
	if (filter.before) q.set("before", filter.before);
	// The queue shows on the unfiltered first page, where the page opens.
	const withQueue = !filter.state && !filter.provider && !filter.before;
	const load = () => Promise.all([
		api("GET", "/jobs?" + q.toString()),
		api("GET", "/providers").catch((err) => ({error: err.message})),
		api("GET", "/counts").catch((err) => ({error: err.message})),
		withQueue ? api("GET", "/jobs?state=unknown&limit=" + QUEUE_SIZE) : null,
	]);
	const first = await load();
	if (view !== live.view) return;

	const counts = el("div", {class: "counts", id: "counts"});
	const queue = el("section", {class: "panel queue", id: "queue", hidden: true});
	const list = el("div", {class: "list"});
	const providers = el("div", {id: "providers-slot"});
	const draw = ([page, probes, tally, unknown]) => {
		if (changed(counts, tally)) counts.replaceChildren(...countsTiles(tally, filter));
		if (changed(queue, unknown)) drawQueue(queue, unknown, tally);
		if (changed(list, page)) list.replaceChildren(jobsTable(page.jobs, filter), pager(page, filter));
		if (changed(providers, probes)) providers.replaceChildren(providersPanel(probes));
	};
	show(
		el("section", {class: "panel", id: "summary"}, el("h1", {}, "Jobs"), counts),
		queue,
		el("section", {class: "panel"},
			el("h2", {}, filter.state || filter.provider ? "Jobs matching the filter" : "All jobs"),
			filterForm(filter, first[1].providers || []),
			list),
		providers);
	draw(first);
	follow(view, async () => {
		const next = await load();
		if (view === live.view) draw(next);
	});
}

// countsTiles draws the jobs by state, unknown first: each tile lists the
// jobs of its state.
function countsTiles(tally, filter) {
	if (tally.error) return [el("p", {class: "error", id: "counts-error"}, "Counts unavailable: " + tally.error)];
	const tiles = COUNTED_STATES.map((state) => {
		const n = tally.counts[state];
		const attrs = {
			href: jobsHash({state, limit: filter.limit}),
			class: "count count-" + state + (state === "unknown" && n > 0 ? " act" : "") + (filter.state === state ? " current" : ""),
			dataset: {state, count: n},
		};
		return el("a", attrs,
			el("span", {class: "count-n"}, n.toLocaleString("en")),
			el("span", {class: "count-state"}, state),
			state === "unknown" ? el("span", {class: "count-note"}, n > 0 ?
				"oldest created " + formatAge(tally.oldest_unknown_age_seconds) + " ago" : "nothing to settle") : null);
	});
	const notes = [];
	if (tally.partial) notes.push(el("p", {class: "muted"}, "Counted so far: the ledger is being counted in steps."));
	return [...tiles, ...notes];
}

// formatAge shows a number of seconds the way a person reads an age.
function formatAge(seconds) {
	if (seconds < 60) return Math.floor(seconds) + " s";
	if (seconds < 3600) return Math.floor(seconds / 60) + " min";
	if (seconds < 172800) return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
	return Math.floor(seconds / 86400) + " days";
}

// drawQueue fills the queue of unknown jobs: the jobs whose outcome is
// unknown block their key until someone settles them.
function drawQueue(queue, unknown, tally) {
	const jobs = unknown && unknown.jobs ? unknown.jobs : [];
	queue.hidden = jobs.length === 0;
	if (queue.hidden) {
		queue.replaceChildren();
		return;
	}
	const total = tally && tally.counts ? tally.counts.unknown : jobs.length;
	queue.replaceChildren(
		el("h2", {}, "To settle: ", jobs.length === 1 ? "1 unknown job" : Math.max(total, jobs.length) + " unknown jobs"),
		el("p", {class: "muted"},
			"Each blocks its key: the provider may have acted, and no retry runs until someone finds out and cancels or completes it."),
		queueTable(jobs),
		...(unknown.next ? [el("p", {}, el("a", {href: jobsHash({state: "unknown", limit: "100"}), id: "queue-all"}, "All unknown jobs »"))] : []));
}

function queueTable(jobs) {
	return el("table", {class: "jobs", id: "queue-jobs"},
		el("thead", {}, el("tr", {},
			el("th", {}, "Job"), el("th", {}, "Provider"), el("th", {class: "num"}, "Attempts"),
			el("th", {}, "Created (UTC)"), el("th", {}, "Why"))),
		el("tbody", {}, jobs.map((job) => {
			const last = lastAttempt(job);
			return el("tr", {dataset: {job: job.id, state: job.state}},
				el("td", {class: "mono"}, el("a", {href: "#/job/" + job.id, class: "job-link"}, job.id)),
				el("td", {}, last ? last.provider : "—"),
				el("td", {class: "num"}, job.attempts ? job.attempts.length : 0),
				el("td", {class: "time", title: job.created_at || ""}, formatTime(job.created_at)),
				el("td", {class: "error"}, last && last.error ? last.error : ""));
		})));
}

function filterForm(filter, providers) {
	const state = el("select", {name: "state", id: "filter-state"},
		el("option", {value: ""}, "any state"),
		JOB_STATES.map((s) => el("option", {value: s, selected: s === filter.state}, s)));
	const names = new Set(providers.map((p) => p.name).concat(["admin"]));
	const provider = el("input", {
		name: "provider", id: "filter-provider", list: "provider-names", value: filter.provider,
		placeholder: "any provider", autocomplete: "off", spellcheck: "false",
	});
	const limit = el("select", {name: "limit", id: "filter-limit"},
		["20", "50", "100", "500"].map((n) => el("option", {value: n, selected: n === filter.limit}, n + " per page")));
	const form = el("form", {class: "filters", id: "filters"},
		el("label", {}, "State ", state),
		el("label", {}, "Provider ", provider),
		el("datalist", {id: "provider-names"}, [...names].map((n) => el("option", {value: n}))),
		el("label", {}, limit),
		el("button", {type: "submit"}, "Show"),
		el("button", {type: "button", class: "quiet", id: "refresh", onclick: () => route()}, "Refresh"));
	form.addEventListener("submit", (ev) => {
		ev.preventDefault();
		location.hash = jobsHash({state: state.value, provider: provider.value.trim(), limit: limit.value});
	});
	state.addEventListener("change", () => form.requestSubmit());
	limit.addEventListener("change", () => form.requestSubmit());
	return form;
}

function jobsTable(jobs, filter) {
	if (!jobs.length) {
		return el("p", {class: "empty", id: "no-jobs"},
			filter.state || filter.provider ? "No job matches these filters." : "No jobs yet.");
	}
	return el("table", {class: "jobs", id: "jobs"},
		el("thead", {}, el("tr", {},
			el("th", {}, "Job"), el("th", {}, "State"), el("th", {}, "Provider"),
			el("th", {class: "num"}, "Attempts"), el("th", {}, "Created (UTC)"), el("th", {}, "Completed by"))),
		el("tbody", {}, jobs.map((job) => {
			const last = lastAttempt(job);
			const won = winner(job);
			return el("tr", {dataset: {job: job.id, state: job.state}},
				el("td", {class: "mono"}, el("a", {href: "#/job/" + job.id, class: "job-link"}, job.id)),
				el("td", {}, badge(job.state, "job")),
				el("td", {}, last ? last.provider : "—"),
				el("td", {class: "num"}, job.attempts ? job.attempts.length : 0),
				el("td", {class: "time", title: job.created_at || ""}, formatTime(job.created_at)),
				el("td", {}, won ? attemptName(won) : job.completed_by ? el("span", {class: "mono"}, job.completed_by) : "—"));
		})));
}

function pager(page, filter) {
	const nav = el("nav", {class: "pager"});
	if (filter.before) {
		nav.append(el("a", {href: jobsHash({...filter, before: ""}), id: "newest"}, "« Newest"));
	}
	nav.append(el("span", {class: "muted"}, page.jobs.length + (page.jobs.length === 1 ? " job" : " jobs") + ", newest first"));
	if (page.next) {
		nav.append(el("a", {href: jobsHash({...filter, before: page.next}), id: "older"}, "Older »"));
	}
	return nav;
}

function providersPanel(data) {
	const panel = el("section", {class: "panel", id: "providers"}, el("h2", {}, "Providers"));
	if (data.error) {
		panel.append(el("p", {class: "error"}, data.error));
		return panel;
	}
	if (!data.providers.length) {
		panel.append(el("p", {class: "empty"}, "No provider is configured."));
		return panel;
	}
	panel.append(el("table", {class: "providers"},
		el("thead", {}, el("tr", {},
			el("th", {}, "Provider"), el("th", {}, "Latest probe"), el("th", {class: "num"}, "Status"),
			el("th", {}, "Probed at (UTC)"), el("th", {}, "Error"),
			el("th", {title: "The idempotency handler that declares the provider: providers of the same name in two handlers are two providers"}, "Scope"))),
		el("tbody", {}, data.providers.map((p) => {
			const probe = p.probe;
			const result = !probe ? el("span", {class: "badge probe-none"}, "no probe") :
				probe.ok ? el("span", {class: "badge probe-ok"}, "passed") : el("span", {class: "badge probe-failed"}, "failed");
			return el("tr", {dataset: {provider: p.name, scope: p.scope}},
				el("td", {}, p.name),
				el("td", {}, result),
				el("td", {class: "num"}, probe && probe.status ? probe.status : "—"),
				el("td", {class: "time"}, probe ? formatTime(probe.at) : "—"),
				el("td", {class: "error"}, probe && probe.error ? probe.error : ""),
				el("td", {class: "scope"}, p.scope));
		}))));
	return panel;
}

// --- one job ------------------------------------------------------------------

// showJob shows one job; each refresh redraws it when it changed, unless
// its resolution is being written.
async function showJob(view, id) {
	const load = () => api("GET", "/jobs/" + encodeURIComponent(id));
	const job = await load();
	if (view !== live.view) return;
	renderJob(job);
	follow(view, async () => {
		const next = await load();
		if (view !== live.view || JSON.stringify(next) === drawnJob || editing()) return;
		renderJob(next);
	});
}

// drawnJob is the job the page shows, as JSON: a refresh that reads the
// same leaves the page (and a notice on it) as it is.
let drawnJob = null;

function renderJob(job, notice) {
	drawnJob = JSON.stringify(job);
	const won = winner(job);
	const response = job.response;
	const fields = [
		["State", el("span", {}, badge(job.state, "job"), " version " + job.version)],
		["Created", formatTime(job.created_at, true) + " UTC"],
		// completed_at is when the job completed, or failed.
		[job.state === "failed" ? "Failed" : "Completed", job.completed_at ? formatTime(job.completed_at, true) + " UTC" : "—"],
		["Completed by", won ? el("span", {}, attemptName(won) + " ", el("span", {class: "mono muted"}, won.id)) : "—"],
		["Response", response ? "status " + response.status + ", " + formatBytes(response.size) +
			(response.stored ? ", stored" : ", not stored (retries get 409)") : "—"],
		["Fingerprint", el("code", {class: "hash"}, job.fingerprint || "—")],
		["Key hash", el("code", {class: "hash"}, job.key_hash || "—")],
		["Owner hash", el("code", {class: "hash"}, job.owner_hash || "—")],
	];
	show(
		el("p", {class: "back"}, el("a", {href: "#/"}, "« Jobs"),
			el("button", {type: "button", class: "quiet", onclick: () => route()}, "Refresh")),
		notice ? el("p", {class: "notice", id: "notice"}, notice) : null,
		el("section", {class: "panel", id: "job", dataset: {state: job.state}},
			el("h1", {}, "Job ", el("span", {class: "mono"}, job.id)),
			el("dl", {class: "fields"}, fields.map(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]))),
		el("section", {class: "panel"},
			el("h2", {}, "Attempts"),
			timeline(job),
			attemptsTable(job)),
		resolvePanel(job));
}

// timeline draws every attempt as a bar from its start to its end on one
// time axis, so that who left first, who returned first and who won read
// at a glance.
function timeline(job) {
	const attempts = (job.attempts || []).filter((a) => a.started_at);
	if (!attempts.length) return el("p", {class: "empty"}, "No attempt has started.");
	const now = Date.now();
	const spans = attempts.map((a) => {
		const start = parseTime(a.started_at);
		const end = a.finished_at ? parseTime(a.finished_at) : null;
		return {a, start, end, drawnEnd: end !== null ? end : Math.max(now, start)};
	});
	const completed = parseTime(job.completed_at);
	const t0 = Math.min(...spans.map((s) => s.start));
	const looked = spans.map((s) => s.a.reconcile && parseTime(s.a.reconcile.last_at)).filter((t) => t);
	let t1 = Math.max(...spans.map((s) => s.drawnEnd), completed || t0, ...looked);
	if (t1 - t0 < 1) t1 = t0 + 1;
	const span = t1 - t0;
	const pct = (t) => ((t - t0) / span) * 100;
	const step = tickStep(span);

	// The axis, the grid lines and the completion mark share the tracks'
	// coordinates: percentages of the time from t0 to t1.
	const axis = el("div", {class: "tl-axis"});
	const overlay = el("div", {class: "tl-overlay"});
	for (let t = 0; t <= span + step / 1000; t += step) {
		const tick = el("span", {class: "tl-tick"}, formatDuration(t));
		tick.style.left = pct(t0 + t) + "%";
		axis.append(tick);
		const grid = el("span", {class: "tl-gridline"});
		grid.style.left = pct(t0 + t) + "%";
		overlay.append(grid);
	}
	if (completed) {
		const line = el("div", {class: "tl-completed", title: "job completed at +" + formatDuration(completed - t0)},
			el("span", {}, "completed"));
		line.style.left = pct(completed) + "%";
		overlay.append(line);
	}
	const rows = spans.map((s) => {
		const a = s.a;
		const isWinner = a.id === job.completed_by;
		const bar = el("div", {
			class: "tl-bar state-" + a.state + (isWinner ? " won" : "") + (s.end === null ? " open" : ""),
			dataset: {number: a.number, state: a.state},
			title: attemptName(a) + ": " + a.state + ", from +" + formatDuration(s.start - t0) +
				(s.end !== null ? " to +" + formatDuration(s.end - t0) : ", no end yet"),
		});
		bar.style.left = pct(s.start) + "%";
		bar.style.width = Math.max(pct(s.drawnEnd) - pct(s.start), 0.4) + "%";
		const outcome = isWinner ? "★ won" : a.state === "succeeded" ? "" : a.state === "unknown" ? "outcome unknown" : a.state;
		const note = el("span", {class: "tl-note"},
			s.end !== null ? formatDuration(s.end - s.start) : "no end yet",
			outcome ? el("strong", {class: isWinner ? "tl-won" : "tl-" + a.state}, outcome) : null);
		note.style.left = pct(s.drawnEnd) + "%";
		// The last lookup of an unknown attempt: a mark where it ended.
		let lookup = null;
		if (a.reconcile && a.reconcile.last_at) {
			lookup = el("span", {class: "tl-lookup" + (a.reconciled === "lookup" ? " settled" : ""),
				title: reconcileText(a)}, "⌕");
			lookup.style.left = pct(parseTime(a.reconcile.last_at)) + "%";
		}
		return el("div", {class: "tl-row", dataset: {number: a.number}},
			el("div", {class: "tl-label"}, el("span", {class: "tl-name"}, attemptName(a)), badge(a.state, "attempt"),
				a.reconciled ? el("span", {class: "reconciled", title: "settled by reconciliation"}, a.reconciled) : null),
			el("div", {class: "tl-track"}, bar, note, lookup));
	});
	return el("figure", {class: "timeline", id: "timeline"},
		el("div", {class: "tl-head"}, el("div", {class: "tl-axis-label"}, "time since the first attempt left"), axis),
		el("div", {class: "tl-body"}, overlay, rows),
		raceSummary(spans, job, t0));
}

// tickStep picks an axis step of 1, 2 or 5 times a power of ten, for
// about five ticks.
function tickStep(span) {
	const raw = span / 5;
	const power = Math.pow(10, Math.floor(Math.log10(raw)));
	for (const m of [1, 2, 5, 10]) {
		if (m * power >= raw) return m * power;
	}
	return 10 * power;
}

// ANSWERED are the attempt states that come from an answer (or a definitive
// failure); the others never returned one.
const ANSWERED = ["succeeded", "lost", "failed"];

function raceSummary(spans, job, t0) {
	const at = (t) => "+" + formatDuration(t - t0);
	const left = [...spans].sort((x, y) => x.start - y.start);
	const returned = spans.filter((s) => s.end !== null && ANSWERED.includes(s.a.state)).sort((x, y) => x.end - y.end);
	const silent = spans.filter((s) => !returned.includes(s));
	const won = spans.find((s) => s.a.id === job.completed_by);
	const lost = spans.filter((s) => s.a.state === "lost");
	const list = (items, time) => items.map((s) => attemptName(s.a) + " at " + at(time(s))).join(", then ");
	const silence = (s) => attemptName(s.a) + (
		s.a.state === "starting" ? ": still running" :
		s.a.state === "cancelled" ? ": cancelled" + (s.end !== null ? " at " + at(s.end) : "") :
		": outcome unknown" + (s.end !== null ? " since " + at(s.end) : ""));
	return el("dl", {class: "race", id: "race"},
		el("dt", {}, "Left"), el("dd", {}, list(left, (s) => s.start)),
		el("dt", {}, "Returned"), el("dd", {}, returned.length ? list(returned, (s) => s.end) : "no answer yet"),
		silent.length ? [el("dt", {}, "No answer"), el("dd", {}, silent.map(silence).join("; "))] : null,
		el("dt", {}, "Won"), el("dd", {id: "race-won"}, won ? attemptName(won.a) : "no attempt has won"),
		lost.length ? [el("dt", {}, "Lost"), el("dd", {id: "race-lost"}, lost.map((s) => attemptName(s.a)).join(", "))] : null);
}

// reconcileText tells what reconciliation did on an attempt: the re-send
// that won its job, or its lookups (how many, the last answer, the next).
function reconcileText(a) {
	if (a.reconciled === "resend") return "re-sent to the deduplicating provider: its answer settled the job";
	const r = a.reconcile;
	if (!r) return a.resend ? "a re-send" : "";
	const tries = r.tries + (r.tries === 1 ? " lookup" : " lookups");
	const last = r.last_status ? "last answered " + r.last_status : "last got no answer";
	if (a.reconciled === "lookup") return "settled by lookup (" + tries + ", " + last + ")";
	return tries + ", " + last + (r.next_at ? "; next at " + formatTime(r.next_at, true) : "");
}

function attemptsTable(job) {
	if (!job.attempts || !job.attempts.length) return null;
	const t0 = Math.min(...job.attempts.map((a) => parseTime(a.started_at)));
	return el("table", {class: "attempts", id: "attempts"},
		el("thead", {}, el("tr", {},
			el("th", {class: "num"}, "#"), el("th", {}, "Attempt"), el("th", {}, "Provider"), el("th", {}, "State"),
			el("th", {}, "Started (UTC)"), el("th", {class: "num"}, "Took"), el("th", {}, "Error"),
			el("th", {}, "Reconciliation"))),
		el("tbody", {}, job.attempts.map((a) => {
			const start = parseTime(a.started_at);
			const end = parseTime(a.finished_at);
			return el("tr", {dataset: {number: a.number, state: a.state}},
				el("td", {class: "num"}, a.number),
				el("td", {class: "mono"}, a.id, a.id === job.completed_by ? el("span", {class: "won-tag"}, "won") : null),
				el("td", {}, a.provider),
				el("td", {}, badge(a.state, "attempt")),
				el("td", {class: "time", title: a.started_at || ""}, formatTime(a.started_at, true),
					start !== t0 ? el("span", {class: "muted"}, " (+" + formatDuration(start - t0) + ")") : null),
				el("td", {class: "num"}, end !== null ? formatDuration(end - start) : "—"),
				el("td", {class: "error"}, a.error || ""),
				el("td", {class: "reconcile"}, reconcileText(a)));
		})));
}

// --- resolving -------------------------------------------------------------

function resolvePanel(job) {
	const panel = el("section", {class: "panel", id: "resolve"}, el("h2", {}, "Resolve"));
	if (job.state === "completed") {
		panel.append(el("p", {class: "muted"}, "This job has completed; its result cannot be changed."));
		return panel;
	}
	panel.append(el("p", {class: "muted"},
		"Settle this job out of band when you know what happened at the provider. " +
		"Cancel: the job becomes failed, its starting and unknown attempts cancelled, and the next retry starts a new attempt. " +
		"Complete: retries get the answer below; an attempt that returns later loses."));

	const confirmBox = el("div", {class: "confirm", id: "confirm", hidden: true});
	// ask shows the confirmation below the control that asked for it.
	const ask = (asker, question, yesLabel, action) => {
		confirmBox.replaceChildren(
			el("p", {}, question),
			el("button", {type: "button", class: "danger", id: "confirm-yes", onclick: async (ev) => {
				ev.target.disabled = true;
				try {
					await action();
				} catch (err) {
					alertMessage(err.message);
					ev.target.disabled = false;
				}
			}}, yesLabel),
			el("button", {type: "button", class: "quiet", id: "confirm-no", onclick: () => { confirmBox.hidden = true; }}, "Back"));
		asker.after(confirmBox);
		confirmBox.hidden = false;
		confirmBox.querySelector("#confirm-no").focus();
	};

	const actions = el("div", {class: "actions"});
	const cancel = el("button", {type: "button", id: "cancel-job", onclick: () => ask(actions,
		"Cancel job " + job.id + "? It becomes failed; a retry with its key starts a new attempt.",
		"Yes, cancel the job",
		async () => {
			const out = await api("POST", "/jobs/" + job.id + "/resolve", {outcome: "cancel"});
			alertMessage("");
			renderJob(out, "Job cancelled: it is now " + out.state + " (version " + out.version + ").");
		})}, "Cancel job…");

	const status = el("input", {type: "number", id: "complete-status", min: 100, max: 599, value: 200, required: true});
	const ctype = el("input", {type: "text", id: "complete-type", value: "application/json", spellcheck: "false"});
	const body = el("textarea", {id: "complete-body", rows: 4, spellcheck: "false", placeholder: "{\"ok\":true}"});
	const form = el("form", {class: "complete", id: "complete-form"},
		el("label", {}, "Status ", status),
		el("label", {}, "Content-Type ", ctype),
		el("label", {class: "wide"}, "Body ", body),
		el("button", {type: "submit"}, "Complete job…"));
	form.addEventListener("submit", (ev) => {
		ev.preventDefault();
		const code = Number(status.value);
		if (!Number.isInteger(code) || code < 100 || code > 599) {
			alertMessage("The status must be a number from 100 to 599.");
			return;
		}
		const bytes = new TextEncoder().encode(body.value);
		const response = {status: code, body: base64(bytes)};
		if (ctype.value.trim()) response.headers = {"Content-Type": [ctype.value.trim()]};
		ask(form, "Complete job " + job.id + " with status " + code + " and " + formatBytes(bytes.length) +
			"? Retries will get this answer.", "Yes, complete the job", async () => {
			const out = await api("POST", "/jobs/" + job.id + "/resolve", {outcome: "complete", response});
			alertMessage("");
			renderJob(out, "Job completed by hand: retries now get status " + code + ".");
		});
	});

	actions.append(cancel);
	panel.append(actions, form, confirmBox);
	return panel;
}

function base64(bytes) {
	let s = "";
	for (let i = 0; i < bytes.length; i += 0x8000) {
		s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
	}
	return btoa(s);
}

// --- start -------------------------------------------------------------------

document.getElementById("endpoint").textContent = location.host;
showLive();
window.addEventListener("hashchange", route);
route();
