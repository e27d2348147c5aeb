package harness

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ProxyMode is what a Proxy does with traffic.
type ProxyMode int

const (
	// Pass forwards connections both ways.
	Pass ProxyMode = iota
	// Cut closes every open connection and refuses new ones (the listening
	// socket is closed: a connect gets ECONNREFUSED), like a server that is gone.
	Cut
	// Blackhole keeps connections open and accepts new ones, but forwards
	// nothing either way, like a link that silently drops packets. Data held
	// back is delivered if the proxy is restored (as TCP would retransmit it).
	Blackhole
)

func (m ProxyMode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Cut:
		return "cut"
	case Blackhole:
		return "blackhole"
	}
	return "mode" + strconv.Itoa(int(m))
}

// Proxy is a TCP proxy on 127.0.0.1 in front of one target (an API server),
// which a test can cut, blackhole and restore.
type Proxy struct {
	target string
	port   int

	mu      sync.Mutex
	mode    ProxyMode
	changed chan struct{} // closed and replaced on every mode change
	ln      net.Listener  // nil while cut
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup

	accepted atomic.Int64
	received atomic.Int64 // bytes forwarded from the target to clients
}

// StartProxy starts a proxy to target (host:port) on a free port, and stops it
// in t.Cleanup.
func StartProxy(t T, target string) *Proxy {
	t.Helper()
	p := &Proxy{target: target, port: FreePort(t), changed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.mu.Lock()
	err := p.listenLocked()
	p.mu.Unlock()
	if err != nil {
		t.Fatalf("harness: proxy: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return net.JoinHostPort(Loopback, strconv.Itoa(p.port)) }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.port }

// Accepted counts the connections accepted so far.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Received counts the bytes forwarded from the target to clients so far: a
// test can tell a full list (megabytes) from a resumed watch (kilobytes).
func (p *Proxy) Received() int64 { return p.received.Load() }

// Open counts the connections open now (client and target sides together).
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Mode is the current mode.
func (p *Proxy) Mode() ProxyMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Cut closes all connections and refuses new ones.
func (p *Proxy) Cut(t T) {
	t.Helper()
	if err := p.SetMode(Cut); err != nil {
		t.Fatalf("harness: proxy: %v", err)
	}
}

// Blackhole stalls all traffic, open connections and new ones alike.
func (p *Proxy) Blackhole(t T) {
	t.Helper()
	if err := p.SetMode(Blackhole); err != nil {
		t.Fatalf("harness: proxy: %v", err)
	}
}

// Restore forwards traffic again.
func (p *Proxy) Restore(t T) {
	t.Helper()
	if err := p.SetMode(Pass); err != nil {
		t.Fatalf("harness: proxy: %v", err)
	}
}

// SetMode switches the mode. Leaving Cut listens again on the same port.
func (p *Proxy) SetMode(m ProxyMode) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("proxy closed")
	}
	if m == p.mode {
		return nil
	}
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
	switch m {
	case Cut:
		if p.ln != nil {
			p.ln.Close()
			p.ln = nil
		}
		for c := range p.conns {
			c.Close()
		}
	default:
		if p.ln == nil {
			return p.listenLocked()
		}
	}
	return nil
}

// listenLocked listens on the proxy's port, retrying for up to 5 s: while
// cut, the port is unbound, and an outgoing connection may briefly hold it as
// its ephemeral local port.
func (p *Proxy) listenLocked() error {
	var err error
	for i := 0; i < 250; i++ {
		var ln net.Listener
		ln, err = net.Listen("tcp", p.Addr())
		if err == nil {
			p.ln = ln
			p.wg.Add(1)
			go p.accept(ln)
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("listen on %s: %w", p.Addr(), err)
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.changed)
		p.changed = make(chan struct{})
		if p.ln != nil {
			p.ln.Close()
			p.ln = nil
		}
		for c := range p.conns {
			c.Close()
		}
	}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by Cut or Close
		}
		p.accepted.Add(1)
		if !p.track(c) {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// track adds a connection to the set closed by Cut; false when cut or closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == Cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

// gate waits while the proxy is blackholed; it returns false when the
// connection must end (cut or closed).
func (p *Proxy) gate() bool {
	for {
		p.mu.Lock()
		mode, closed, changed := p.mode, p.closed, p.changed
		p.mu.Unlock()
		switch {
		case closed || mode == Cut:
			return false
		case mode == Pass:
			return true
		}
		<-changed
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	// A connection accepted while blackholed is not forwarded (not even
	// connected to the target) until the proxy is restored.
	if !p.gate() {
		return
	}
	upstream, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return // the client sees its connection closed, as if the target refused it
	}
	if !p.track(upstream) {
		upstream.Close()
		return
	}
	defer p.untrack(upstream)
	done := make(chan struct{}, 2)
	go func() { p.pipe(upstream, client, nil); done <- struct{}{} }()
	go func() { p.pipe(client, upstream, &p.received); done <- struct{}{} }()
	<-done
	// One side ended: end both, so the other pipe returns too.
	client.Close()
	upstream.Close()
	<-done
}

// pipe copies src to dst chunk by chunk, holding each chunk while blackholed,
// until either side fails or ends (no half-close: serve then closes both).
// It adds the bytes written to count when count is not nil.
func (p *Proxy) pipe(dst, src net.Conn, count *atomic.Int64) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			w, werr := dst.Write(buf[:n])
			if count != nil {
				count.Add(int64(w))
			}
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
