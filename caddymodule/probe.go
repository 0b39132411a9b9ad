package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/onejob/onejob/proxy"
)

// ProbeConfig is a real request sent through every provider at start and
// periodically, and checked against the contract. Failover and hedging may
// reach a provider only while its latest probe passed.
type ProbeConfig struct {
	// The probe request's method.
	Method string `json:"method"`
	// The probe request's path (and query).
	Path string `json:"path"`
	// A file holding the probe request's body, sent as application/json.
	BodyFile string `json:"body_file,omitempty"`
	// The time between probes. Default 30s.
	Every caddy.Duration `json:"every,omitempty"`
}

const defaultProbeEvery = 30 * time.Second

// probeURL is where a probe request goes (in process: the host is never
// dialled).
const probeURL = "http://onejob-probe"

// check is the rule a probe is held to, in JSON and in a Caddyfile: a
// method token, a path a request can have, and an interval that is not
// negative (0 in JSON is the default).
func (p *ProbeConfig) check() error {
	if !validMethod(p.Method) {
		return fmt.Errorf("probe: invalid method %q", p.Method)
	}
	if !strings.HasPrefix(p.Path, "/") {
		return fmt.Errorf("probe: the path must start with /, not %q", p.Path)
	}
	if _, err := http.NewRequest(p.Method, probeURL+p.Path, nil); err != nil {
		return fmt.Errorf("probe: the path %q cannot be requested", p.Path)
	}
	if p.Every < 0 {
		return fmt.Errorf("probe: every must not be negative, not %v (0 means the default, 30s)", time.Duration(p.Every))
	}
	return nil
}

// prober runs the probes of one handler's providers until its config is
// unloaded.
type prober struct {
	cfg      ProbeConfig
	scope    string // the handler's: results are kept per scope and provider
	body     []byte
	timeout  time.Duration
	max      int64
	contract proxy.Contract
	metrics  *metrics
	logger   *zap.Logger
}

// start runs one probe loop per provider; they end with ctx.
func (pr *prober) start(ctx context.Context, providers []*Provider) {
	every := time.Duration(pr.cfg.Every)
	if every <= 0 {
		every = defaultProbeEvery
	}
	for _, p := range providers {
		go func() {
			t := time.NewTicker(every)
			defer t.Stop()
			last := (*ProbeResult)(nil)
			for {
				r := pr.probe(ctx, p)
				if ctx.Err() != nil {
					return
				}
				setProbe(pr.scope, p.Name, r)
				pr.metrics.Probe(p.Name, r.OK)
				// The log says when the provider's state changes; the
				// metric and the admin API say it at every probe.
				switch changed := last == nil || last.OK != r.OK; {
				case changed && !r.OK:
					pr.logger.Warn("probe failed: no failover or hedge to this provider", zap.String("provider", p.Name),
						zap.Int("status", r.Status), zap.String("error", r.Error))
				case changed:
					pr.logger.Info("probe passed", zap.String("provider", p.Name), zap.Int("status", r.Status))
				}
				last = &r
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
}

// probe sends one probe request through the provider's routes, in process,
// and checks the answer against the contract (without one: any 2xx).
func (pr *prober) probe(ctx context.Context, p *Provider) (res ProbeResult) {
	res.At = time.Now()
	ctx, cancel := context.WithTimeout(ctx, pr.timeout)
	defer cancel()
	var header http.Header
	if len(pr.body) > 0 {
		header = http.Header{"Content-Type": {"application/json"}}
	}
	rec, err := sendInProcess(ctx, p, pr.cfg.Method, pr.cfg.Path, header, pr.body, caddy.NewReplacer(), pr.max)
	if err != nil && (rec == nil || rec.status == 0 || errors.Is(err, errAborted)) {
		res.Error = "probe: " + err.Error()
		return res
	}
	res.Status = rec.status
	switch {
	case rec.status == 0:
		res.Error = "no answer"
	case rec.overflow:
		res.Error = "answer larger than max_response_body"
	case pr.contract == nil:
		if rec.status < 200 || rec.status > 299 {
			res.Error = fmt.Sprintf("status %d is not 2xx", rec.status)
		}
	case !pr.contract.Applies(rec.status):
		res.Error = fmt.Sprintf("status %d is not one the contract accepts", rec.status)
	default:
		if err := pr.contract.Check(rec.status, rec.header, rec.body.Bytes(), pr.body); err != nil {
			res.Error = err.Error()
		}
	}
	res.OK = res.Error == ""
	return res
}

// sendInProcess sends a request of the gateway's own (a probe, a lookup)
// through the provider's routes, in process, with repl as its replacer,
// and records its answer up to max bytes. rec is nil when the request
// could not be made; err is the handler's error, or a panic it raised.
func sendInProcess(ctx context.Context, p *Provider, method, uri string, header http.Header, body []byte,
	repl *caddy.Replacer, max int64) (rec *probeRecorder, err error) {
	req, err := http.NewRequestWithContext(ctx, method, probeURL+uri, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.RequestURI = uri
	rec = &probeRecorder{header: make(http.Header), max: max}
	req = caddyhttp.PrepareRequest(req, repl, rec, &caddyhttp.Server{})
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: %v", errAborted, v)
		}
	}()
	return rec, p.ServeHTTP(rec, req)
}

// errAborted: the handler panicked while it answered a request of the
// gateway's own.
var errAborted = errors.New("aborted")

// probeRecorder records a probe's answer, bounded.
type probeRecorder struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	max      int64
	overflow bool
}

func (r *probeRecorder) Header() http.Header { return r.header }

func (r *probeRecorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 {
		r.status = code
	}
}

func (r *probeRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if int64(r.body.Len()+len(p)) > r.max {
		r.overflow = true
		return len(p), nil
	}
	return r.body.Write(p)
}

func (r *probeRecorder) Flush() {}
