package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// adminJob is a job as the admin API shows it (docs/contract.md, section 10).
type adminJob struct {
	ID          string  `json:"id"`
	State       string  `json:"state"`
	Version     int64   `json:"version"`
	OwnerHash   string  `json:"owner_hash"`
	KeyHash     string  `json:"key_hash"`
	CompletedBy *string `json:"completed_by"`
	Response    *struct {
		Status int   `json:"status"`
		Size   int64 `json:"size"`
		Stored bool  `json:"stored"`
	} `json:"response"`
	Attempts []adminAttempt `json:"attempts"`
}

type adminAttempt struct {
	Number     int     `json:"number"`
	ID         string  `json:"id"`
	Provider   string  `json:"provider"`
	State      string  `json:"state"`
	StartedAt  *string `json:"started_at"`
	FinishedAt *string `json:"finished_at"`
	Error      *string `json:"error"`
	Resend     bool    `json:"resend"`
	Reconciled *string `json:"reconciled"`
}

// times returns when the attempt started and finished, by the ledger's
// clock; zero when the ledger does not say.
func (a adminAttempt) times() (started, finished time.Time) {
	parse := func(s *string) time.Time {
		if s == nil {
			return time.Time{}
		}
		t, _ := time.Parse(time.RFC3339Nano, *s)
		return t
	}
	return parse(a.StartedAt), parse(a.FinishedAt)
}

// getJSON GETs an admin path into v, trying again on errors: the instance
// may be busy, the ledger slow after a restart.
func getJSON(ctx context.Context, g *gateway, path string, v any) error {
	var last error
	for try := 0; try < 5; try++ {
		if try > 0 && !sleep(ctx, time.Duration(try)*500*time.Millisecond) {
			break
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.admin+path, nil)
		if err != nil {
			return err
		}
		resp, err := adminClient.Do(req)
		if err != nil {
			last = err
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			last = err
			continue
		}
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, bytes.TrimSpace(b))
			continue
		}
		return json.Unmarshal(b, v)
	}
	return last
}

// readLedger lists every job through the admin API, a page at a time, then
// reads each one with its attempts.
func readLedger(ctx context.Context, g *gateway) (map[string]*adminJob, error) {
	var ids []string
	before := ""
	for {
		path := "/idempotency/jobs?limit=1000"
		if before != "" {
			path += "&before=" + url.QueryEscape(before)
		}
		var page struct {
			Jobs []adminJob `json:"jobs"`
			Next *string    `json:"next"`
		}
		if err := getJSON(ctx, g, path, &page); err != nil {
			return nil, err
		}
		for _, j := range page.Jobs {
			ids = append(ids, j.ID)
		}
		if page.Next == nil {
			break
		}
		before = *page.Next
	}

	jobs := make(map[string]*adminJob, len(ids))
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		first error
	)
	work := make(chan string)
	for range 4 {
		wg.Go(func() {
			for id := range work {
				var j adminJob
				err := getJSON(ctx, g, "/idempotency/jobs/"+id, &j)
				mu.Lock()
				if err == nil && jobs[j.ID] != nil {
					err = fmt.Errorf("job %s listed twice", j.ID)
				}
				switch {
				case err == nil:
					jobs[j.ID] = &j
				case first == nil:
					first = err
				}
				mu.Unlock()
			}
		})
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	return jobs, first
}

// replayAll sends each identity's request once more, now that the run is
// over, and returns what came back by identity.
func replayAll(ctx context.Context, gws []string, ids []identity) map[identity]exchange {
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	out := make(map[identity]exchange, len(ids))
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	work := make(chan identity)
	for w := range 4 {
		wg.Go(func() {
			for id := range work {
				e := replayOne(ctx, client, gws[w%len(gws)], id)
				mu.Lock()
				out[id] = e
				mu.Unlock()
			}
		})
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	return out
}

func replayOne(ctx context.Context, client *http.Client, gw string, id identity) exchange {
	e := exchange{ID: id, Request: requestSeq.Add(1), Start: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, gw+"/charges", bytes.NewReader(id.requestBody()))
	if err != nil {
		panic(err) // a fixed method and a valid URL
	}
	req.Header.Set("Idempotency-Key", id.Key)
	req.Header.Set("Authorization", "Bearer "+id.Owner)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(requestHeader, strconv.FormatUint(e.Request, 10))
	req.GetBody = nil // one exchange, one request (see clients.send)
	resp, err := client.Do(req)
	if err == nil {
		var b []byte
		b, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			e.read(resp, b)
		}
	}
	if err != nil {
		e.Status, e.Err = 0, err.Error()
	}
	e.End = time.Now()
	return e
}
