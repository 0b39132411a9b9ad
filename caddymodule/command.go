package caddymodule

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/onejob/onejob/ledger"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "idempotency",
		Usage: "jobs|show|resolve|purge [--json] [--address <interface>] [--config <path> [--adapter <name>]]",
		Short: "Lists, shows, resolves and purges the idempotency jobs of a running Caddy",
		Long: `
Lists, shows, resolves and purges the jobs of the idempotency gateway of a
running Caddy, through its admin API (the /idempotency endpoints).

  caddy idempotency jobs [--state S] [--provider P] [--limit N] [--before ID]
  caddy idempotency show <job id>
  caddy idempotency resolve <job id> --cancel
  caddy idempotency resolve <job id> --complete --status N [--body-file F] [--header 'Name: value']...
  caddy idempotency purge --owner <owner>

With --json, each prints the admin API's answer instead of a table: one
JSON document (a page of jobs, a job, or a purge's counts), for scripts.

The admin endpoint is --address if given, else the one of the config in
--config (with --adapter), else localhost:2019.
`,
		CobraFunc: idempotencyCommand,
	})
}

// idempotencyCommand fills the "caddy idempotency" command with its
// subcommands.
func idempotencyCommand(cmd *cobra.Command) {
	flags := cmd.PersistentFlags()
	flags.String("address", "", "The address of the admin endpoint, if not the default")
	flags.StringP("config", "c", "", "Configuration file to read the admin address from, if --address is not used")
	flags.StringP("adapter", "a", "", "Name of config adapter to apply (when --config is used)")
	flags.Bool("json", false, "Print the admin API's JSON answer instead of a table")

	jobs := &cobra.Command{
		Use:   "jobs",
		Short: "Lists jobs, newest first",
		Args:  cobra.NoArgs,
		RunE: cliRun(func(ctx context.Context, c *adminClient, cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			for _, name := range []string{"state", "provider", "before"} {
				if v, _ := cmd.Flags().GetString(name); v != "" {
					q.Set(name, v)
				}
			}
			if n, _ := cmd.Flags().GetInt("limit"); n != 0 {
				q.Set("limit", strconv.Itoa(n))
			}
			path := adminJobsPath
			if len(q) > 0 {
				path += "?" + q.Encode()
			}
			if wantJSON(cmd) {
				return c.printJSON(ctx, cmd.OutOrStdout(), http.MethodGet, path, nil)
			}
			var page jobPage
			if err := c.call(ctx, http.MethodGet, path, nil, &page); err != nil {
				return err
			}
			printJobs(cmd.OutOrStdout(), page)
			if page.Next != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "older jobs: caddy idempotency jobs --before %s\n", *page.Next)
			}
			return nil
		}),
	}
	jobs.Flags().String("state", "", "Only jobs in this state: pending, unknown, completed or failed")
	jobs.Flags().String("provider", "", "Only jobs with an attempt on this provider")
	jobs.Flags().Int("limit", 0, "At most this many jobs (default 50)")
	jobs.Flags().String("before", "", "Only jobs older than this job id (the cursor of the next page)")

	show := &cobra.Command{
		Use:   "show <job id>",
		Short: "Shows a job and its attempts",
		Args:  cobra.ExactArgs(1),
		RunE: cliRun(func(ctx context.Context, c *adminClient, cmd *cobra.Command, args []string) error {
			path := adminJobsPath + "/" + url.PathEscape(args[0])
			if wantJSON(cmd) {
				return c.printJSON(ctx, cmd.OutOrStdout(), http.MethodGet, path, nil)
			}
			var j jobJSON
			if err := c.call(ctx, http.MethodGet, path, nil, &j); err != nil {
				return err
			}
			printJob(cmd.OutOrStdout(), j)
			return nil
		}),
	}

	resolve := &cobra.Command{
		Use:   "resolve <job id> --cancel | --complete --status N [--body-file F] [--header 'Name: value']...",
		Short: "Resolves a job out of band: cancels it, or completes it with an answer",
		Args:  cobra.ExactArgs(1),
		RunE: cliRun(func(ctx context.Context, c *adminClient, cmd *cobra.Command, args []string) error {
			req, err := resolution(cmd)
			if err != nil {
				return err
			}
			path := adminJobsPath + "/" + url.PathEscape(args[0]) + "/resolve"
			if wantJSON(cmd) {
				return c.printJSON(ctx, cmd.OutOrStdout(), http.MethodPost, path, req)
			}
			var j jobJSON
			if err := c.call(ctx, http.MethodPost, path, req, &j); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if req.Outcome == "cancel" {
				fmt.Fprintf(out, "Cancelled job %s: it is now %s (version %d); a retry starts a new attempt.\n\n", j.ID, j.State, j.Version)
			} else {
				fmt.Fprintf(out, "Completed job %s with status %d: it is now %s (version %d); retries get this answer.\n\n",
					j.ID, req.Response.Status, j.State, j.Version)
			}
			printJob(out, j)
			return nil
		}),
	}
	resolve.Flags().Bool("cancel", false, "Cancel the job: it fails, and a retry starts a new attempt")
	resolve.Flags().Bool("complete", false, "Complete the job with the answer given by --status, --body-file and --header")
	resolve.Flags().Int("status", 0, "Status of the answer (with --complete)")
	resolve.Flags().String("body-file", "", "File holding the answer's body, - for standard input (with --complete)")
	resolve.Flags().StringArray("header", nil, "A header of the answer, as 'Name: value'; repeatable (with --complete)")

	cmd.AddCommand(jobs, show, resolve, purgeCommand())
}

// resolution reads the resolve subcommand's flags into the body of
// POST /idempotency/jobs/<id>/resolve.
func resolution(cmd *cobra.Command) (*cliResolveRequest, error) {
	f := cmd.Flags()
	cancel, _ := f.GetBool("cancel")
	complete, _ := f.GetBool("complete")
	status, _ := f.GetInt("status")
	bodyFile, _ := f.GetString("body-file")
	headers, _ := f.GetStringArray("header")
	switch {
	case cancel == complete:
		return nil, errors.New("resolve needs either --cancel or --complete")
	case cancel && (status != 0 || bodyFile != "" || len(headers) > 0):
		return nil, errors.New("--status, --body-file and --header go with --complete, not --cancel")
	case cancel:
		return &cliResolveRequest{Outcome: "cancel"}, nil
	case status == 0:
		return nil, errors.New("--complete needs --status")
	}
	var body []byte
	if bodyFile != "" {
		var err error
		if bodyFile == "-" {
			body, err = io.ReadAll(cmd.InOrStdin())
		} else {
			body, err = os.ReadFile(bodyFile)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the body: %w", err)
		}
	}
	resp := &cliResponse{Status: status, Body: base64.StdEncoding.EncodeToString(body)}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("--header %q: want 'Name: value'", h)
		}
		if resp.Headers == nil {
			resp.Headers = make(map[string][]string)
		}
		name = strings.TrimSpace(name)
		resp.Headers[name] = append(resp.Headers[name], strings.TrimSpace(value))
	}
	return &cliResolveRequest{Outcome: "complete", Response: resp}, nil
}

// cliResolveRequest is the body of a resolve request, as the client sends
// it.
type cliResolveRequest struct {
	Outcome  string       `json:"outcome"`
	Response *cliResponse `json:"response,omitempty"`
}

type cliResponse struct {
	Status  int                 `json:"status"`
	Headers map[string][]string `json:"headers,omitempty"`
	Body    string              `json:"body"` // base64
}

// jobPage is an answer of GET /idempotency/jobs.
type jobPage struct {
	Jobs []jobJSON `json:"jobs"`
	Next *string   `json:"next"`
}

// cliRun adapts a subcommand to cobra: it finds the admin endpoint from
// the flags, and prints an error as one line ("title: detail" for the admin
// API's problems) before the command exits with status 1.
func cliRun(run func(ctx context.Context, c *adminClient, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := func() error {
			address, _ := cmd.Flags().GetString("address")
			config, _ := cmd.Flags().GetString("config")
			adapter, _ := cmd.Flags().GetString("adapter")
			addr, err := caddycmd.DetermineAdminAPIAddress(address, nil, config, adapter)
			if err != nil {
				return fmt.Errorf("finding the admin endpoint: %w", err)
			}
			c, err := newAdminClient(addr)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			return run(ctx, c, cmd, args)
		}()
		if err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), err)
			cmd.SilenceErrors = true
		}
		return err
	}
}

// adminClient calls a running Caddy's admin endpoint as Caddy's own
// commands do: over the endpoint's network (TCP or a unix socket), with an
// Origin that the endpoint accepts.
type adminClient struct {
	addr   string // as configured, for messages
	origin string // scheme and host of the request URLs, also the Origin
	client *http.Client
}

func newAdminClient(addr string) (*adminClient, error) {
	na, err := caddy.ParseNetworkAddress(addr)
	if err != nil {
		return nil, fmt.Errorf("invalid admin address %s: %w", addr, err)
	}
	if na.PortRangeSize() > 1 {
		return nil, fmt.Errorf("invalid admin address %s: a port range", addr)
	}
	c := &adminClient{addr: addr, origin: "http://" + na.JoinHostPort(0)}
	dial := na.JoinHostPort(0)
	if na.IsUnixNetwork() || na.IsFdNetwork() {
		// The host of the URL is not used to connect; the endpoint does
		// not check it on these networks.
		c.origin = "http://127.0.0.1"
		dial, _, _ = strings.Cut(dial, "|") // a unix socket's file mode
	}
	c.client = &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, na.Network, dial)
			},
		},
	}
	return c, nil
}

// call sends a request to the admin API and decodes its JSON answer into
// out. An error answer becomes an *adminError.
func (c *adminClient) call(ctx context.Context, method, path string, body, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.origin+path, r)
	if err != nil {
		return err
	}
	req.Header.Set("Origin", c.origin)
	req.Header.Set("Accept", "application/json, application/problem+json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach Caddy's admin endpoint at %s (is Caddy running? see --address and --config): %w", c.addr, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("reading the admin endpoint's answer: %w", err)
	}
	if resp.StatusCode >= 400 {
		return newAdminError(resp.StatusCode, data)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("the admin endpoint's answer is not what was expected (%v): %.200s", err, data)
	}
	return nil
}

// printJSON calls the admin API and writes its JSON answer to w as it came,
// indented, as one document ending in a newline: the fields and their
// order are the admin API's (see admin.go), so a script reads the same
// document the API documents. An error answer is an error, as for call.
func (c *adminClient) printJSON(ctx context.Context, w io.Writer, method, path string, body any) error {
	var raw json.RawMessage
	if err := c.call(ctx, method, path, body, &raw); err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err := out.WriteTo(w)
	return err
}

// wantJSON reports whether --json was given.
func wantJSON(cmd *cobra.Command) bool {
	v, _ := cmd.Flags().GetBool("json")
	return v
}

// adminError is an error answer of the admin endpoint.
type adminError struct {
	Status int
	Title  string
	Detail string
}

func (e *adminError) Error() string {
	if e.Detail == "" {
		return e.Title
	}
	return e.Title + ": " + e.Detail
}

// newAdminError reads an error answer: a problem (RFC 9457) from the
// idempotency endpoints, or Caddy's own {"error": ...}.
func newAdminError(status int, body []byte) *adminError {
	var v struct {
		Title  string `json:"title"`
		Detail string `json:"detail"`
		Error  string `json:"error"`
	}
	e := &adminError{Status: status}
	switch err := json.Unmarshal(body, &v); {
	case err == nil && v.Title != "":
		e.Title, e.Detail = v.Title, v.Detail
	case err == nil && v.Error != "":
		e.Title, e.Detail = fmt.Sprintf("HTTP %d", status), v.Error
	default:
		e.Title, e.Detail = fmt.Sprintf("HTTP %d", status), strings.TrimSpace(string(body))
	}
	return e
}

// --- output -------------------------------------------------------------

// printJobs writes a page of jobs as an aligned table.
func printJobs(w io.Writer, page jobPage) {
	if len(page.Jobs) == 0 {
		fmt.Fprintln(w, "No jobs.")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tPROVIDER\tATTEMPTS\tCREATED (UTC)\tCOMPLETED BY")
	for _, j := range page.Jobs {
		provider := "-"
		if n := len(j.Attempts); n > 0 {
			provider = j.Attempts[n-1].Provider
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n",
			j.ID, j.State, provider, len(j.Attempts), cliTime(j.CreatedAt, false), completedBy(j))
	}
	tw.Flush()
}

// printJob writes a job and its attempts, the attempts' times counted from
// the first attempt's start so that their race reads at a glance.
func printJob(w io.Writer, j jobJSON) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	field := func(name, value string) { fmt.Fprintf(tw, "%s\t%s\n", name, value) }
	field("Job", j.ID)
	field("State", fmt.Sprintf("%s (version %d)", j.State, j.Version))
	field("Created", cliTime(j.CreatedAt, true))
	// completed_at is when the job completed, or failed.
	settled := "Completed"
	if j.State == ledger.JobFailed {
		settled = "Failed"
	}
	field(settled, cliTime(j.CompletedAt, true))
	field("Completed by", completedBy(j))
	response := "-"
	if r := j.Response; r != nil {
		response = fmt.Sprintf("status %d, %d bytes, ", r.Status, r.Size)
		if r.Stored {
			response += "stored"
		} else {
			response += "not stored (retries get 409)"
		}
	}
	field("Response", response)
	field("Fingerprint", deref(j.Fingerprint))
	field("Key hash", deref(j.KeyHash))
	field("Owner hash", deref(j.OwnerHash))
	tw.Flush()

	fmt.Fprintln(w)
	if len(j.Attempts) == 0 {
		fmt.Fprintln(w, "No attempts.")
		return
	}
	var t0 time.Time
	for _, a := range j.Attempts {
		if t, ok := parseCLITime(a.StartedAt); ok && (t0.IsZero() || t.Before(t0)) {
			t0 = t
		}
	}
	since := func(s *string) string {
		t, ok := parseCLITime(s)
		if !ok {
			return "-"
		}
		return "+" + t.Sub(t0).Round(time.Millisecond).String()
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tATTEMPT\tPROVIDER\tSTATE\tSTARTED\tENDED\tRECONCILED\tERROR")
	for _, a := range j.Attempts {
		state := string(a.State)
		if j.CompletedBy != nil && a.ID == *j.CompletedBy {
			state += " (won)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			a.Number, a.ID, a.Provider, state, since(a.StartedAt), since(a.FinishedAt), reconciledText(a, since), deref(a.Error))
	}
	tw.Flush()
	fmt.Fprintf(w, "(STARTED and ENDED count from the first attempt's start, %s)\n", cliTime(timeJSON(t0), true))
}

// reconciledText tells what reconciliation did on an attempt: "resend",
// "lookup (1 try, 404)", or the lookups of one still unknown ("2 tries,
// last 503, next +40s"); "-" when none.
func reconciledText(a attemptJSON, since func(*string) string) string {
	r := a.Reconcile
	if r == nil {
		return deref(a.Reconciled)
	}
	tries := fmt.Sprintf("%d tries", r.Tries)
	if r.Tries == 1 {
		tries = "1 try"
	}
	last := "no answer"
	if r.LastStatus != nil {
		last = strconv.Itoa(*r.LastStatus)
	}
	if a.Reconciled != nil {
		return fmt.Sprintf("%s (%s, %s)", *a.Reconciled, tries, last)
	}
	return fmt.Sprintf("%s, last %s, next %s", tries, last, since(r.NextAt))
}

// completedBy names a job's winning attempt: "#2 fallback".
func completedBy(j jobJSON) string {
	if j.CompletedBy == nil {
		return "-"
	}
	for _, a := range j.Attempts {
		if a.ID == *j.CompletedBy {
			return fmt.Sprintf("#%d %s", a.Number, a.Provider)
		}
	}
	return *j.CompletedBy
}

func parseCLITime(s *string) (time.Time, bool) {
	if s == nil {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, *s)
	return t, err == nil
}

// cliTime shows an admin API time in UTC, to the second or the
// millisecond.
func cliTime(s *string, millis bool) string {
	t, ok := parseCLITime(s)
	if !ok {
		return "-"
	}
	if millis {
		return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}
