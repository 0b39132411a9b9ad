//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// lossyFront is a proxy in front of the gateway that loses 3 answers in
// 10 on their way back to the client, after the gateway (and the
// provider) did the work: it reads the whole answer, then closes the
// client's connection without a byte of it.
type lossyFront struct {
	*httptest.Server
	seen atomic.Int64
	lost atomic.Int64
}

func newLossyFront(t *testing.T, target string) *lossyFront {
	f := &lossyFront{}
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.RequestURI(), r.Body)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		req.Header, req.ContentLength = r.Header.Clone(), r.ContentLength
		resp, err := client.Do(req)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if n := f.seen.Add(1); err != nil || n%10 == 1 || n%10 == 4 || n%10 == 7 {
			f.lost.Add(1)
			panic(http.ErrAbortHandler) // the connection is cut: no answer
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		w.Write(body)
	}))
	t.Cleanup(f.Close)
	return f
}

// modelServer is a provider that answers chat completions, echoing the
// prompt, and counts the completions it made per prompt.
type modelServer struct {
	*httptest.Server
	mu   sync.Mutex
	runs map[string]int
	all  int
}

func newModelServer(t *testing.T) *modelServer {
	m := &modelServer{runs: map[string]int{}}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		prompt := req.Messages[len(req.Messages)-1].Content
		m.mu.Lock()
		m.runs[prompt]++
		m.all++
		n := m.runs[prompt]
		m.mu.Unlock()
		content, _ := json.Marshal("echo: " + prompt)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-%d","object":"chat.completion","created":1767225600,"model":"m",`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":%s},"finish_reason":"stop"}]}`, n, content)
	}))
	t.Cleanup(m.Close)
	return m
}

func (m *modelServer) addr() string { return strings.TrimPrefix(m.URL, "http://") }

func (m *modelServer) total() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.all
}

// duplicates is how many completions ran more than once per prompt.
func (m *modelServer) duplicates() (dups, prompts int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range m.runs {
		dups += n - 1
	}
	return dups, len(m.runs)
}

// sdkCalls makes n chat completions through the OpenAI Go SDK, its own
// retries on and no idempotency key, 16 at a time, and checks that each
// got its own answer.
func sdkCalls(t *testing.T, baseURL string, n int) {
	client := openai.NewClient(
		option.WithBaseURL(baseURL+"/v1/"),
		option.WithAPIKey("sk-demo"),
		option.WithMaxRetries(10),
		option.WithRequestTimeout(10*time.Second),
	)
	calls := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				prompt := fmt.Sprintf("call %d", i)
				c, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
					Model:    openai.ChatModelGPT4oMini,
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
				})
				switch {
				case err != nil:
					t.Errorf("%s: %v", prompt, err)
				case len(c.Choices) != 1 || c.Choices[0].Message.Content != "echo: "+prompt:
					t.Errorf("%s: answered %+v", prompt, c.Choices)
				}
			}
		}()
	}
	for i := range n {
		calls <- i
	}
	close(calls)
	wg.Wait()
}

const sdkCallCount = 200

// TestOpenAISDKImplicitKey: the real OpenAI Go SDK, which sends no key
// and retries a lost answer on its own, through a gateway with
// implicit_key, with 30% of the answers lost after the provider did the
// work: every call is answered, and no completion runs twice.
func TestOpenAISDKImplicitKey(t *testing.T) {
	memoryAndPostgres(t, func(t *testing.T, b backend) {
		model := newModelServer(t)
		g := startGateway(t, b, site(model.addr(), "attempt_timeout 5s", "implicit_key 10m"))
		front := newLossyFront(t, g.url)
		sdkCalls(t, front.URL, sdkCallCount)
		dups, prompts := model.duplicates()
		if dups != 0 || prompts != sdkCallCount {
			t.Errorf("%d duplicate completions over %d prompts, want 0 over %d", dups, prompts, sdkCallCount)
		}
		if lost := front.lost.Load(); lost < sdkCallCount/5 {
			t.Errorf("only %d answers were lost: the fault did not happen", lost)
		}
		t.Logf("%d SDK calls, %d answers lost and retried by the SDK, %d completions run", sdkCallCount, front.lost.Load(), model.total())
	})
}

// TestOpenAISDKWithoutImplicitKey is the same without implicit_key: the
// SDK's requests carry no key, pass through unledgered, and each lost
// answer becomes a second completion at the provider. It documents what
// implicit_key prevents.
func TestOpenAISDKWithoutImplicitKey(t *testing.T) {
	model := newModelServer(t)
	g := startGateway(t, backend{name: "memory", line: "ledger memory"}, site(model.addr(), "attempt_timeout 5s"))
	front := newLossyFront(t, g.url)
	sdkCalls(t, front.URL, sdkCallCount)
	dups, _ := model.duplicates()
	if lost := front.lost.Load(); dups == 0 || int64(dups) != lost {
		t.Errorf("%d duplicate completions, %d answers lost: want one duplicate per lost answer", dups, lost)
	}
	t.Logf("without implicit_key: %d SDK calls, %d answers lost, %d duplicate completions", sdkCallCount, front.lost.Load(), dups)
}
