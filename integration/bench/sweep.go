package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/file"
	"github.com/onejob/onejob/ledger/postgres"
	"github.com/onejob/onejob/proxy"
)

// The sweep measures the gateway with many jobs already stored in its
// ledger (the file ledger and PostgreSQL): replays of stored jobs picked
// at random, replays of the newest stored jobs, and fresh keys, at each
// size of -sweep. The jobs are stored
// directly in the ledger, not through the gateway, and the ledger grows
// from one size to the next. The memory ledger cannot be filled before a
// gateway process starts: BenchmarkPreloaded measures it in process.

// sweepTarget is what the sweep asks of each ledger: the CPU per request
// at every size within 15% of the first size's, for each series.
var sweepTarget = target{cpuRatio: 1.15}

// sweepWorkers is how many goroutines store jobs at once (preload): the
// memory ledger takes them one by one, as a gateway's requests.
const sweepWorkers = 256

// storedPrefix names the stored jobs' keys: <storedPrefix>-1, -2, ...
const storedPrefix = "stored"

func storedKey(i int) string { return storedPrefix + "-" + strconv.Itoa(i) }

// recentJobs is how many of the newest stored jobs the sweep's recent
// series replays (request.lua's recent mode): retries come soon after their
// first request, and this many jobs are the working set of the sweep's
// first size, so that the series measures what the ledger's size costs
// and not what the disk does.
const recentJobs = 10_000

// parseSizes reads -sweep: growing numbers of jobs, comma-separated; ""
// is none.
func parseSizes(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var sizes []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-sweep: %q is not a number of jobs", f)
		}
		if len(sizes) > 0 && n <= sizes[len(sizes)-1] {
			return nil, fmt.Errorf("-sweep: the sizes must grow: %d after %d", n, sizes[len(sizes)-1])
		}
		sizes = append(sizes, n)
	}
	return sizes, nil
}

// jobsLabel writes a number of jobs as the sweep's series names do: 10k,
// 1M.
func jobsLabel(n int) string {
	switch {
	case n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "M"
	case n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

// stored describes the jobs the sweep stores: each reserved as the
// gateway reserves wrk's request, with key i, and completed with the
// answer the gateway stores for it.
type stored struct {
	params  ledger.ReserveParams // without ids and key hash
	answer  ledger.Response
	keyHash func(i int) []byte
}

// store reserves and completes the job of key i, and returns its id.
func (s stored) store(ctx context.Context, l ledger.Ledger, i int) (string, error) {
	p := s.params.WithNewIDs()
	p.KeyHash = s.keyHash(i)
	r, err := l.Reserve(ctx, p)
	if err != nil {
		return "", fmt.Errorf("job %d: reserve: %w", i, err)
	}
	if r.Outcome != ledger.Created {
		return "", fmt.Errorf("job %d: reserve: %v, want created", i, r.Outcome)
	}
	c, err := l.Complete(ctx, r.Attempt.Ref(), s.answer)
	if err != nil {
		return "", fmt.Errorf("job %d: complete: %w", i, err)
	}
	if !c.Won {
		return "", fmt.Errorf("job %d: complete: lost, want won", i)
	}
	return r.Job.ID, nil
}

// preload stores the jobs of keys from to to (both included) in l, from
// workers goroutines at once.
func preload(ctx context.Context, l ledger.Ledger, s stored, from, to, workers int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	next.Store(int64(from))
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i <= to && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				if _, err := s.store(ctx, l, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// importer is a ledger that stores whole jobs at once (the file ledger).
type importer interface {
	Import(jobs []*ledger.Job) error
}

// preloadImport stores the jobs of keys from to to (both included) in l
// as preload does, but the first through the ledger's transitions and the
// rest as copies of it, with their own ids and keys, imported a batch at
// a time: ten million jobs in minutes.
func preloadImport(ctx context.Context, l ledger.Ledger, imp importer, s stored, from, to int) error {
	if from > to {
		return nil
	}
	id, err := s.store(ctx, l, from)
	if err != nil {
		return err
	}
	model, err := l.Job(ctx, id)
	if err != nil {
		return err
	}
	model.ReadAt = time.Time{}
	const chunk = 10000
	for i := from + 1; i <= to; i += chunk {
		jobs := make([]*ledger.Job, 0, chunk)
		for k := i; k < i+chunk && k <= to; k++ {
			j := model.Clone()
			j.ID, j.KeyHash = ledger.NewID(), s.keyHash(k)
			a := &j.Attempts[0]
			a.ID, a.JobID = ledger.NewID(), j.ID
			j.CompletedBy = a.ID
			jobs = append(jobs, j)
		}
		if err := imp.Import(jobs); err != nil {
			return err
		}
	}
	return nil
}

// send posts wrk's request (request.lua) with key to the gateway at url
// and returns its answer.
func send(url, key string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, url+"/charges", strings.NewReader(`{"amount":4200,"currency":"eur"}`))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer bench")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// fileSite is the site block of a gateway on the file ledger at path,
// with -sweep-cache as its cache_size.
func fileSite(cfg config, up *upstream, path string) string {
	ledgerFile := "ledger file " + path
	if cfg.sweepCache != "" {
		ledgerFile += " {\n\t\t\tcache_size " + cfg.sweepCache + "\n\t\t}"
	}
	return gatewaySite(up, ledgerFile)
}

// learn has the gateway make one job, for wrk's request, on a file ledger
// of its own, and reads it back: the sweep stores its jobs as the gateway
// reserved that one (owner, fingerprint and how it was made, retention,
// provider and lease), with the answer it stored. Only the key differs,
// hashed as the gateway hashes keys without an owner_secret (checked on
// the job read back).
func learn(cfg config, up *upstream) (stored, error) {
	var s stored
	path := filepath.Join(cfg.work, "sweep-learn", "ledger.db")
	site := fileSite(cfg, up, path)
	srv, err := startServer(cfg, cfg.gateway, "sweep-learn", "", site)
	if err != nil {
		return s, err
	}
	const key = "sweep-learn"
	status, body, err := send(srv.url, key)
	srv.stop()
	if err != nil {
		return s, err
	}
	if status != http.StatusOK || body != answer {
		return s, fmt.Errorf("the gateway answered %d %q, want 200 %q", status, body, answer)
	}
	ctx := context.Background()
	l, err := file.Open(path, file.Options{})
	if err != nil {
		return s, err
	}
	defer l.Close()
	page, err := l.Jobs(ctx, ledger.JobQuery{Limit: 2})
	if err != nil {
		return s, err
	}
	if len(page.Jobs) != 1 {
		return s, fmt.Errorf("the gateway's ledger holds %d jobs, want 1", len(page.Jobs))
	}
	j, err := l.Job(ctx, page.Jobs[0].ID)
	if err != nil {
		return s, err
	}
	hasher := proxy.NewHasher(nil)
	switch {
	case !bytes.Equal(j.KeyHash, hasher.Key(key)):
		return s, errors.New("the gateway's job does not have the key hash the bench makes (proxy.Hasher without a secret)")
	case j.State != ledger.JobCompleted || j.Response == nil || !j.Response.Stored || len(j.Attempts) != 1:
		return s, fmt.Errorf("the gateway's job is %s with %d attempts, want completed with its answer stored and one attempt", j.State, len(j.Attempts))
	}
	a := j.Attempts[0]
	s.params = ledger.ReserveParams{
		OwnerHash:          j.OwnerHash,
		Fingerprint:        j.Fingerprint,
		FingerprintVersion: j.FingerprintVersion,
		FingerprintScheme:  j.FingerprintScheme,
		Retention:          j.Retention,
		Attempt:            ledger.NextAttempt{Provider: a.Provider, Lease: a.Deadline.Sub(a.StartedAt)},
	}
	s.answer = *j.Response
	s.answer = padAnswer(s.answer, cfg.sweepAnswer)
	s.keyHash = func(i int) []byte { return hasher.Key(storedKey(i)) }
	return s, nil
}

// padAnswer returns a, its body grown to size bytes by a line of random
// text after the JSON: an answer of the size asked for that compresses no
// better than a model's, the same at every run (a ledger kept with
// -sweep-dir holds it). Its Content-Length, when it has one, says the
// new size. A body already as large is kept.
func padAnswer(a ledger.Response, size int) ledger.Response {
	pad := size - len(a.Body)
	if pad <= 0 {
		return a
	}
	noise := make([]byte, base64.StdEncoding.DecodedLen(pad)+3)
	rng := rand.NewChaCha8([32]byte{})
	rng.Read(noise)
	text := append([]byte("\n"), base64.StdEncoding.EncodeToString(noise)...)
	a.Body = append(bytes.Clone(a.Body), text[:pad]...)
	a.Size = int64(len(a.Body))
	a.Header = http.Header(a.Header).Clone()
	if _, ok := a.Header["Content-Length"]; ok {
		a.Header["Content-Length"] = []string{strconv.Itoa(len(a.Body))}
	}
	return a
}

// sweepPoint is what the sweep found on one ledger at one size.
type sweepPoint struct {
	ledger   string
	size     int
	jobs     int           // jobs in the ledger when the gateway started
	after    int           // and when it stopped (the fresh series added some)
	added    int           // jobs stored directly before the gateway started
	load     time.Duration // the time it took, until the ledger was ready
	disk     int64         // bytes: the file ledger's files, or PostgreSQL's tables with their indexes
	open     time.Duration // file.Open of the ledger, once loaded (the file ledger); 0: not measured
	start    time.Duration // from starting the gateway to its answer to a replay of a stored job
	sweepLag float64       // seconds since the gateway's sweeper completed a pass, after the runs
	memory   sweepMemory   // the gateway's, after the runs
	rows     []result      // the replay series, the recent one, then the fresh one
}

// runSweep measures the sweep on the file ledger, then on PostgreSQL
// (with -postgres). On an error it returns what it measured before.
func runSweep(cfg config, up *upstream) ([]sweepPoint, error) {
	// The profiles are the main series': a sweep's extra runs would
	// grow its ledger and its time.
	cfg.profiles = ""
	run := fmt.Sprintf("%x", time.Now().UnixNano())
	s, err := learn(cfg, up)
	if err != nil {
		return nil, fmt.Errorf("bench: sweep: learning the gateway's reservation: %w", err)
	}
	var points []sweepPoint
	if cfg.only.MatchString("sweep_file") {
		if points, err = sweepFile(cfg, up, s, run); err != nil {
			return points, fmt.Errorf("bench: sweep: file ledger: %w", err)
		}
	}
	switch {
	case !cfg.only.MatchString("sweep_postgres"):
		return points, nil
	case cfg.postgres == "":
		log.Printf("no PostgreSQL (-postgres): skipping its sweep")
		return points, nil
	}
	more, err := sweepPostgres(cfg, up, s, run)
	points = append(points, more...)
	if err != nil {
		return points, fmt.Errorf("bench: sweep: PostgreSQL: %w", err)
	}
	return points, nil
}

// sweepFile stores the jobs in a file ledger with file.Open, grows it
// from one size to the next, and measures the gateway on it at each.
func sweepFile(cfg config, up *upstream, s stored, run string) ([]sweepPoint, error) {
	ctx := context.Background()
	dir := filepath.Join(cfg.work, "sweep-file")
	if cfg.sweepDir != "" {
		dir = cfg.sweepDir
	}
	path := filepath.Join(dir, "ledger.db")
	site := fileSite(cfg, up, path)
	var points []sweepPoint
	jobs, keys, err := keptSweep(dir)
	if err != nil {
		return nil, err
	}
	for _, size := range cfg.sweep {
		// At least the newest recentJobs are stored at every point, also
		// in a store kept from an earlier run: the recent series replays
		// the newest jobs, not the ones the earlier runs' fresh series
		// and compactions have since buried.
		p := sweepPoint{ledger: "file", size: size, added: max(size-jobs, recentJobs)}
		log.Printf("sweep: storing %d jobs in the file ledger (%d there)", p.added, jobs)
		l, err := file.Open(path, file.Options{})
		if err != nil {
			return points, err
		}
		began := time.Now()
		// As a ledger that grew over days: the older jobs imported and
		// then settled, as the background compactions leave them once
		// they have caught up (as PostgreSQL's sweep runs VACUUM), and the
		// newest recentJobs stored after them through the ledger's
		// transitions, where a ledger's newest jobs are (its memtable and
		// upper levels, not yet compacted with the rest).
		older := max(p.added-recentJobs, 0)
		err = preloadImport(ctx, l, l, s, keys+1, keys+older)
		if err == nil && older > 0 {
			err = l.Settle(ctx)
		}
		if err == nil {
			err = preload(ctx, l, s, keys+older+1, keys+p.added, sweepWorkers)
		}
		p.load = time.Since(began)
		if cerr := l.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return points, fmt.Errorf("storing jobs: %w", err)
		}
		keys += p.added
		p.jobs = jobs + p.added
		if err := keepSweep(dir, p.jobs, keys); err != nil {
			return points, err
		}
		began = time.Now()
		if l, err = file.Open(path, file.Options{}); err != nil {
			return points, err
		}
		p.open = time.Since(began)
		if err := l.Close(); err != nil {
			return points, err
		}
		// The ledger's directory holds the ledger only, whatever files it
		// keeps there.
		if p.disk, err = file.Size(dir); err != nil {
			return points, err
		}
		if err := sweepAt(cfg, up, site, keys, &p, run, string(s.answer.Body)); err != nil {
			return points, err
		}
		points = append(points, p)
		jobs = p.after
		if err := keepSweep(dir, jobs, keys); err != nil {
			return points, err
		}
	}
	return points, nil
}

// keptSweep reads how many jobs, and how many of them stored directly
// (storedKey 1 to keys), the file ledger in dir holds, as keepSweep wrote
// them: none when dir holds no ledger.
func keptSweep(dir string) (jobs, keys int, err error) {
	b, err := os.ReadFile(filepath.Join(dir, "sweep-jobs"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	if _, err := fmt.Sscanf(string(b), "%d %d", &jobs, &keys); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", filepath.Join(dir, "sweep-jobs"), err)
	}
	return jobs, keys, nil
}

// keepSweep records beside the sweep's ledger what it holds, for the next
// run with -sweep-dir.
func keepSweep(dir string, jobs, keys int) error {
	return os.WriteFile(filepath.Join(dir, "sweep-jobs"), fmt.Appendf(nil, "%d %d\n", jobs, keys), 0o644)
}

// sweepSchema is the PostgreSQL schema of the sweep's ledger, dropped
// before and after.
const sweepSchema = "sweep"

// sweepPostgres stores one job through the ledger, then copies it with
// SQL once per key with fsync off, and measures the gateway on the
// ledger, durable, at each size.
func sweepPostgres(cfg config, up *upstream, s stored, run string) (points []sweepPoint, err error) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, cfg.postgres)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	start, err := readPostgres(ctx, conn)
	if err != nil {
		return nil, err
	}
	defer func() {
		if rerr := setPostgres(ctx, conn, start); rerr != nil {
			err = errors.Join(err, fmt.Errorf("restoring fsync and synchronous_commit: %w", rerr))
		}
		if derr := dropSweepSchemas(ctx, conn); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	if err := dropSweepSchemas(ctx, conn); err != nil {
		return nil, err
	}
	if err := setPostgres(ctx, conn, levels[nondurable].postgres); err != nil {
		return nil, err
	}
	l, err := postgres.Open(ctx, cfg.postgres, postgres.Options{Schema: sweepSchema})
	if err != nil {
		return nil, err
	}
	template, err := s.store(ctx, l, 1)
	l.Close()
	if err != nil {
		return nil, fmt.Errorf("storing the first job: %w", err)
	}
	pg := "ledger postgres " + withParam(cfg.postgres, "pool_max_conns", strconv.Itoa(cfg.connections)) + " " + sweepSchema
	site := gatewaySite(up, pg)
	jobs, keys := 1, 1
	for _, size := range cfg.sweep {
		p := sweepPoint{ledger: "postgres", size: size, added: max(size-jobs, 0)}
		log.Printf("sweep: storing %d jobs in PostgreSQL (%d there)", p.added, jobs)
		if err := setPostgres(ctx, conn, levels[nondurable].postgres); err != nil {
			return points, err
		}
		began := time.Now()
		if err := copyJob(ctx, conn, s, template, keys+1, keys+p.added); err != nil {
			return points, fmt.Errorf("storing jobs: %w", err)
		}
		// Statistics and the visibility map as autovacuum would leave
		// them on a ledger that grew over days; then durable, as the other
		// PostgreSQL series run (setPostgres checkpoints).
		if _, err := conn.Exec(ctx, "VACUUM (ANALYZE) "+sweepSchema+".jobs, "+sweepSchema+".attempts"); err != nil {
			return points, err
		}
		if err := setPostgres(ctx, conn, levels[durable].postgres); err != nil {
			return points, err
		}
		p.load = time.Since(began)
		keys += p.added
		p.jobs = jobs + p.added
		if err := conn.QueryRow(ctx, "SELECT pg_total_relation_size($1) + pg_total_relation_size($2)",
			sweepSchema+".jobs", sweepSchema+".attempts").Scan(&p.disk); err != nil {
			return points, err
		}
		if err := sweepAt(cfg, up, site, keys, &p, run, string(s.answer.Body)); err != nil {
			return points, err
		}
		points = append(points, p)
		jobs = p.after
	}
	return points, nil
}

// copyJob copies the job template, stored through the ledger, for the
// keys from to to: every column of the tables as the migrations and
// expansions define them (ledger/postgres/migrations, expansions), with
// a new job id, key hash and attempt id. Each batch is one transaction.
func copyJob(ctx context.Context, conn *pgx.Conn, s stored, template string, from, to int) error {
	const batch = 50_000
	for lo := from; lo <= to; lo += batch {
		hi := min(lo+batch-1, to)
		var ids, attempts []string
		var keys [][]byte
		for i := lo; i <= hi; i++ {
			ids, attempts, keys = append(ids, ledger.NewID()), append(attempts, ledger.NewID()), append(keys, s.keyHash(i))
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO `+sweepSchema+`.jobs (id, owner_hash, key_hash, fingerprint,
				fingerprint_version, fingerprint_scheme, state, version, completed_by, attempt_count, retention,
				created_at, completed_at, expires_at, lease_until, response_status, response_header,
				response_body, response_size, response_stored)
			SELECT n.id::uuid, t.owner_hash, n.key_hash, t.fingerprint,
				t.fingerprint_version, t.fingerprint_scheme, t.state, t.version, n.attempt::uuid, t.attempt_count, t.retention,
				t.created_at, t.completed_at, t.expires_at, t.lease_until, t.response_status, t.response_header,
				t.response_body, t.response_size, t.response_stored
			FROM `+sweepSchema+`.jobs t, unnest($2::text[], $3::text[], $4::bytea[]) AS n(id, attempt, key_hash)
			WHERE t.id = $1::text::uuid`, template, ids, attempts, keys)
			if err != nil {
				return err
			}
			if tag.RowsAffected() != int64(len(ids)) {
				return fmt.Errorf("%d jobs stored, want %d", tag.RowsAffected(), len(ids))
			}
			tag, err = tx.Exec(ctx, `INSERT INTO `+sweepSchema+`.attempts (id, job_id, number, provider, state,
				job_version, started_at, deadline, finished_at, error, resend, lookup_tries, lookup_last_status,
				lookup_last_at, lookup_next_at, lookup_settled, lookup_holder, lookup_until)
			SELECT n.attempt::uuid, n.id::uuid, a.number, a.provider, a.state,
				a.job_version, a.started_at, a.deadline, a.finished_at, a.error, a.resend, a.lookup_tries, a.lookup_last_status,
				a.lookup_last_at, a.lookup_next_at, a.lookup_settled, a.lookup_holder, a.lookup_until
			FROM `+sweepSchema+`.attempts a, unnest($2::text[], $3::text[]) AS n(id, attempt)
			WHERE a.job_id = $1::text::uuid`, template, ids, attempts)
			if err == nil && tag.RowsAffected() != int64(len(ids)) {
				err = fmt.Errorf("%d attempts stored, want %d", tag.RowsAffected(), len(ids))
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// dropSweepSchemas drops the sweep's schema and its functions' schemas.
func dropSweepSchemas(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname = $1 OR nspname ~ ('^' || $1 || '_fn[0-9]+$')`, sweepSchema)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, name := range names {
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			return fmt.Errorf("dropping schema %s: %w", name, err)
		}
	}
	return nil
}

// sweepAt starts the gateway on a ledger that holds p.jobs jobs, those of
// keys 1 to keys stored beforehand, times its start until it answers a
// replay of one, and measures replays of stored jobs picked at random,
// replays of the newest recentJobs of them, then fresh keys, with the gateway's sweeper running as it runs by
// default.
func sweepAt(cfg config, up *upstream, site string, keys int, p *sweepPoint, run, want string) error {
	name := "sweep_" + p.ledger + "_" + jobsLabel(p.size)
	hits := up.hits.Load()
	began := time.Now()
	srv, err := startServer(cfg, cfg.gateway, name, "", site)
	if err != nil {
		return err
	}
	defer srv.stop()
	status, body, err := send(srv.url, storedKey(1))
	if err != nil {
		return fmt.Errorf("a replay of a stored job: %w; the gateway's log:\n%s", err, srv.output())
	}
	if status != http.StatusOK || body != want {
		return fmt.Errorf("a replay of a stored job: the gateway answered %d %.80q, want 200 %.80q", status, body, want)
	}
	p.start = time.Since(began)
	for _, kind := range []struct{ suffix, mode string }{{"replay", "stored"}, {"recent", "recent"}, {"fresh", "fresh"}} {
		s := series{name: name + "_" + kind.suffix, mode: kind.mode, prefix: storedPrefix, keys: keys}
		m, err := measureOn(cfg, up, srv, s, run)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		r := m.result(s.name)
		if first := cfg.sweep[0]; p.size != first {
			r.baseline, r.target = "sweep_"+p.ledger+"_"+jobsLabel(first)+"_"+kind.suffix, sweepTarget
		}
		p.rows = append(p.rows, r)
	}
	p.sweepLag = metric(srv.admin, "caddy_idempotency_ledger_sweep_lag_seconds")
	p.memory = memoryOf(srv)
	// Every fresh request reached the upstream once and made one job; no
	// replay did (measureOn checks).
	p.after = p.jobs + int(up.hits.Load()-hits)
	return nil
}

// sweepMemory is where a gateway's resident memory is: the peak and now
// (VmHWM, VmRSS), now in anonymous pages (the Go heap, the ledger's cache
// and memtables, which Pebble allocates outside the Go heap) and in pages
// of files (the binary's code and data), the Go heap in use and all the Go
// runtime holds of the system, and the ledger's caches in use (its
// Storage).
type sweepMemory struct {
	peak, rss, anon, file, heap, goSys, cache int64
}

func memoryOf(srv *server) sweepMemory {
	pid := srv.cmd.Process.Pid
	return sweepMemory{
		peak:  srv.peakRSS(),
		rss:   srv.rss(),
		anon:  procStatus(pid, "RssAnon:"),
		file:  procStatus(pid, "RssFile:"),
		heap:  int64(metric(srv.admin, "go_memstats_heap_inuse_bytes")),
		goSys: int64(metric(srv.admin, "go_memstats_sys_bytes")),
		cache: int64(metric(srv.admin, "caddy_idempotency_ledger_cache_bytes")),
	}
}

// sweepRows returns the series of the sweep's points, for the table.
func sweepRows(points []sweepPoint) []result {
	var rows []result
	for _, p := range points {
		rows = append(rows, p.rows...)
	}
	return rows
}

// printSweep prints one line per ledger and size: the jobs, how they were
// stored, the ledger's size and start, and the rates and CPU of its
// series (their targets are in the table).
func printSweep(w io.Writer, points []sweepPoint) {
	if len(points) == 0 {
		return
	}
	fmt.Fprintf(w, "\nsweep: jobs stored in the ledger directly, then through the gateway (its sweeper running) replays of stored jobs picked at random, of the newest %d, and fresh keys\n", recentJobs)
	fmt.Fprintf(w, "%-9s %8s %8s %8s %7s %8s %9s %8s %8s %8s %10s %9s %10s %9s %10s %9s\n",
		"ledger", "jobs", "after", "stored", "load-s", "jobs/s", "disk-MiB", "open-ms", "start-ms", "sweep-s",
		"replay/s", "cpu-us", "recent/s", "cpu-us", "fresh/s", "cpu-us")
	for _, p := range points {
		open, rate := "-", "-"
		if p.open > 0 {
			open = fmt.Sprintf("%.0f", ms(p.open))
		}
		if p.added > 0 && p.load > 0 {
			rate = fmt.Sprintf("%.0f", float64(p.added)/p.load.Seconds())
		}
		fmt.Fprintf(w, "%-9s %8d %8d %8d %7.1f %8s %9.1f %8s %8.0f %8.1f", p.ledger, p.jobs, p.after, p.added,
			p.load.Seconds(), rate, float64(p.disk)/(1<<20), open, ms(p.start), p.sweepLag)
		for _, r := range p.rows {
			fmt.Fprintf(w, " %10.0f %9.1f", r.rps, float64(r.cpu)/float64(time.Microsecond))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "jobs: in the ledger when the gateway started, after: when it stopped; stored: directly, in load-s; open-ms: file.Open of the loaded ledger; start-ms: from starting the gateway to its answer to a replay; sweep-s: since the sweeper's last pass, after the runs\n")
	fmt.Fprintf(w, "\nthe gateway's memory after the sweep's runs (MiB)\n%-9s %8s %8s %8s %8s %8s %8s %8s %8s\n",
		"ledger", "jobs", "peak", "rss", "anon", "file", "go-heap", "go-sys", "cache")
	for _, p := range points {
		m := p.memory
		fmt.Fprintf(w, "%-9s %8d", p.ledger, p.jobs)
		for _, b := range []int64{m.peak, m.rss, m.anon, m.file, m.heap, m.goSys, m.cache} {
			fmt.Fprintf(w, " %8.1f", float64(b)/(1<<20))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "peak: VmHWM over the gateway's life; rss now: anon (the Go runtime's go-sys, of which go-heap in use, and what Pebble allocates outside Go: its block cache and memtables) and file (the binary); cache: the ledger's caches in use (its storage report)\n")
	fmt.Fprintf(w, "the memory ledger cannot be filled before its gateway starts: go test -run '^$' -bench Preloaded ./integration/bench measures it in process\n")
}
