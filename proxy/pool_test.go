package proxy

import (
	"bytes"
	"runtime"
	"testing"
	"time"
)

// goroutineID returns the number runtime.Stack gives the calling goroutine.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(buf, []byte("goroutine ")), []byte(" "))
	return string(id)
}

// A function handed to the pool while another runs runs at once, on a
// goroutine of its own; one handed to it once a goroutine is idle runs on
// that goroutine.
func TestPoolReusesIdleGoroutines(t *testing.T) {
	p := pool{tasks: make(chan func())}
	release, ids := make(chan struct{}), make(chan string, 3)
	p.run(func() { ids <- goroutineID(); <-release })
	blocked := <-ids
	p.run(func() { ids <- goroutineID() })
	second := <-ids // would never come if it waited for the first to end
	if second == blocked {
		t.Fatalf("two functions at once on goroutine %s", blocked)
	}
	close(release)
	// The goroutine that ran the second is idle now, or soon: hand it a
	// third, as run does, once one takes it.
	third := func() { ids <- goroutineID() }
	for sent := false; !sent; {
		select {
		case p.tasks <- third:
			sent = true
		default:
			time.Sleep(time.Millisecond)
		}
	}
	if got := <-ids; got != second && got != blocked {
		t.Errorf("the third ran on goroutine %s, not on an idle one (%s, %s)", got, blocked, second)
	}
}
