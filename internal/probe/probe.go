// Package probe checks, on a timer, whether the endpoints of the services
// that clients ask for respond, and tells the table which do not: a down
// endpoint leaves its service's answers until it responds again (docs/DESIGN.md,
// "Answer rules", Health).
//
// Probing follows demand: only the endpoints of services looked up within
// Options.Window are probed (the table records lookups with an atomic mark),
// by at most Options.Workers probes at a time, in rounds Config.Interval
// apart with jitter. Nothing here runs on the query path: answers read the
// table's precomputed index, which a health change re-renders.
//
// Pods name the addresses probed, so a tenant could aim probes at CoreDNS's
// own host or link and read from the answers what listens there: such
// addresses are never probed (fence.go), each address and port is probed
// once a round, and at most Config.PortsPerAddress ports of one address.
package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Mode chooses which endpoints are probed.
type Mode int

const (
	// Disconnected probes only the endpoints of sources that are not
	// connected: the ones whose Ready conditions nobody refreshes.
	Disconnected Mode = iota
	// All probes every answered endpoint.
	All
)

func (m Mode) String() string {
	if m == All {
		return "all"
	}
	return "disconnected"
}

// Config is what the Corefile's probe word sets.
type Config struct {
	Mode Mode
	// Path, when set, makes a probe an HTTP GET of that path that must
	// answer 2xx or 3xx; otherwise a probe is a TCP connection.
	Path     string
	Interval time.Duration // between rounds (jittered)
	Timeout  time.Duration // of one probe
	Fails    int           // failed probes in a row that take an endpoint out
	Passes   int           // successful probes in a row that bring it back
	// PortsPerAddress caps the distinct ports of one address probed in a
	// round (0: DefaultPortsPerAddress); each address and port is probed
	// once a round however many endpoints share it.
	PortsPerAddress int
	// Deny lists prefixes never probed; Allow lists prefixes probed even
	// though their addresses are of a refused class (loopback, link-local,
	// ...). Deny wins. Both as Prefix returns them.
	Deny, Allow []netip.Prefix
}

// Defaults returns the defaults of the probe word.
func Defaults(mode Mode) Config {
	return Config{Mode: mode, Interval: 2 * time.Second, Timeout: time.Second, Fails: 2, Passes: 2,
		PortsPerAddress: DefaultPortsPerAddress}
}

// How long a service counts as asked after its last lookup, how many probes
// run at once, how much later than Interval a round may start, and how many
// ports of one address a round probes.
const (
	DefaultWindow          = 5 * time.Minute
	DefaultWorkers         = 128
	jitter                 = 0.1
	DefaultPortsPerAddress = 8
)

// Dialer opens connections; *net.Dialer is one. Tests use a fake.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Table is what the prober needs of internal/table's Table.
type Table interface {
	Asked(f func(namespace, name string))
	Members(namespace, name string) []*store.Pod
	SetDown(namespace, name string, pod store.Key, down bool)
}

// Endpoint is one probed endpoint: a Pod backing a service, and the address
// probed (its first IP, its first exported TCP target port).
type Endpoint struct {
	Namespace, Service string
	Pod                store.Key
	Addr               netip.AddrPort
}

func (e Endpoint) String() string {
	return fmt.Sprintf("service %s/%s: cluster %s Pod %s/%s at %s", e.Namespace, e.Service, e.Pod.Cluster, e.Pod.Namespace, e.Pod.Name, e.Addr)
}

// Change is a state change of an endpoint, for the log.
type Change struct {
	Endpoint Endpoint
	Down     bool
	// Reason says why: the last probe's error, a count of passes, or that
	// the endpoint is no longer probed (its source reconnected, its service
	// was not asked lately, its record changed).
	Reason string
	// Suppressed counts the changes not reported since the last one
	// reported (the report is rate limited).
	Suppressed int
}

// Events are the prober's callbacks; each may be nil. They are called from
// the prober's goroutine.
type Events struct {
	// Probed reports each probe's result.
	Probed func(up bool)
	// Changed reports state changes, at most about one a second (bursts of
	// ten), with a count of the ones left out.
	Changed func(Change)
	// RoundFailed reports a round that could not probe at all (no epoll
	// instance: out of file descriptors, say). Its endpoints keep their
	// state: a failure here is CoreDNS's, not theirs.
	RoundFailed func(err error)
	// Refused reports each target that is not probed (a refused address,
	// or over PortsPerAddress), once when it becomes so, not each round.
	Refused func(Refusal)
}

// Options tune a prober; zero values take the defaults.
type Options struct {
	// Dialer opens HTTP probes' connections (default: a net.Dialer without
	// keep-alive). TCP probes use it only when it is set or connectAll is
	// not available (not Linux); otherwise they connect on their own.
	Dialer Dialer
	Clock  clock.Clock // default: the real clock
	// Stale reports whether a cluster's records are not vouched for by its
	// API server (its source is disconnected). In Disconnected mode only
	// the endpoints of stale clusters are probed; nil: every cluster is.
	Stale   func(cluster string) bool
	Window  time.Duration // default DefaultWindow
	Workers int           // default DefaultWorkers
	Events  Events
}

// Prober probes the endpoints of asked services; Run runs it.
type Prober struct {
	tbl     Table
	cfg     Config
	opts    Options
	http    *http.Client
	connect bool // TCP probes by connectAll, not the dialer
	logLim  flowcontrol.PassiveRateLimiter
	refLim  flowcontrol.PassiveRateLimiter // of Refusal.Log: a tenant's refusals leave the changes' log alone

	roundMu    sync.Mutex // one round at a time; guards what follows
	asked      map[svc]time.Time
	targets    map[targetID]*target
	round      uint64
	suppressed int
	refSupp    int // refusals not logged since the last one logged

	mu     sync.Mutex
	down   map[string]int // endpoints down, by cluster
	probed int            // endpoints probed in the last round
}

type svc struct{ namespace, name string }

type targetID struct {
	svc
	pod store.Key
}

type target struct {
	ep            Endpoint
	fails, passes int // in a row
	down          bool
	round         uint64 // the last round that listed it
	refused       Reason // its address is never probed (fixed: a new address is a new target)
	capped        bool   // over PortsPerAddress in the last round
	probe         int    // its probe's index in the round's addresses (-1: none); in plan, the last round's
}

// New returns a prober of t's endpoints.
func New(t Table, cfg Config, opts Options) *Prober {
	// TCP probes with the default dialer connect on their own (connectAll).
	connect := haveConnectAll && opts.Dialer == nil && cfg.Path == ""
	if opts.Dialer == nil {
		opts.Dialer = probeDialer()
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	if opts.Workers <= 0 {
		opts.Workers = DefaultWorkers
	}
	if cfg.PortsPerAddress <= 0 {
		cfg.PortsPerAddress = DefaultPortsPerAddress
	}
	p := &Prober{tbl: t, cfg: cfg, opts: opts, connect: connect,
		logLim:  flowcontrol.NewTokenBucketPassiveRateLimiterWithClock(1, 10, opts.Clock),
		refLim:  flowcontrol.NewTokenBucketPassiveRateLimiterWithClock(1, 10, opts.Clock),
		asked:   make(map[svc]time.Time),
		targets: make(map[targetID]*target),
		down:    make(map[string]int),
	}
	if cfg.Path != "" {
		p.http = &http.Client{
			// A fresh connection per probe, as the TCP probe makes: a reused
			// one would say nothing of the listener.
			Transport: &http.Transport{DialContext: opts.Dialer.DialContext, DisableKeepAlives: true,
				ResponseHeaderTimeout: cfg.Timeout},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return p
}

// Config returns the prober's configuration.
func (p *Prober) Config() Config { return p.cfg }

// Run probes in rounds until ctx is done: one at once, then each
// Config.Interval (up to 10% more, at random) after the last one ended.
func (p *Prober) Run(ctx context.Context) {
	wait.BackoffUntilWithContext(ctx, p.Round, jittered{p.opts.Clock, p.cfg.Interval}, true)
}

// jittered is wait's BackoffManager for a fixed, jittered period on a clock
// (wait.NewJitteredBackoffManager, which is deprecated, without its reused
// timer).
type jittered struct {
	clk    clock.Clock
	period time.Duration
}

func (j jittered) Backoff() clock.Timer { return j.clk.NewTimer(wait.Jitter(j.period, jitter)) }

// Down returns the number of endpoints down, by cluster, and the number of
// endpoints the last round probed.
func (p *Prober) Down() (down map[string]int, probed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	down = make(map[string]int, len(p.down))
	for c, n := range p.down {
		if n > 0 {
			down[c] = n
		}
	}
	return down, p.probed
}

// Round takes the services asked since the last round, lists the endpoints
// to probe, probes them all (Options.Workers at a time) and applies the
// results. A target whose address is refused, or over PortsPerAddress, is
// not probed and not marked: it is answered as without probing, so its
// answers are the same whether anything listens there or not.
func (p *Prober) Round(ctx context.Context) {
	p.roundMu.Lock()
	defer p.roundMu.Unlock()
	now := p.opts.Clock.Now()
	p.tbl.Asked(func(namespace, name string) { p.asked[svc{namespace, name}] = now })
	p.round++
	var list []*target
	for s, at := range p.asked {
		if now.Sub(at) > p.opts.Window {
			delete(p.asked, s)
			continue
		}
		for _, pod := range p.tbl.Members(s.namespace, s.name) {
			if !pod.Ready || len(pod.IPs) == 0 {
				continue // not answered anyway
			}
			if p.cfg.Mode == Disconnected && p.opts.Stale != nil && !p.opts.Stale(pod.Cluster) {
				continue // its API server vouches for its Ready condition
			}
			port := tcpPort(pod, s)
			if port == 0 {
				continue
			}
			id := targetID{s, pod.Key()}
			addr := netip.AddrPortFrom(pod.IPs[0], port)
			tg := p.targets[id]
			if tg != nil && tg.ep.Addr != addr {
				p.forget(tg, "its address changed")
				tg = nil
			}
			if tg == nil {
				tg = &target{ep: Endpoint{Namespace: s.namespace, Service: s.name, Pod: id.pod, Addr: addr}, probe: -1}
				p.targets[id] = tg
				if tg.refused = p.cfg.refuse(addr.Addr()); tg.refused != "" {
					p.refuse(tg, tg.refused)
				}
			}
			tg.round = p.round
			if tg.refused == "" {
				list = append(list, tg)
			}
		}
	}
	for id, tg := range p.targets {
		if tg.round != p.round {
			p.forget(tg, p.whyNot(tg))
			delete(p.targets, id)
		}
	}
	list, addrs := p.plan(list)
	p.mu.Lock()
	p.probed = len(list)
	p.mu.Unlock()

	errs := make([]error, len(addrs))
	if p.connect {
		for i := range errs {
			errs[i] = errNotProbed
		}
		err := connectRound(ctx, addrs, p.opts.Workers, p.cfg.Timeout, func(i int, err error) { errs[i] = err })
		if err != nil && ctx.Err() == nil {
			if p.opts.Events.RoundFailed != nil {
				p.opts.Events.RoundFailed(err)
			}
			return // not the endpoints' failure: none is recorded
		}
	} else {
		workqueue.ParallelizeUntil(ctx, p.opts.Workers, len(addrs), func(i int) {
			errs[i] = p.probe(ctx, addrs[i])
		})
	}
	if ctx.Err() != nil {
		return // results cut short by the stop say nothing of the endpoints
	}
	if p.opts.Events.Probed != nil {
		for _, err := range errs {
			p.opts.Events.Probed(err == nil)
		}
	}
	for _, tg := range list {
		p.record(tg, errs[tg.probe])
	}
}

// plan picks what a round connects to: each address and port once, and of
// each address at most PortsPerAddress ports (those probed in the last
// round first, then the lowest), so that endpoints sharing an address do
// not multiply the connections to it. It returns the addresses to probe,
// sets each target's index in them, and returns list without the targets
// over the cap (which also leave the answers' marks).
func (p *Prober) plan(list []*target) ([]*target, []netip.AddrPort) {
	slices.SortFunc(list, func(a, b *target) int { return a.ep.Addr.Compare(b.ep.Addr) })
	var addrs []netip.AddrPort
	kept := list[:0]
	for i := 0; i < len(list); {
		j := i + 1
		for j < len(list) && list[j].ep.Addr.Addr() == list[i].ep.Addr.Addr() {
			j++
		}
		allowed := p.ports(list[i:j])
		for _, tg := range list[i:j] {
			if allowed != nil && !allowed[tg.ep.Addr.Port()] {
				tg.probe = -1
				if !tg.capped {
					tg.capped, tg.fails, tg.passes = true, 0, 0
					p.forget(tg, "other ports of its address are probed")
					p.refuse(tg, PortCap)
				}
				continue
			}
			if len(addrs) == 0 || addrs[len(addrs)-1] != tg.ep.Addr {
				addrs = append(addrs, tg.ep.Addr)
			}
			tg.probe, tg.capped = len(addrs)-1, false
			kept = append(kept, tg)
		}
		i = j
	}
	clear(list[len(kept):])
	return kept, addrs
}

// ports picks the ports probed of one address's targets (sorted by port):
// nil when they are at most PortsPerAddress, else the ones picked: those
// probed in the last round, then the lowest.
func (p *Prober) ports(same []*target) map[uint16]bool {
	n := 1
	for i := 1; i < len(same); i++ {
		if same[i].ep.Addr.Port() != same[i-1].ep.Addr.Port() {
			n++
		}
	}
	if n <= p.cfg.PortsPerAddress {
		return nil // the usual case: nothing to pick, nothing allocated
	}
	distinct := make([]uint16, 0, n)
	held := map[uint16]bool{}
	for _, tg := range same {
		pt := tg.ep.Addr.Port()
		if len(distinct) == 0 || distinct[len(distinct)-1] != pt {
			distinct = append(distinct, pt)
		}
		if tg.probe >= 0 {
			held[pt] = true
		}
	}
	allowed := make(map[uint16]bool, p.cfg.PortsPerAddress)
	for _, first := range []bool{true, false} {
		for _, pt := range distinct {
			if len(allowed) < p.cfg.PortsPerAddress && held[pt] == first {
				allowed[pt] = true
			}
		}
	}
	return allowed
}

// tcpPort is the first TCP target port of pod's export of s, or 0.
func tcpPort(pod *store.Pod, s svc) uint16 {
	for _, e := range pod.Exports {
		if e.Namespace != s.namespace || e.Name != s.name {
			continue
		}
		for _, pt := range e.Ports {
			if strings.EqualFold(pt.Protocol, "TCP") && pt.TargetPort > 0 {
				return uint16(pt.TargetPort)
			}
		}
	}
	return 0
}

// whyNot says why a target tracked before is no longer listed.
func (p *Prober) whyNot(tg *target) string {
	s := svc{tg.ep.Namespace, tg.ep.Service}
	if _, ok := p.asked[s]; !ok {
		return "its service was not asked for " + p.opts.Window.String()
	}
	if p.cfg.Mode == Disconnected && p.opts.Stale != nil && !p.opts.Stale(tg.ep.Pod.Cluster) {
		return "cluster " + tg.ep.Pod.Cluster + " is connected: its Ready conditions count again"
	}
	return "its record changed or is gone"
}

// refuse reports that tg is not probed, at most about once a second in the
// log (Refusal.Log).
func (p *Prober) refuse(tg *target, r Reason) {
	if p.opts.Events.Refused == nil {
		return
	}
	ref := Refusal{Endpoint: tg.ep, Reason: r}
	if ref.Log = p.refLim.TryAccept(); ref.Log {
		ref.Suppressed, p.refSupp = p.refSupp, 0
	} else {
		p.refSupp++
	}
	p.opts.Events.Refused(ref)
}

// forget stops tracking tg: when it was down, it returns to the answers.
func (p *Prober) forget(tg *target, reason string) {
	if tg.down {
		p.set(tg, false, "no longer probed: "+reason)
	}
}

// record applies the result of tg's probe.
func (p *Prober) record(tg *target, err error) {
	if err == nil {
		tg.fails = 0
		tg.passes++
		if tg.down && tg.passes >= p.cfg.Passes {
			p.set(tg, false, fmt.Sprintf("%d probes in a row succeeded", tg.passes))
		}
		return
	}
	tg.passes = 0
	tg.fails++
	if !tg.down && tg.fails >= p.cfg.Fails {
		p.set(tg, true, fmt.Sprintf("%d probes in a row failed, the last: %v", tg.fails, err))
	}
}

func (p *Prober) set(tg *target, down bool, reason string) {
	tg.down = down
	p.tbl.SetDown(tg.ep.Namespace, tg.ep.Service, tg.ep.Pod, down)
	p.mu.Lock()
	if down {
		p.down[tg.ep.Pod.Cluster]++
	} else {
		p.down[tg.ep.Pod.Cluster]--
	}
	p.mu.Unlock()
	if p.opts.Events.Changed == nil {
		return
	}
	if !p.logLim.TryAccept() {
		p.suppressed++
		return
	}
	p.opts.Events.Changed(Change{Endpoint: tg.ep, Down: down, Reason: reason, Suppressed: p.suppressed})
	p.suppressed = 0
}

// probeDialer is a net.Dialer with no TCP keep-alive: a probe's connection
// is closed at once. Its sockets close as the kernel does by default, with a
// FIN that does not wait; see connect in connect_linux.go for why not
// SO_LINGER.
func probeDialer() *net.Dialer { return &net.Dialer{KeepAlive: -1} }

var (
	// errStatus is an HTTP probe's answer outside 2xx and 3xx.
	errStatus = errors.New("HTTP status")
	// errTimeout is a TCP probe that did not connect within Config.Timeout.
	errTimeout = errors.New("timed out")
	// errNotProbed marks the targets of a round not probed yet.
	errNotProbed = errors.New("not probed")

	// connectRound is connectAll; tests make it fail.
	connectRound = connectAll
)

// probe checks one address: a TCP connection, or an HTTP GET of Path.
func (p *Prober) probe(ctx context.Context, addr netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	if p.http == nil {
		// Not net.Dialer.DialTCP: its zero local address still makes it bind
		// the socket to port 0 before connecting, and the kernel's search for a
		// port no other socket holds (TIME_WAIT ones included) grows with every
		// probe made in the last minute; connect picks a port per destination.
		c, err := p.opts.Dialer.DialContext(ctx, "tcp", addr.String())
		if err != nil {
			return err
		}
		return c.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+p.cfg.Path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "coredns-mcsannotations-probe")
	resp, err := p.http.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("%w %d", errStatus, resp.StatusCode)
	}
	return nil
}
