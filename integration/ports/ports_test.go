package ports

import (
	"fmt"
	"os"
	"testing"
)

// TestFree: the ports lie below the kernel's ephemeral range, where no
// listen on port 0 and no outgoing connection of another process can take
// them before a gateway binds them, and none is handed out twice.
func TestFree(t *testing.T) {
	raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatal(err)
	}
	var low int
	if _, err := fmt.Sscan(string(raw), &low); err != nil {
		t.Fatalf("ip_local_port_range %q: %v", raw, err)
	}
	seen := map[int]bool{}
	for range 500 {
		p, err := Free()
		if err != nil {
			t.Fatal(err)
		}
		if p >= low || p < From {
			t.Fatalf("port %d is outside [%d, %d), or in the ephemeral range (from %d)", p, From, To, low)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
