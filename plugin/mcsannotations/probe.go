package mcsannotations

import (
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/mcsannotations/mcsannotations/internal/probe"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// Bounds of the probe word's numbers.
const (
	maxProbeCount      = 100
	minProbeInterval   = 100 * time.Millisecond
	maxPortsPerAddress = 1024
)

// probeOptions are the probe word's options after the mode, in the words
// of its errors.
const probeOptions = "tcp, http PATH, interval, timeout, fails, passes, ports_per_address, deny CIDR... or allow CIDR..."

// parseProbe reads `probe disconnected|all [tcp|http PATH] [interval D]
// [timeout D] [fails N] [passes N] [ports_per_address N] [deny CIDR...]
// [allow CIDR...]`; c is at the word.
func parseProbe(c *caddy.Controller) (probe.Config, error) {
	a := c.RemainingArgs()
	if len(a) == 0 || (a[0] != "disconnected" && a[0] != "all") {
		return probe.Config{}, c.Errf("probe takes disconnected or all first, then [tcp|http PATH] [interval DURATION] [timeout DURATION] [fails N] [passes N] [ports_per_address N] [deny CIDR...] [allow CIDR...]")
	}
	mode := probe.Disconnected
	if a[0] == "all" {
		mode = probe.All
	}
	cfg := probe.Defaults(mode)
	seen := map[string]bool{}
	for i := 1; i < len(a); i++ {
		opt := a[i]
		key := opt
		if opt == "http" {
			key = "tcp" // one of tcp and http
		}
		if seen[key] {
			return cfg, c.Errf("probe: %s is given twice", opt)
		}
		seen[key] = true
		if opt == "tcp" {
			continue
		}
		if opt == "deny" || opt == "allow" {
			var ps []netip.Prefix
			for i+1 < len(a) && !isProbeOption(a[i+1]) {
				i++
				p, err := netip.ParsePrefix(a[i])
				if err != nil {
					return cfg, c.Errf("probe %s %q: not a CIDR such as 10.96.0.0/12 or fd00::/8", opt, a[i])
				}
				ps = append(ps, probe.Prefix(p))
			}
			if len(ps) == 0 {
				return cfg, c.Errf("probe %s takes one or more CIDRs such as 10.96.0.0/12", opt)
			}
			if opt == "deny" {
				cfg.Deny = ps
			} else {
				cfg.Allow = ps
			}
			continue
		}
		if i+1 >= len(a) {
			switch opt {
			case "http":
				return cfg, c.Errf("probe http takes a PATH such as /healthz")
			case "interval", "timeout", "fails", "passes", "ports_per_address":
				return cfg, c.Errf("probe %s takes a value", opt)
			}
			return cfg, c.Errf("probe: unknown option %q: want %s", opt, probeOptions)
		}
		i++
		v := a[i]
		switch opt {
		case "http":
			if len(v) == 0 || v[0] != '/' {
				return cfg, c.Errf("probe http %q: the path must start with /", v)
			}
			cfg.Path = v
		case "interval", "timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d < minProbeInterval {
				return cfg, c.Errf("probe %s %q: must be a duration of at least %s, such as 2s", opt, v, minProbeInterval)
			}
			if opt == "interval" {
				cfg.Interval = d
			} else {
				cfg.Timeout = d
			}
		case "fails", "passes":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxProbeCount {
				return cfg, c.Errf("probe %s %q: must be a whole number from 1 to %d", opt, v, maxProbeCount)
			}
			if opt == "fails" {
				cfg.Fails = n
			} else {
				cfg.Passes = n
			}
		case "ports_per_address":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxPortsPerAddress {
				return cfg, c.Errf("probe ports_per_address %q: must be a whole number from 1 to %d", v, maxPortsPerAddress)
			}
			cfg.PortsPerAddress = n
		default:
			return cfg, c.Errf("probe: unknown option %q: want %s", opt, probeOptions)
		}
	}
	if cfg.Timeout > cfg.Interval {
		return cfg, c.Errf("probe timeout %s: must not be longer than the interval %s", cfg.Timeout, cfg.Interval)
	}
	return cfg, nil
}

// isProbeOption says whether w is an option word of probe (it ends a list
// of CIDRs).
func isProbeOption(w string) bool {
	switch w {
	case "tcp", "http", "interval", "timeout", "fails", "passes", "ports_per_address", "deny", "allow":
		return true
	}
	return false
}

// probeDialer opens the probes' connections (nil: a net.Dialer); tests
// replace it.
var probeDialer probe.Dialer

// newProber makes m's prober (nil when the Corefile has no probe word): it
// probes the asked services' endpoints, in disconnected mode those of the
// sources that are not connected.
func (m *MCS) newProber(cfg *probe.Config) {
	if cfg == nil {
		return
	}
	m.table.TrackDemand()
	m.prober = probe.New(m.table, *cfg, probe.Options{
		Dialer: probeDialer,
		Stale: func(cluster string) bool {
			s := m.sourceFor(cluster)
			return s == nil || s.State() == source.Disconnected
		},
		Events: probe.Events{
			Probed: func(up bool) {
				if up {
					probesUp.Inc()
				} else {
					probesDown.Inc()
				}
			},
			Changed: logProbeChange,
			Refused: func(r probe.Refusal) {
				probeRefused.WithLabelValues(string(r.Reason)).Inc()
				if !r.Log {
					return
				}
				more := ""
				if r.Suppressed > 0 {
					more = " (" + strconv.Itoa(r.Suppressed) + " earlier ones not logged)"
				}
				log.Warningf("probe: %s is not probed: %s; it stays in the answers as without probe%s", r.Endpoint, r.Why(*cfg), more)
			},
			RoundFailed: func(err error) {
				probeRoundErrors.Inc()
				log.Errorf("probe: a round could not probe (its endpoints keep their state): %v", err)
			},
		},
	})
	how := "TCP connect"
	if cfg.Path != "" {
		how = "HTTP GET " + cfg.Path
	}
	log.Infof("probe %s: %s every %s (timeout %s) to the endpoints of the services asked in the last %s; down after %d failures, back after %d successes; at most %d ports an address; never loopback, unspecified, link-local, multicast or broadcast addresses%s%s",
		cfg.Mode, how, cfg.Interval, cfg.Timeout, probe.DefaultWindow, cfg.Fails, cfg.Passes, cfg.PortsPerAddress,
		prefixList(" unless in", cfg.Allow), prefixList(", nor", cfg.Deny))
}

// prefixList is what followed by ps, or "" when there are none.
func prefixList(what string, ps []netip.Prefix) string {
	if len(ps) == 0 {
		return ""
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return what + " " + strings.Join(s, " ")
}

func logProbeChange(c probe.Change) {
	more := ""
	if c.Suppressed > 0 {
		more = " (" + strconv.Itoa(c.Suppressed) + " earlier changes not logged)"
	}
	if c.Down {
		log.Warningf("probe: %s is down: %s: it leaves the answers%s", c.Endpoint, c.Reason, more)
		return
	}
	log.Infof("probe: %s is back: %s%s", c.Endpoint, c.Reason, more)
}

var (
	probes = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "probes_total",
		Help:      "Endpoint probes, by result (up, down).",
	}, []string{"result"})
	probesUp, probesDown = probes.WithLabelValues("up"), probes.WithLabelValues("down")

	probeRefused = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "probe_targets_refused_total",
		Help:      "Endpoints of asked services not probed (answered as without probing), once each time one becomes so, by reason (loopback, unspecified, link_local, multicast, broadcast, denied, ports_per_address).",
	}, []string{"reason"})

	probeRoundErrors = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "probe_round_errors_total",
		Help:      "Probe rounds that could not probe at all (no epoll instance: out of file descriptors, say); their endpoints keep their state.",
	})

	failOpenAnswers = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "fail_open_answers_total",
		Help:      "Answers of services whose endpoints all failed their probes, given with all of them (fail open).",
	})

	probeDownDesc = prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, subsystem, "probe_endpoints_down"),
		"Endpoints out of the answers because they failed their probes, by source cluster.", []string{"cluster"}, nil)
	probeTargetsDesc = prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, subsystem, "probe_endpoints"),
		"Endpoints the last probe round probed (those of services asked lately).", nil, nil)
)

// probeCollector reads the running probers at scrape time, as the source
// gauges are read (a reload leaves no stale series).
type probeCollector struct {
	mu   sync.Mutex
	live map[*probe.Prober]struct{}
}

var probers = &probeCollector{live: map[*probe.Prober]struct{}{}}

func init() {
	prometheus.MustRegister(probers)
	for _, r := range probe.Reasons { // each reason's series from the start
		probeRefused.WithLabelValues(string(r))
	}
}

func (c *probeCollector) add(p *probe.Prober)    { c.mu.Lock(); c.live[p] = struct{}{}; c.mu.Unlock() }
func (c *probeCollector) remove(p *probe.Prober) { c.mu.Lock(); delete(c.live, p); c.mu.Unlock() }

func (c *probeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- probeDownDesc
	ch <- probeTargetsDesc
}

func (c *probeCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range c.live { // a reload briefly runs two instances: report one
		down, probed := p.Down()
		for cluster, n := range down {
			ch <- prometheus.MustNewConstMetric(probeDownDesc, prometheus.GaugeValue, float64(n), cluster)
		}
		ch <- prometheus.MustNewConstMetric(probeTargetsDesc, prometheus.GaugeValue, float64(probed))
		return
	}
}
