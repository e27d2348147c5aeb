package mcsannotations

import (
	"crypto/ed25519"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/pkg/fall"
	clog "github.com/coredns/coredns/plugin/pkg/log"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/probe"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

const pluginName = "mcsannotations"

var klogOnce sync.Once

var log = clog.NewWithPlugin(pluginName)

func init() { plugin.Register(pluginName, setup) }

// defaultZone is the clusterset zone when the Corefile names none.
const defaultZone = "clusterset.local."

// Defaults and bounds of the Corefile words.
const (
	defaultTTL = 5
	maxTTL     = 3600

	// defaultNamespaceRecords caps the records one namespace's answers hold:
	// a few MB of answers (a record is about a hundred bytes with its share
	// of names), far more than a namespace of a thousand endpoints with a
	// few named ports each needs.
	defaultNamespaceRecords = 50000
	maxNamespaceRecords     = 10000000
)

func setup(c *caddy.Controller) error {
	// klog's logger is process-global and read by running informers: set it
	// once, never again on reload (that races with the old instance's
	// informers). Never klog.InitFlags here: a reload would panic.
	klogOnce.Do(func() { klog.SetLogger(logr.New(klogSink{})) })

	cfg, err := parse(c)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	m, err := newMCS(cfg)
	if err != nil {
		return plugin.Error(pluginName, err)
	}

	c.OnStartup(m.start)
	c.OnShutdown(m.stop)
	// A reload starts the new instance before the old one shuts down, and a
	// second open of the snapshot file would wait for the old one's lock:
	// the old instance closes it first, and reopens it if the reload fails.
	c.OnRestart(m.closeSnapshot)
	c.OnRestartFailed(m.reopenSnapshot)

	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
		m.Next = next
		return m
	})
	return nil
}

// config is the parsed Corefile block.
type config struct {
	zones       []string // [0] is the clusterset zone; the others are alias zones
	cluster     string
	kubeconfig  string // empty: in-cluster
	kubecontext string
	ttl         uint32
	locality    table.Locality
	fall        fall.F
	snapshot    string        // bbolt file; empty: no snapshot
	peers       []peerConfig  // in Corefile order
	hubs        []peerConfig  // in Corefile order: clusters whose MCS controller relays other clusters' records
	hubNS       []string      // hub_namespaces: what is read of every hub; nil: every namespace
	hubBeat     time.Duration // hub_heartbeat: under verify, how old an origin's heartbeat may be; 0: relay.DefaultHeartbeatTimeout
	hubLists    bool          // hub_require_pod_lists: under verify, a hub's word needs the origin's Pod list from the start
	hubUIDLists bool          // hub_require_pod_lists uids: its list by UID
	expire      time.Duration // 0: never
	enforce     bool          // imports enforce
	allow       []netip.Prefix
	verify      string                       // folder of public keys; empty: no verification
	keys        map[string]ed25519.PublicKey // by cluster ID, read from verify
	probe       *probe.Config                // nil: no probing
	nsRecords   int                          // records_per_namespace
}

// peerConfig is one peer word: a cluster watched through its own kubeconfig.
type peerConfig struct {
	name, kubeconfig, kubecontext string
}

// parse reads the plugin's one block. Every error names the offending line.
func parse(c *caddy.Controller) (config, error) {
	cfg := config{ttl: defaultTTL, locality: table.PreferLocal, nsRecords: defaultNamespaceRecords}
	var verifyErr func(error) error
	i := 0
	for c.Next() {
		if i > 0 {
			return cfg, plugin.ErrOnce
		}
		i++
		args := c.RemainingArgs()
		if len(args) == 0 {
			args = []string{defaultZone}
		}
		cfg.zones = nil
		for _, z := range args {
			n := plugin.Host(z).NormalizeExact()
			if len(n) != 1 {
				return cfg, c.Errf("invalid zone %q", z)
			}
			cfg.zones = append(cfg.zones, n[0])
		}
		seen := map[string]bool{}
		for _, z := range cfg.zones {
			if seen[z] {
				return cfg, c.Errf("zone %q is listed twice", z)
			}
			seen[z] = true
		}

		for c.NextBlock() {
			switch word := c.Val(); word {
			case "cluster":
				v, err := oneArg(c)
				if err != nil {
					return cfg, err
				}
				if !annotation.ValidClusterID(v) {
					return cfg, c.Errf("cluster %q: must be an RFC 1123 subdomain of at most %d characters", v, annotation.MaxClusterIDLen)
				}
				cfg.cluster = v
			case "kubeconfig":
				a := c.RemainingArgs()
				if len(a) < 1 || len(a) > 2 {
					return cfg, c.Errf("kubeconfig takes PATH [CONTEXT], got %d arguments", len(a))
				}
				cfg.kubeconfig = a[0]
				if len(a) == 2 {
					cfg.kubecontext = a[1]
				}
			case "ttl":
				v, err := oneArg(c)
				if err != nil {
					return cfg, err
				}
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 || n > maxTTL {
					return cfg, c.Errf("ttl %q: must be a whole number of seconds from 0 to %d", v, maxTTL)
				}
				cfg.ttl = uint32(n)
			case "records_per_namespace":
				v, err := oneArg(c)
				if err != nil {
					return cfg, err
				}
				n, err := strconv.Atoi(v)
				if err != nil || n < 1 || n > maxNamespaceRecords {
					return cfg, c.Errf("records_per_namespace %q: must be a whole number from 1 to %d", v, maxNamespaceRecords)
				}
				cfg.nsRecords = n
			case "locality":
				v, err := oneArg(c)
				if err != nil {
					return cfg, err
				}
				switch v {
				case "prefer-local":
					cfg.locality = table.PreferLocal
				case "any":
					cfg.locality = table.Any
				default:
					return cfg, c.Errf("locality %q: must be prefer-local or any", v)
				}
			case "snapshot":
				v, err := oneArg(c)
				if err != nil {
					return cfg, err
				}
				cfg.snapshot = v
			case "peer":
				p, err := clusterWord(c, "peer", cfg.peers)
				if err != nil {
					return cfg, err
				}
				cfg.peers = append(cfg.peers, p)
			case "hub":
				h, err := clusterWord(c, "hub", cfg.hubs)
				if err != nil {
					return cfg, err
				}
				cfg.hubs = append(cfg.hubs, h)
			case "hub_namespaces":
				if cfg.hubNS != nil {
					return cfg, c.Errf("hub_namespaces is given twice")
				}
				ns := c.RemainingArgs()
				if len(ns) == 0 {
					return cfg, c.Errf("hub_namespaces takes one or more namespace names")
				}
				if err := relay.CheckNamespaces(ns); err != nil {
					return cfg, c.Errf("hub_namespaces: %v", err)
				}
				cfg.hubNS = ns
			case "hub_heartbeat":
				if cfg.hubBeat != 0 {
					return cfg, c.Errf("hub_heartbeat is given twice")
				}
				v, err := oneArg(c)
				if err != nil {
					return cfg, err
				}
				d, err := time.ParseDuration(v)
				if err != nil || d <= 0 {
					return cfg, c.Errf("hub_heartbeat %q: must be a positive duration such as 5m", v)
				}
				cfg.hubBeat = d
			case "hub_require_pod_lists":
				a := c.RemainingArgs()
				switch {
				case len(a) > 1 || len(a) == 1 && a[0] != "uids":
					return cfg, c.Errf("hub_require_pod_lists takes no argument or uids, got %q", strings.Join(a, " "))
				case cfg.hubLists:
					return cfg, c.Errf("hub_require_pod_lists is given twice")
				}
				cfg.hubLists, cfg.hubUIDLists = true, len(a) == 1
			case "expire":
				v, err := oneArg(c)
				if err != nil {
					return cfg, err
				}
				d, err := time.ParseDuration(v)
				if err != nil || d <= 0 {
					return cfg, c.Errf("expire %q: must be a positive duration such as 30m or 24h", v)
				}
				cfg.expire = d
			case "imports":
				a := c.RemainingArgs()
				if len(a) == 0 || a[0] != "enforce" {
					return cfg, c.Errf("imports takes enforce [allow CIDR...]")
				}
				cfg.enforce = true
				if len(a) == 1 {
					break
				}
				if a[1] != "allow" || len(a) == 2 {
					return cfg, c.Errf("imports enforce takes allow CIDR... after it, got %q", strings.Join(a[1:], " "))
				}
				for _, v := range a[2:] {
					p, err := netip.ParsePrefix(v)
					if err != nil {
						return cfg, c.Errf("imports enforce allow %q: not a CIDR such as 10.0.0.0/8 or fd00::/8", v)
					}
					cfg.allow = append(cfg.allow, p.Masked())
				}
			case "verify":
				if cfg.verify != "" {
					return cfg, c.Errf("verify is given twice")
				}
				v, err := oneArg(c)
				if err != nil {
					return cfg, err
				}
				keys, err := annotation.ReadPublicKeys(v)
				if err != nil {
					return cfg, c.Errf("verify %s: cannot read the public keys: %v", v, err)
				}
				cfg.verify, cfg.keys = v, keys
				// Whether every cluster has a key is known at the end of
				// the block; that error names this line, as c.Errf would.
				file, line := c.File(), c.Line()
				verifyErr = func(err error) error {
					return fmt.Errorf("%s:%d - Error during parsing: %w", file, line, err)
				}
			case "probe":
				if cfg.probe != nil {
					return cfg, c.Errf("probe is given twice")
				}
				pc, err := parseProbe(c)
				if err != nil {
					return cfg, err
				}
				cfg.probe = &pc
			case "fallthrough":
				cfg.fall.SetZonesFromArgs(c.RemainingArgs())
			default:
				return cfg, c.Errf("unknown property %q", word)
			}
		}
	}
	for _, p := range cfg.peers {
		if cfg.cluster != "" && p.name == cfg.cluster {
			return cfg, fmt.Errorf("peer %q has the name of the local cluster", p.name)
		}
	}
	if cfg.hubNS != nil && len(cfg.hubs) == 0 {
		return cfg, fmt.Errorf("hub_namespaces without a hub")
	}
	if cfg.hubBeat != 0 && len(cfg.hubs) == 0 {
		return cfg, fmt.Errorf("hub_heartbeat without a hub")
	}
	if cfg.hubBeat != 0 && cfg.verify == "" {
		return cfg, fmt.Errorf("hub_heartbeat without verify: only a reader that verifies checks the origins' heartbeats")
	}
	if cfg.hubLists && len(cfg.hubs) == 0 {
		return cfg, fmt.Errorf("hub_require_pod_lists without a hub")
	}
	if cfg.hubLists && cfg.verify == "" {
		return cfg, fmt.Errorf("hub_require_pod_lists without verify: only a reader that verifies checks the origins' Pod lists")
	}
	for _, h := range cfg.hubs {
		if cfg.cluster != "" && h.name == cfg.cluster {
			return cfg, fmt.Errorf("hub %q has the name of the local cluster", h.name)
		}
	}
	if cfg.keys != nil {
		// Every watched cluster needs its key. A local ID not in the
		// Corefile is checked once it is known (newMCS).
		if cfg.cluster != "" {
			if err := cfg.hasKey(cfg.cluster, "the local cluster"); err != nil {
				return cfg, verifyErr(err)
			}
		}
		for _, p := range cfg.peers {
			if err := cfg.hasKey(p.name, "peer"); err != nil {
				return cfg, verifyErr(err)
			}
		}
	}
	return cfg, nil
}

// clusterWord reads the arguments of a peer or hub word (NAME KUBECONFIG
// [CONTEXT]), whose name must be new in listed.
func clusterWord(c *caddy.Controller, word string, listed []peerConfig) (peerConfig, error) {
	a := c.RemainingArgs()
	if len(a) < 2 || len(a) > 3 {
		return peerConfig{}, c.Errf("%s takes NAME KUBECONFIG [CONTEXT], got %d arguments", word, len(a))
	}
	if !annotation.ValidClusterID(a[0]) {
		return peerConfig{}, c.Errf("%s %q: the name must be an RFC 1123 subdomain of at most %d characters", word, a[0], annotation.MaxClusterIDLen)
	}
	for _, p := range listed {
		if p.name == a[0] {
			return peerConfig{}, c.Errf("%s %q is listed twice", word, a[0])
		}
	}
	p := peerConfig{name: a[0], kubeconfig: a[1]}
	if len(a) == 3 {
		p.kubecontext = a[2]
	}
	return p, nil
}

// hasKey says whether verify has the public key of cluster, which is what
// (the local cluster, a peer).
func (cfg config) hasKey(cluster, what string) error {
	if cfg.keys == nil {
		return nil
	}
	return annotation.RequireKey(cfg.keys, cfg.verify, cluster, what)
}

func oneArg(c *caddy.Controller) (string, error) {
	word := c.Val()
	a := c.RemainingArgs()
	if len(a) != 1 {
		return "", c.Errf("%s takes exactly one argument, got %d", word, len(a))
	}
	return a[0], nil
}
