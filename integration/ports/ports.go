// Package ports hands out loopback ports for the test harnesses' gateways
// (the integration tests, the chaos soak, the benchmark) to listen on.
//
// A port the kernel hands out on a listen on port 0 is free again once that
// listener closes, and between then and caddy's own listen another process
// of the run (miniredis, httptest servers, outgoing connections, which all
// draw from the kernel's ephemeral range, 32768 and up) may be given it:
// caddy then fails to start. So the ports come from below that range, are
// checked free by listening, and are never handed out twice by one
// process. services.sh starts its servers in the same range before any
// harness runs, below 20000, and they hold their ports.
package ports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
)

// The range ports are drawn from, below the kernel's ephemeral range.
const (
	From = 20000
	To   = 32000
)

var given struct {
	sync.Mutex
	ports map[int]bool
}

// Free returns a loopback port nothing listens on and that this process
// has not handed out before.
func Free() (int, error) {
	given.Lock()
	defer given.Unlock()
	if given.ports == nil {
		given.ports = map[int]bool{}
	}
	for range 1000 {
		p := From + rand.IntN(To-From)
		if given.ports[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		l.Close()
		given.ports[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("no free loopback port between %d and %d", From, To)
}
