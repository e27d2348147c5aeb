package harness

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
)

// Listener is a TCP listener standing in for a Pod's server, on an address of
// 127.0.0.0/8 used as the Pod's IP: it accepts connections, counts them and
// closes them. Stop and Start take it away and bring it back on the same
// address and port.
type Listener struct {
	ip   string
	port int

	accepted atomic.Int64
	mu       sync.Mutex
	ln       net.Listener
	done     chan struct{}
}

// StartListener listens on ip (of 127.0.0.0/8) at port (0: any free port).
// It is stopped when the test ends.
func StartListener(t T, ip string, port int) *Listener {
	t.Helper()
	l := &Listener{ip: ip, port: port}
	if err := l.listen(); err != nil {
		t.Fatalf("harness: listen on %s: %v", l.Addr(), err)
	}
	t.Cleanup(l.close)
	return l
}

// IP is the listener's address, Port its port, Addr both.
func (l *Listener) IP() string   { return l.ip }
func (l *Listener) Port() int    { return l.port }
func (l *Listener) Addr() string { return net.JoinHostPort(l.ip, strconv.Itoa(l.port)) }

// Accepted counts the connections accepted since the listener was made.
func (l *Listener) Accepted() int64 { return l.accepted.Load() }

// Stop closes the listener: connections to it are refused.
func (l *Listener) Stop(t T) {
	t.Helper()
	l.close()
}

// Start listens again on the same address and port.
func (l *Listener) Start(t T) {
	t.Helper()
	if err := l.listen(); err != nil {
		t.Fatalf("harness: listen again on %s: %v", l.Addr(), err)
	}
}

func (l *Listener) listen() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", l.Addr())
	if err != nil {
		return err
	}
	l.port = ln.Addr().(*net.TCPAddr).Port
	l.ln, l.done = ln, make(chan struct{})
	go func(ln net.Listener, done chan struct{}) {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.accepted.Add(1)
			c.Close()
		}
	}(ln, l.done)
	return nil
}

func (l *Listener) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln == nil {
		return
	}
	l.ln.Close()
	<-l.done
	l.ln = nil
}
