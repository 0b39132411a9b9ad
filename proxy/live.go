package proxy

import (
	"net/http"
	"sync"

	"github.com/onejob/onejob/ledger"
)

// Joining a live stream (docs/contract.md, section 3): a duplicate that arrives while
// the winning answer streams through this instance gets the status, the
// stored headers, every byte sent so far and then the rest as it arrives.
// The bytes are the ones the answer's capture records for the ledger
// anyway: joiners read that one buffer, under the stream's lock, and hold
// no copy of their own beyond the chunk being written.

// liveStream is an answer streaming through this instance while it is
// recorded.
type liveStream struct {
	c *capture // its recording; c.buf and c.recording are read under mu

	mu    sync.Mutex
	more  chan struct{} // closed and replaced when bytes arrive or the stream ends
	ended bool
	cut   bool // it ended early, or stopped being recorded
}

// liveStreams are the answers streaming through this instance, by job id.
type liveStreams struct {
	mu   sync.Mutex
	jobs map[string]*liveStream
}

// open registers the stream of job id recorded by c.
func (ls *liveStreams) open(jobID string, c *capture) *liveStream {
	s := &liveStream{c: c, more: make(chan struct{})}
	ls.mu.Lock()
	if ls.jobs == nil {
		ls.jobs = make(map[string]*liveStream)
	}
	ls.jobs[jobID] = s
	ls.mu.Unlock()
	return s
}

func (ls *liveStreams) get(jobID string) *liveStream {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.jobs[jobID]
}

// close forgets the stream of job id, once its body is in the ledger.
func (ls *liveStreams) close(jobID string) {
	ls.mu.Lock()
	delete(ls.jobs, jobID)
	ls.mu.Unlock()
}

// lock and unlock guard the capture's recording while joiners read it.
func (s *liveStream) lock()   { s.mu.Lock() }
func (s *liveStream) unlock() { s.mu.Unlock() }

// grew wakes the joiners after bytes were recorded. s.mu is held.
func (s *liveStream) grew() {
	if !s.c.recording {
		s.cut = true // too large to record: joiners cannot follow it
	}
	close(s.more)
	s.more = make(chan struct{})
}

// end records that the stream ended, cut short or whole.
func (s *liveStream) end(cut bool) {
	s.mu.Lock()
	s.ended = true
	s.cut = s.cut || cut || !s.c.recording
	s.grew()
	s.mu.Unlock()
}

// next returns the recorded bytes from off, copied, and whether the
// stream ended (and was cut short, or stopped being recorded); wait is
// closed when more may come.
func (s *liveStream) next(off int) (chunk []byte, ended, cut bool, wait <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.c.buf.Bytes(); s.c.recording && off < len(b) {
		chunk = append([]byte(nil), b[off:]...)
	}
	return chunk, s.ended || s.cut, s.cut, s.more
}

// join sends the live stream s of job j to a duplicate, marked replayed,
// and reports whether it could: a stream already cut, or no longer
// recorded, cannot be joined. Once joined, a stream cut short aborts the
// joiner's connection after the bytes the first client got.
func (m *Middleware) join(w http.ResponseWriter, r *http.Request, j *ledger.Job, s *liveStream) bool {
	if _, _, cut, _ := s.next(0); cut {
		return false
	}
	_, span := startSpan(r.Context(), spanJoin)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(attrJobID.String(j.ID))
	}
	m.setAnswerHeader(w.Header(), j.Response.Header, j.ID, true) // replay set the expiry
	m.cfg.SetVar(r, "replayed", "true")
	w.WriteHeader(j.Response.Status)
	rc := http.NewResponseController(w)
	for off := 0; ; {
		chunk, ended, cut, wait := s.next(off)
		if len(chunk) > 0 {
			if _, err := w.Write(chunk); err != nil {
				return true // the joiner left
			}
			rc.Flush()
			off += len(chunk)
			continue
		}
		if cut {
			panic(http.ErrAbortHandler)
		}
		if ended {
			return true
		}
		select {
		case <-wait:
		case <-r.Context().Done():
			return true
		}
	}
}
