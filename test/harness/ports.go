package harness

import (
	"fmt"
	"net"
	"strconv"
	"sync"
)

// Loopback is the only address anything in the harness listens on.
const Loopback = "127.0.0.1"

var (
	portsMu sync.Mutex
	given   = map[int]bool{} // ports handed out by this test binary, never handed out twice
)

// FreePort returns a port of 127.0.0.1 that is free for both TCP and UDP now
// and was not returned before by this test binary. (Another program may still
// take it before it is used; the servers then fail to start, loudly.)
func FreePort(t T) int {
	t.Helper()
	for i := 0; i < 50; i++ {
		l, err := net.Listen("tcp", net.JoinHostPort(Loopback, "0"))
		if err != nil {
			t.Fatalf("harness: listen on a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if PortFree(port) != nil {
			continue
		}
		portsMu.Lock()
		dup := given[port]
		given[port] = true
		portsMu.Unlock()
		if !dup {
			return port
		}
	}
	t.Fatalf("harness: no free port found in 50 tries")
	return 0
}

// PortFree returns an error when 127.0.0.1:port is bound for TCP or for UDP.
// A plain bind (no SO_REUSEPORT) fails when any socket holds the port, also
// one that set SO_REUSEPORT, as CoreDNS does: a second CoreDNS on the same
// port would otherwise silently share the traffic.
func PortFree(port int) error {
	addr := net.JoinHostPort(Loopback, strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("tcp %s is in use: %w", addr, err)
	}
	l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("udp %s is in use: %w", addr, err)
	}
	u.Close()
	return nil
}
