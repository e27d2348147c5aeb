//go:build linux

package probe

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// haveConnectAll: TCP probes use connectAll, not the dialer.
const haveConnectAll = true

// connectAll runs the TCP probes of a round without Go's dialer: per probe a
// non-blocking socket, its connect, its registration in one epoll instance,
// SO_ERROR once it is writable, and a close. The epoll instance is itself in
// Go's netpoller, so one goroutine waits for all of the round's connections:
// a probe costs no goroutine, context or timer, and none of the dialer's
// other system calls (bind, keep-alive and no-delay options, the names of
// both ends, the netpoller's registration of each socket).
//
// At most inflight connections are open at once; each gets timeout to
// connect. done(i, err) reports addrs[i]'s result, err nil when it connected.
// When ctx ends, the open connections are closed unreported and ctx's error
// returned.
//
// The loop pauses now and then (see yield): its system calls are short, so
// the scheduler would otherwise let it run until it preempts it, and on a
// CoreDNS with one P queries would wait that long behind a round.
func connectAll(ctx context.Context, addrs []netip.AddrPort, inflight int, timeout time.Duration, done func(i int, err error)) error {
	var c conns
	return c.run(ctx, addrs, inflight, timeout, done)
}

func (c *conns) run(ctx context.Context, addrs []netip.AddrPort, inflight int, timeout time.Duration, done func(i int, err error)) error {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return os.NewSyscallError("epoll_create1", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return os.NewSyscallError("setnonblock", err)
	}
	ep := os.NewFile(uintptr(epfd), "probe-epoll") // closes epfd
	defer ep.Close()
	rc, err := ep.SyscallConn()
	if err != nil {
		return err
	}
	// os.NewFile put the descriptor in the netpoller only if it was already
	// non-blocking; without the netpoller there are no deadlines.
	if err := ep.SetReadDeadline(time.Time{}); err != nil {
		return fmt.Errorf("epoll descriptor not in the netpoller: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { ep.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()

	c.epfd, c.open, c.events = epfd, make(map[int32]conn, inflight), make([]unix.EpollEvent, min(inflight, 256))
	defer c.closeAll()
	next := 0
	for next < len(addrs) || len(c.open) > 0 {
		now := time.Now()
		for len(c.open) < inflight && next < len(addrs) {
			c.start(next, addrs[next], now.Add(timeout), done)
			next++
			c.yield()
		}
		c.expire(now, timeout, addrs, done)
		if len(c.open) == 0 {
			continue
		}
		if err := ep.SetReadDeadline(c.oldest()); err != nil {
			return err
		}
		if ctx.Err() != nil { // after the deadline: a stop between the two is not lost
			return ctx.Err()
		}
		err := rc.Read(func(uintptr) bool { return c.reap(done) })
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
	}
	return nil
}

// yieldEvery connections opened or reaped, the loop sleeps yieldFor. Not
// runtime.Gosched: a goroutine that yields stays runnable, and Go's
// scheduler polls the network only when nothing is runnable (or from
// sysmon, every 10 ms), so queries would still wait that long. A sleep
// leaves nothing runnable, and the network is polled.
const (
	yieldEvery = 8
	yieldFor   = 50 * time.Microsecond
)

// yield counts a connection opened or reaped, and sleeps every yieldEvery.
func (c *conns) yield() {
	if c.work++; c.work%yieldEvery == 0 {
		time.Sleep(yieldFor)
	}
}

// conn is an open probe connection.
type conn struct {
	i        int // its index in addrs
	seq      uint64
	deadline time.Time
}

// conns are a round's open connections by socket, and their sockets in the
// order they were opened (for the timeouts: all have the same).
type conns struct {
	epfd   int
	open   map[int32]conn
	order  []opened
	seq    uint64
	events []unix.EpollEvent
	most   int // open at once, at most
	work   int // connections opened and reaped (yield)
}

// opened is a socket in the order of opening; seq tells it from a later
// socket given the same number.
type opened struct {
	fd  int32
	seq uint64
}

// start opens a connection to a; one that ends at once is reported at once.
func (c *conns) start(i int, a netip.AddrPort, deadline time.Time, done func(int, error)) {
	fd, err := connect(a)
	if fd < 0 {
		done(i, err)
		return
	}
	// The event carries the socket's sequence number beside its descriptor:
	// a registration outlives our close while a forked child still holds a
	// copy of the socket, and its events must not be taken for those of a
	// later socket given the same number.
	c.seq++
	ev := unix.EpollEvent{Events: unix.EPOLLOUT, Fd: int32(fd), Pad: tag(c.seq)}
	if err := unix.EpollCtl(c.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		unix.Close(fd)
		done(i, os.NewSyscallError("epoll_ctl", err))
		return
	}
	c.open[int32(fd)] = conn{i: i, seq: c.seq, deadline: deadline}
	c.order = append(c.order, opened{int32(fd), c.seq})
	c.most = max(c.most, len(c.open))
}

// tag is what of a sequence number fits an epoll event beside the descriptor.
func tag(seq uint64) int32 { return int32(uint32(seq)) }

// connect opens a non-blocking socket and starts connecting it to a. It
// returns the socket while the connection is under way, or -1 and the
// result when it ended at once.
//
// The socket keeps the kernel's close: a FIN, then TIME_WAIT for a minute on
// this side. Not SO_LINGER 1 s, as the kubelet's probes set it (kubernetes
// issue 89898): on Linux it does not shorten TIME_WAIT, and it makes close
// wait, even on a non-blocking socket, until the FIN is acknowledged (a round
// trip; up to 1 s from an endpoint that vanished), which in this one loop
// would hold up every other probe. Not SO_LINGER 0 either: a RST instead of
// the FIN leaves no TIME_WAIT, but the endpoint's server reads "connection
// reset" rather than an orderly close.
func connect(a netip.AddrPort) (int, error) {
	var sa unix.Sockaddr
	family := unix.AF_INET
	if ip := a.Addr().Unmap(); ip.Is4() {
		sa = &unix.SockaddrInet4{Port: int(a.Port()), Addr: ip.As4()}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(a.Port()), Addr: ip.As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	switch err := unix.Connect(fd, sa); err {
	case unix.EINPROGRESS, unix.EINTR:
		return fd, nil
	case nil:
		return -1, unix.Close(fd)
	default:
		unix.Close(fd)
		return -1, fmt.Errorf("connect %s: %w", a, err)
	}
}

// reap takes the connections that finished (their sockets writable, or in
// error), reports them and closes them; it tells whether there were any.
func (c *conns) reap(done func(int, error)) bool {
	any := false
	for {
		n, err := unix.EpollWait(c.epfd, c.events, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return any
		}
		any = true
		for _, ev := range c.events[:n] {
			cn, ok := c.open[ev.Fd]
			if !ok || tag(cn.seq) != ev.Pad {
				continue // an earlier socket's registration (see start)
			}
			fd := int(ev.Fd)
			soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
			if err == nil && soerr != 0 {
				err = syscall.Errno(soerr)
			}
			if err != nil {
				err = fmt.Errorf("connect: %w", err)
			}
			delete(c.open, ev.Fd)
			if cerr := unix.Close(fd); err == nil && cerr != nil {
				err = os.NewSyscallError("close", cerr)
			}
			done(cn.i, err)
			c.yield()
		}
		if n < len(c.events) {
			return true
		}
	}
}

// expire closes the connections whose time is up and reports them failed.
func (c *conns) expire(now time.Time, timeout time.Duration, addrs []netip.AddrPort, done func(int, error)) {
	for len(c.order) > 0 {
		o := c.order[0]
		cn, ok := c.open[o.fd]
		if ok && cn.seq == o.seq && now.Before(cn.deadline) {
			return
		}
		c.order = c.order[1:]
		if !ok || cn.seq != o.seq {
			continue // reaped already
		}
		delete(c.open, o.fd)
		unix.Close(int(o.fd))
		done(cn.i, fmt.Errorf("connect %s: %w after %s", addrs[cn.i], errTimeout, timeout))
	}
}

// oldest is the deadline of the connection opened first of those open.
func (c *conns) oldest() time.Time {
	for _, o := range c.order {
		if cn, ok := c.open[o.fd]; ok && cn.seq == o.seq {
			return cn.deadline
		}
	}
	return time.Time{}
}

// closeAll closes the connections still open, unreported.
func (c *conns) closeAll() {
	for fd := range c.open {
		unix.Close(int(fd))
	}
	clear(c.open)
}
