//go:build linux

package probe

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mcsannotations/mcsannotations/internal/store"
)

// stuck is a listener that never accepts, its backlog full: the SYNs of
// further connections go unanswered, as from a host that is cut off.
func stuck(t *testing.T) netip.AddrPort {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*unix.SockaddrInet4).Port))
	c, err := net.Dial("tcp", addr.String()) // fills the backlog of 0
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return addr
}

// results runs connectAll and returns each address's result.
func results(t *testing.T, ctx context.Context, c *conns, addrs []netip.AddrPort, inflight int, timeout time.Duration) ([]error, error) {
	t.Helper()
	errs := make([]error, len(addrs))
	seen := make([]bool, len(addrs))
	err := c.run(ctx, addrs, inflight, timeout, func(i int, err error) {
		if seen[i] {
			t.Errorf("%s reported twice", addrs[i])
		}
		seen[i], errs[i] = true, err
	})
	if err == nil {
		for i, ok := range seen {
			if !ok {
				t.Errorf("%s not reported", addrs[i])
			}
		}
	}
	return errs, err
}

// A listener connects, a closed port is refused, a host that does not
// answer times out; a connection closes with a FIN (the listener reads EOF,
// not a reset); no more than inflight are open at once.
func TestConnectAll(t *testing.T) {
	ln, closedBy := readOnce(t)
	up, down, cut := netip.MustParseAddrPort(ln.Addr().String()), refused(t), stuck(t)
	addrs := []netip.AddrPort{up, down, cut, down, cut, down, cut}
	var c conns
	errs, err := results(t, context.Background(), &c, addrs, 2, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil {
		t.Errorf("%s (a listener): %v, want connected", up, errs[0])
	}
	for i := 1; i < len(addrs); i += 2 {
		if !errors.Is(errs[i], syscall.ECONNREFUSED) {
			t.Errorf("%s (closed): %v, want refused", down, errs[i])
		}
		if !errors.Is(errs[i+1], errTimeout) {
			t.Errorf("%s (no answer): %v, want a timeout", cut, errs[i+1])
		}
	}
	if err := <-closedBy; !errors.Is(err, io.EOF) {
		t.Errorf("the listener read %v after the probe closed, want EOF (a FIN)", err)
	}
	if c.most > 2 {
		t.Errorf("%d connections open at once, want at most 2", c.most)
	}
	if len(c.open) != 0 {
		t.Errorf("%d connections left open", len(c.open))
	}
}

// A stop ends the probes under way: they are closed, not reported.
func TestConnectAllStop(t *testing.T) {
	cut := stuck(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	var c conns
	errc := make(chan error, 1)
	reported := 0
	go func() {
		errc <- c.run(ctx, []netip.AddrPort{cut, cut, cut}, 8, time.Minute, func(int, error) { reported++ })
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("connectAll after a stop: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("connectAll did not return after the stop")
	}
	if reported != 0 || len(c.open) != 0 {
		t.Errorf("%d probes reported, %d left open after a stop; want none", reported, len(c.open))
	}
}

// A prober with the default dialer probes TCP endpoints with connectAll:
// a listener's endpoint stays up, a closed port's goes down.
func TestRoundConnects(t *testing.T) {
	up, down := acceptClose(t), refused(t)
	tbl := newTable()
	pods := []*store.Pod{mkpod("edge-b", "b1", "127.0.0.1", true, "backend"), mkpod("edge-b", "b2", "127.0.0.1", true, "other")}
	pods[0].Exports[0].Ports[0].TargetPort = int32(up.Port())
	pods[1].Exports[0].Ports[0].TargetPort = int32(down.Port())
	tbl.ReplaceCluster("edge-b", pods)
	tbl.TrackDemand()
	ix := tbl.Rebuild()
	ix.Service("default", "backend")
	ix.Service("default", "other")
	p := New(tbl, onLoopback(Defaults(All)), Options{})
	if !p.connect {
		t.Fatal("the default TCP probe does not use connectAll")
	}
	for range Defaults(All).Fails {
		p.Round(context.Background())
	}
	if down, probed := p.Down(); probed != 2 || down["edge-b"] != 1 {
		t.Errorf("Down() = %v, %d probed; want edge-b: 1 (the closed port), 2 probed", down, probed)
	}
}

// A round that cannot probe at all (connectAll fails before any endpoint:
// no epoll instance) is CoreDNS's failure: reported, and no endpoint marked.
func TestRoundFailureBlamesNoEndpoint(t *testing.T) {
	saved := connectRound
	t.Cleanup(func() { connectRound = saved })
	connectRound = func(context.Context, []netip.AddrPort, int, time.Duration, func(int, error)) error {
		return errors.New("epoll_create1: too many open files")
	}
	tbl := newTable()
	tbl.ReplaceCluster("edge-b", []*store.Pod{mkpod("edge-b", "b1", "127.0.0.1", true, "backend")})
	tbl.TrackDemand()
	tbl.Rebuild().Service("default", "backend")
	var failed []error
	p := New(tbl, onLoopback(Defaults(All)), Options{Events: Events{RoundFailed: func(err error) { failed = append(failed, err) }}})
	if !p.connect {
		t.Fatal("the default TCP probe does not use connectAll")
	}
	for range Defaults(All).Fails + 1 {
		p.Round(context.Background())
	}
	if down, _ := p.Down(); len(down) != 0 {
		t.Errorf("Down() = %v after rounds that could not probe; want none", down)
	}
	if len(failed) != Defaults(All).Fails+1 {
		t.Errorf("RoundFailed heard %d rounds, want %d", len(failed), Defaults(All).Fails+1)
	}
}

// A registration outlives the close of a socket a forked child still holds
// (here: a dup); its events, carrying the old descriptor number, must not
// be taken for those of a later socket given the same number.
func TestStaleEventNotTakenForANewSocket(t *testing.T) {
	up, cut := acceptClose(t), stuck(t)
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(epfd) })
	c := conns{epfd: epfd, open: map[int32]conn{}, events: make([]unix.EpollEvent, 8)}
	t.Cleanup(c.closeAll)
	var reported []int
	done := func(i int, err error) { reported = append(reported, i) }

	c.start(0, up, time.Now().Add(time.Minute), done)
	if len(c.order) != 1 {
		t.Fatalf("the first probe did not start: reported %v", reported)
	}
	first := int(c.order[0].fd)
	copyFD, err := unix.Dup(first) // as a forked child's copy
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(copyFD) })
	c.expire(time.Now().Add(time.Hour), time.Minute, []netip.AddrPort{up}, done) // closes first
	time.Sleep(50 * time.Millisecond)                                            // the first connects meanwhile: its registration reports it
	c.start(1, cut, time.Now().Add(time.Minute), done)
	if len(c.order) != 1 || int(c.order[0].fd) != first {
		t.Skipf("the second socket did not get the first one's number (%v, first %d): cannot set the case up", c.order, first)
	}
	reported = reported[:0]
	c.reap(done)
	if len(reported) != 0 {
		t.Fatalf("reap reported %v: the first socket's event was taken for the second, which never connects", reported)
	}
}
