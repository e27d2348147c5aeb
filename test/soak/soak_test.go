// Package soak runs bin/coredns and the MCS controller (bin/mcs-annotator
// --mcs-controller) against two real kube-apiservers (edge-a, their own
// cluster, and edge-b, a peer behind a cuttable link they both read through)
// through a loop of faults for a set time, while Pods churn, a DNS client
// asks every service without pause and a reader lists the controller's
// objects every 500 ms, and compares each answer and each service's objects
// with what the API servers say they should be. `make soak` runs it for
// SOAK_DURATION (10m); `make soak-short` for about 75 s.
//
// The faults, in turn until the time is up: edge-a's API server killed
// (SIGKILL) and started again, hung (SIGSTOP) and resumed; the controller
// restarted; the peer link cut and restored three times (flaps), then
// silent (accepting, passing nothing); the controller killed (SIGKILL) and
// started 3 s later; CoreDNS restarted, reloaded (SIGUSR1), and restarted
// over a damaged snapshot; edge-b's API server killed and started again;
// the controller restarted while the peer link is cut.
//
// Four services are exported Headless (answered with their endpoints), two
// ClusterSetIP (vip-N, answered with the ClusterSetIP the controller
// allocates). An answer is ok (the current set of ready addresses; the
// ClusterSetIP), stale (a set the service had before: the change has not
// reached DNS yet), wrong (a set the service never had, or another address
// than the ClusterSetIP), missing (no address of a cluster whose part of
// the service has some, no ClusterSetIP; counted apart within 10 s of a
// CoreDNS start, when a damaged snapshot leaves it empty until its sources
// have listed) or failed (no reply, or an error rcode). Staleness is
// measured from the change, and separately from the end of the last fault
// that touched the cluster (after recovery: API server and peer faults
// touch one cluster, CoreDNS's restarts and reloads both).
//
// Each service's MCS objects are classified the same way (mcsVerdict): its
// ServiceImport (type, port, clusters), its ClusterSetIP (the derived
// Service's ClusterIPs: the same all the run, since every service stays
// exported) and its EndpointSlices' ready addresses by source cluster, a
// stale set's staleness counted from when it stopped being current (the
// whole lag of a controller that stops writing, however often the part
// changes since). Their faults are counted apart: edge-a's API server's and
// the controller's own touch both clusters' parts, the peer's the peer's
// part, CoreDNS's none.
//
// Besides any wrong answer or object, a run fails when it answers too
// little or too late (the bounds below), or an object is stale or missing
// past the same bound after recovery: a healthy run stays far inside them,
// also on a loaded 2-core machine, while a CoreDNS or controller that stops
// answering or writing, or keeps an old answer, after a fault does not.
package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

const soakCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        peer edge-b {PEERB}
        snapshot {DIR}/snapshot.db
        locality any
        ttl 5
    }
}
`

const (
	services             = 4 // exported Headless (answered with the endpoints), per cluster, the same names in both
	clusterSetIPServices = 2 // exported ClusterSetIP (answered with the ClusterSetIP), named vip-N
	podsPerService       = 3 // per cluster
	churnEvery           = 300 * time.Millisecond
	probeEvery           = 10 * time.Millisecond
	opTimeout            = 5 * time.Second
	startWindow          = 10 * time.Second // after a CoreDNS start, missing answers are counted apart
)

// The bounds of a passing run.
const (
	// maxStalenessAfterRecovery bounds how long after the end of the last
	// fault that touched a cluster an answer may still hold an old set of
	// its addresses: the time to reconnect, relist and catch up with the
	// churn, with a wide margin for a loaded machine. Faults touch each
	// cluster again about this often, so answers that stay old are caught
	// by minOKShare rather than by this bound.
	maxStalenessAfterRecovery = 20 * time.Second
	// maxMissingShare bounds the answers missing a cluster's part outside
	// the start window, as a share of the answers checked.
	maxMissingShare = 0.005
	// maxFailedShare bounds the failed answers (no reply, or an error
	// rcode) while CoreDNS runs and is not being restarted, as a share of
	// the answers checked. A query that times out takes a second, so a
	// CoreDNS that stops answering shows in far fewer answers checked.
	maxFailedShare = 0.005
	// minOKShare bounds from below the answers that are current, as a share
	// of those checked while CoreDNS ran, outside the start window: most
	// answers are current, between faults and during those that leave a
	// cluster's part as it was.
	minOKShare = 0.7
	// maxMCSReadErrorShare bounds the reads of the MCS objects that fail
	// (each list bounded by mcsReadTimeout) while edge-a's API server is
	// up, as a share of the reads: a check that cannot read checks nothing.
	maxMCSReadErrorShare = 0.1
	// minMCSOKShare bounds from below the services' objects that are
	// current, as a share of those checked: faults touch the objects about
	// every 10 s, so a controller that stops writing some of them would
	// rarely stay stale past maxStalenessAfterRecovery after one, but it
	// leaves far fewer current (44% for one that stopped writing a peer's
	// slices). The controller damps a service that changes every few
	// hundred milliseconds, as the soak's churn does, so a healthy run is
	// well below 100%: about 68% with damping.
	minMCSOKShare = 0.5
)

// Result is what a soak reports (soak.json).
type Result struct {
	Duration                       string         `json:"duration"`
	Cycles                         int            `json:"fault_cycles"`
	Faults                         map[string]int `json:"faults"`
	ChurnOps                       int64          `json:"churn_ops"`
	ChurnErrors                    int64          `json:"churn_errors"`
	Checked                        int64          `json:"answers_checked"`
	OK                             int64          `json:"ok"`
	Stale                          int64          `json:"stale"`
	Wrong                          int64          `json:"wrong"`
	Missing                        int64          `json:"missing"`
	MissingAfterStart              int64          `json:"missing_within_10s_of_a_coredns_start"`
	Failed                         int64          `json:"failed"`
	FailedWhileCoreDNSDown         int64          `json:"failed_while_coredns_down"`
	LongestStalenessMs             int64          `json:"longest_staleness_ms"`
	LongestStalenessAfterRecoverMs int64          `json:"longest_staleness_after_recovery_ms"`
	LongestStalenessAfterRecoverAt string         `json:"longest_staleness_after_recovery_at,omitempty"`
	WrongExamples                  []string       `json:"wrong_examples,omitempty"`
	MissingExamples                []string       `json:"missing_examples,omitempty"`
	ClusterSetIPChecked            int64          `json:"clustersetip_answers_checked"` // of the answers checked
	MCS                            MCSResult      `json:"mcs_objects"`
}

// MCSResult is what the checks of the MCS controller's objects found: each
// check reads every ServiceImport, Service and EndpointSlice of the
// namespace and classifies each service's (checked counts services).
type MCSResult struct {
	Reads                          int64    `json:"reads"`
	ReadErrors                     int64    `json:"read_errors"`
	Checked                        int64    `json:"checked"`
	OK                             int64    `json:"ok"`
	Stale                          int64    `json:"stale"`
	Wrong                          int64    `json:"wrong"`
	Missing                        int64    `json:"missing"`
	MissingPastBound               int64    `json:"missing_past_the_bound"`
	LongestStalenessMs             int64    `json:"longest_staleness_ms"`
	LongestStalenessAfterRecoverMs int64    `json:"longest_staleness_after_recovery_ms"`
	LongestStalenessAfterRecoverAt string   `json:"longest_staleness_after_recovery_at,omitempty"`
	LongestMissingAfterRecoverMs   int64    `json:"longest_missing_after_recovery_ms"`
	LongestMissingAfterRecoverAt   string   `json:"longest_missing_after_recovery_at,omitempty"`
	WrongExamples                  []string `json:"wrong_examples,omitempty"`
	MissingExamples                []string `json:"missing_examples,omitempty"`
}

func duration(t *testing.T) time.Duration {
	v := os.Getenv("SOAK_DURATION")
	if v == "" {
		return 75 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 10*time.Second || d > 24*time.Hour {
		t.Fatalf("SOAK_DURATION %q: want a duration from 10s to 24h", v)
	}
	return d
}

// pod is the model of one exporter Pod.
type pod struct {
	cluster, name, svc, ip string
	ready                  bool
}

// model is what the API servers hold, as the churn wrote it, and every set
// of addresses each service has had in each cluster (the sets an answer may
// lag behind). Sets are kept per cluster: the clusters reach DNS
// independently (a cut peer's part lags while the local part is current).
type model struct {
	mu      sync.Mutex
	pods    map[string]*pod          // by cluster/name
	current map[part]string          // the address set now
	since   map[part]time.Time       // when it became current
	history map[part]map[string]bool // every set it had
	// ended is when each set it had last stopped being current (or, for a
	// set a write might pass through, when that write's outcome was known);
	// pending are the sets expected since the last settle.
	ended   map[part]map[string]time.Time
	pending map[part][]string
	// By scope (a cluster's part of the answers, "edge-a", or of the MCS
	// objects, "mcs/edge-a"): when the last fault that touched it ended,
	// its name, and whether one is on.
	faultEnd  map[string]time.Time
	lastFault map[string]string
	inFault   map[string]bool
}

// The scopes of faults: a cluster's part of the DNS answers, and of the MCS
// controller's objects (which a fault of edge-a's API server or of the
// controller touches for both clusters, a CoreDNS fault for none).
const (
	dnsA, dnsB = "edge-a", "edge-b"
	mcsA, mcsB = "mcs/edge-a", "mcs/edge-b"
)

// part is a service's addresses in one cluster.
type part struct{ svc, cluster string }

func (m *model) set(k part) string {
	var ips []string
	for _, p := range m.pods {
		if p.svc == k.svc && p.cluster == k.cluster && p.ready {
			ips = append(ips, p.ip)
		}
	}
	slices.Sort(ips)
	return strings.Join(ips, ",")
}

// expect records the set k has with the model's Pods now as one it may have
// (before the write that makes it so, so that an answer that comes first is
// not taken as wrong).
func (m *model) expect(k part) {
	if m.history[k] == nil {
		m.history[k] = map[string]bool{}
	}
	s := m.set(k)
	m.history[k][s] = true
	m.pending[k] = append(m.pending[k], s)
}

// settle makes the set k has with the model's Pods current; the set it
// replaces and every other set expected since the last settle end now.
func (m *model) settle(k part) {
	m.expect(k)
	now, s := time.Now(), m.set(k)
	if m.ended[k] == nil {
		m.ended[k] = map[string]time.Time{}
	}
	for _, x := range append(m.pending[k], m.current[k]) {
		if x != s {
			m.ended[k][x] = now
		}
	}
	m.pending[k] = nil
	if m.current[k] != s {
		m.current[k], m.since[k] = s, now
	}
}

func newModel() *model {
	return &model{pods: map[string]*pod{}, current: map[part]string{}, since: map[part]time.Time{}, history: map[part]map[string]bool{},
		ended: map[part]map[string]time.Time{}, pending: map[part][]string{},
		faultEnd: map[string]time.Time{}, lastFault: map[string]string{}, inFault: map[string]bool{}}
}

// clusterOf is the cluster of a test address: 10.<cluster index + 1>.x.y.
func clusterOf(ip string) string {
	if strings.HasPrefix(ip, "10.1.") {
		return "edge-a"
	}
	return "edge-b"
}

// verdict classifies an answer for svc: ok, stale (with its staleness from
// the change and from the end of the last fault that touched the stale
// cluster, -1 during one, and what that was), missing or wrong.
func (m *model) verdict(svc string, got []string, now time.Time) (v string, stale, after time.Duration, afterWhat string) {
	by := map[string][]string{}
	for _, ip := range got {
		by[clusterOf(ip)] = append(by[clusterOf(ip)], ip)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.classify(svc, by, "", false, now)
	return r.v, r.stale, r.after, r.afterWhat
}

// classified is the verdict on one view of a service (a DNS answer, or the
// MCS objects) against the model.
type classified struct {
	v string // ok, stale, missing, wrong
	// stale is the staleness from the change (or from the end of the set
	// shown: classify's fromEnd); after, from the later of that and the end
	// of the last fault that touched the scope (for missing: from that end
	// alone), -1 while one is on.
	stale, after time.Duration
	afterWhat    string
	why          string // for wrong and missing: what
}

// classify compares by (the sorted addresses of svc by cluster) with every
// set each cluster's part has had, the faults read in scope prefix + cluster
// name. A stale set's staleness counts from the change to the current set,
// or with fromEnd from when the set shown stopped being current (the
// whole lag, also when the part changed again since). m.mu is held.
func (m *model) classify(svc string, by map[string][]string, prefix string, fromEnd bool, now time.Time) classified {
	r := classified{v: "ok", after: -1}
	var missing []string
	for _, cl := range []string{"edge-a", "edge-b"} {
		k, scope := part{svc, cl}, prefix+cl
		s := strings.Join(by[cl], ",")
		switch {
		case s == m.current[k]:
		case m.history[k][s]:
			r.v = "stale"
			from := m.since[k]
			if e, ok := m.ended[k][s]; ok && fromEnd {
				from = e
			}
			r.stale = max(r.stale, now.Sub(from))
			if a := now.Sub(later(from, m.faultEnd[scope])); !m.inFault[scope] && a > r.after {
				r.after, r.afterWhat = a, fmt.Sprintf("%s's part of %s, after %s", cl, svc, m.lastFault[scope])
			}
		case s == "":
			missing = append(missing, cl) // a cluster's part absent (not synced yet after an empty start)
		default:
			return classified{v: "wrong", after: -1, why: fmt.Sprintf("%s's part %q, never had", cl, s)}
		}
	}
	if len(missing) > 0 {
		return m.missing(svc, missing, prefix, now, fmt.Sprintf("no part of %s", strings.Join(missing, " or ")))
	}
	return r
}

// missing is the verdict missing on svc for what, in the parts of these
// clusters, with the time since the end of the last fault that touched any
// of their scopes (-1 while one is on). m.mu is held.
func (m *model) missing(svc string, clusters []string, prefix string, now time.Time, what string) classified {
	r := classified{v: "missing", after: -1, why: what}
	var end time.Time
	for _, cl := range clusters {
		if m.inFault[prefix+cl] {
			return r
		}
		if e := m.faultEnd[prefix+cl]; e.After(end) {
			end, r.afterWhat = e, fmt.Sprintf("%s of %s, after %s", what, svc, m.lastFault[prefix+cl])
		}
	}
	r.after = now.Sub(end)
	return r
}

type counts struct {
	checked, ok, stale, wrong, missing, missingStart, failed, failedDown atomic.Int64
	vipChecked                                                           atomic.Int64
	longest, longestAfter                                                atomic.Int64
	churnOps, churnErrors                                                atomic.Int64
	mu                                                                   sync.Mutex
	examples, missingExamples                                            []string
	longestAfterWhat                                                     string
}

// longestWith stores d in a (milliseconds) and label in *what when d is
// longer than a holds; a negative d (during a fault) is not stored. mu
// guards what.
func longestWith(mu *sync.Mutex, a *atomic.Int64, what *string, d time.Duration, label string) {
	if d < 0 {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	if ms := d.Milliseconds(); ms > a.Load() {
		a.Store(ms)
		*what = label
	}
}

func maxInto(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// isClusterSetIP tells whether svc is exported as ClusterSetIP.
func isClusterSetIP(svc string) bool { return strings.HasPrefix(svc, "vip-") }

// vipVerdict classifies an answer for a ClusterSetIP service: its
// ClusterSetIPs (want, IPv4) are ok, no address is missing, anything else
// (a Pod's address, another IP) is wrong.
func vipVerdict(got, want []string) string {
	switch {
	case slices.Equal(got, want):
		return "ok"
	case len(got) == 0:
		return "missing"
	}
	return "wrong"
}

func ipv4(ips []string) []string {
	var out []string
	for _, ip := range ips {
		if !strings.Contains(ip, ":") {
			out = append(out, ip)
		}
	}
	slices.Sort(out)
	return out
}

func TestSoak(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	total := duration(t)
	cs := harness.StartClusters(t, "edge-a", "edge-b")
	a, b := cs[0], cs[1]
	clusters := map[string]*harness.Cluster{"edge-a": a, "edge-b": b}
	const ns = "soak"
	for _, c := range cs {
		c.CreateNamespace(t, ns)
	}
	a.InstallMCSCRDs(t) // edge-a's controller writes ServiceImports there; its CoreDNS answers their ClusterSetIPs
	m := newModel()
	var names []string
	for s := range services + clusterSetIPServices {
		svc := fmt.Sprintf("svc-%d", s)
		if s >= services {
			svc = fmt.Sprintf("vip-%d", s-services)
		}
		names = append(names, svc)
		for ci, c := range cs {
			var rp []harness.ReadyPod
			for i := range podsPerService {
				p := &pod{cluster: c.Name, name: fmt.Sprintf("%s-%d", svc, i), svc: svc, ip: fmt.Sprintf("10.%d.%d.%d", ci+1, s, i+1), ready: true}
				m.pods[c.Name+"/"+p.name] = p
				rp = append(rp, harness.ReadyPod{Pod: exporter(p), IPs: []string{p.ip}})
			}
			c.CreateReadyPods(t, ns, rp...)
			m.settle(part{svc, c.Name})
		}
	}

	peer := harness.StartProxy(t, b.APIServerAddr())
	d := harness.StartCoreDNS(t, soakCorefile, map[string]string{"KUBECONFIG": a.Kubeconfig, "PEERB": b.KubeconfigVia(t, peer)})
	// The MCS controller in edge-a, edge-b its peer through the same link.
	ctlArgs := []string{"--cluster", "edge-a", "--leader-elect=false", "--mcs-controller", "--peer", "edge-b=" + b.KubeconfigVia(t, peer)}
	ctl := harness.StartAnnotator(t, a.Kubeconfig, ctlArgs...)
	objs, err := newMCSReader(a.Config, ns)
	if err != nil {
		t.Fatal(err)
	}
	vips := map[string][]string{} // the ClusterSetIPs, which stay while the service is exported (all the run)
	for _, svc := range names {
		want := strings.Split(m.current[part{svc, "edge-a"}]+","+m.current[part{svc, "edge-b"}], ",")
		slices.Sort(want)
		if isClusterSetIP(svc) {
			vips[svc] = objs.importIPs(t, svc)
			want = ipv4(vips[svc])
		}
		harness.Eventually(t, 30*time.Second, func() error {
			r, err := d.Exchange(harness.Query{Name: svc + "." + ns + ".svc.clusterset.local.", Type: dns.TypeA})
			if err != nil {
				return err
			}
			if got := harness.Addrs(r); !slices.Equal(got, want) {
				return fmt.Errorf("%s: %v, want %v", svc, got, want)
			}
			return nil
		})
	}

	harness.Eventually(t, time.Minute, func() error {
		o, at, err := objs.read(context.Background())
		if err != nil {
			return err
		}
		for _, svc := range names {
			if v := m.mcsVerdict(svc, vips[svc], o, at); v.v != "ok" {
				return fmt.Errorf("%s's MCS objects: %s %s", svc, v.v, v.why)
			}
		}
		return nil
	})

	var (
		c         counts
		mc        mcsCounts
		down      sync.Map // cluster name -> true while its API server is down or hung
		coreDown  atomic.Bool
		coreStart atomic.Int64 // unix ns of CoreDNS's last start
		wg        sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	m.mu.Lock()
	for _, scope := range []string{dnsA, dnsB, mcsA, mcsB} {
		m.faultEnd[scope], m.lastFault[scope] = start, "the start"
	}
	m.mu.Unlock()

	// Churn: one Pod at a time, a Ready flip or a replacement (new IP).
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		next := 100
		for ctx.Err() == nil {
			time.Sleep(churnEvery)
			keys := make([]string, 0, len(m.pods))
			m.mu.Lock()
			for k, p := range m.pods {
				if _, isDown := down.Load(p.cluster); !isDown {
					keys = append(keys, k)
				}
			}
			m.mu.Unlock()
			if len(keys) == 0 {
				continue
			}
			slices.Sort(keys)
			k := keys[rng.IntN(len(keys))]
			m.mu.Lock()
			p := *m.pods[k]
			cl := clusters[p.cluster]
			pk := part{p.svc, p.cluster}
			replace := rng.IntN(3) == 0
			after := p
			if replace {
				next++
				ci := 1
				if p.cluster == "edge-b" {
					ci = 2
				}
				after.name = fmt.Sprintf("%s-r%d", p.svc, next)
				after.ip = fmt.Sprintf("10.%d.%d.%d", ci, 100+next/250, next%250+1)
				after.ready = true
			} else {
				after.ready = !p.ready
			}
			// Every set the write may pass through is expected before it is
			// made: for a replacement, the old Pod gone and the new one not
			// yet there, then the new one.
			delete(m.pods, k)
			m.expect(pk)
			m.pods[p.cluster+"/"+after.name] = &after
			m.expect(pk)
			delete(m.pods, p.cluster+"/"+after.name)
			m.pods[k] = &p
			m.mu.Unlock()

			c.churnOps.Add(1)
			var err error
			if replace {
				err = replacePod(ctx, cl.Client, ns, p, after)
			} else {
				err = setStatus(ctx, cl.Client, ns, after)
			}
			m.mu.Lock()
			if err == nil {
				delete(m.pods, k)
				m.pods[p.cluster+"/"+after.name] = &after
				m.settle(pk)
			}
			m.mu.Unlock()
			if err != nil {
				c.churnErrors.Add(1)
				// What the API server holds now is unknown: read it again.
				if err := relist(ctx, cl, ns, m); err != nil {
					t.Logf("soak: relist of %s: %v", cl.Name, err)
				}
			}
		}
	}()

	// Probing: every service in turn, without pause.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			time.Sleep(probeEvery)
			svc := names[i%len(names)]
			wasDown := coreDown.Load()
			r, err := harness.Exchange(d.Addr(), harness.Query{Name: svc + "." + ns + ".svc.clusterset.local.", Type: dns.TypeA, Timeout: time.Second})
			now := time.Now()
			c.checked.Add(1)
			if err != nil || (r.Rcode != dns.RcodeSuccess && r.Rcode != dns.RcodeNameError) {
				if wasDown || coreDown.Load() {
					c.failedDown.Add(1)
				} else {
					c.failed.Add(1)
				}
				continue
			}
			got := harness.Addrs(r) // sorted
			var (
				v, afterWhat string
				stale, after time.Duration
			)
			if isClusterSetIP(svc) {
				c.vipChecked.Add(1)
				v = vipVerdict(got, ipv4(vips[svc]))
			} else {
				v, stale, after, afterWhat = m.verdict(svc, got, now)
			}
			switch v {
			case "ok":
				c.ok.Add(1)
			case "missing":
				if now.Sub(time.Unix(0, coreStart.Load())) < startWindow {
					c.missingStart.Add(1)
				} else {
					c.missing.Add(1)
					c.mu.Lock()
					if len(c.missingExamples) < 10 {
						c.missingExamples = append(c.missingExamples, fmt.Sprintf("%s at %s: %v", svc, now.Sub(start).Round(time.Millisecond), got))
					}
					c.mu.Unlock()
				}
			case "stale":
				c.stale.Add(1)
				maxInto(&c.longest, stale.Milliseconds())
				longestWith(&c.mu, &c.longestAfter, &c.longestAfterWhat, after, fmt.Sprintf("%s at %s", afterWhat, now.Sub(start).Round(time.Millisecond)))
			default:
				c.wrong.Add(1)
				c.mu.Lock()
				if len(c.examples) < 10 {
					m.mu.Lock()
					c.examples = append(c.examples, fmt.Sprintf("%s at %s: %v, current %q and %q (ClusterSetIP %v)", svc, now.Sub(start).Round(time.Millisecond), got,
						m.current[part{svc, "edge-a"}], m.current[part{svc, "edge-b"}], vips[svc]))
					m.mu.Unlock()
				}
				c.mu.Unlock()
			}
		}
	}()

	// The MCS controller's objects, read every mcsCheckEvery while edge-a's
	// API server is up.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			time.Sleep(mcsCheckEvery)
			if _, isDown := down.Load("edge-a"); !isDown {
				mc.check(ctx, objs, m, names, vips, start)
			}
		}
	}()

	// The faults, in the test's goroutine (the harness may stop it).
	faults := map[string]int{}
	fault := func(name string, touches []string, f func()) bool {
		if time.Since(start) >= total || t.Failed() {
			return false
		}
		if !d.Running() {
			t.Fatalf("CoreDNS exited on its own before %s:\n%s", name, d.LogTail(40))
		}
		if !ctl.Running() {
			t.Fatalf("the MCS controller exited on its own before %s:\n%s", name, harness.Tail(ctl.Process().LogPath, 40))
		}
		m.mu.Lock()
		for _, cl := range touches {
			m.inFault[cl] = true
		}
		m.mu.Unlock()
		t.Logf("soak %s: %s", time.Since(start).Round(time.Second), name)
		f()
		faults[name]++
		m.mu.Lock()
		for _, cl := range touches {
			m.inFault[cl], m.faultEnd[cl], m.lastFault[cl] = false, time.Now(), name
		}
		m.mu.Unlock()
		time.Sleep(2 * time.Second) // settle: changes must show within this after recovery
		return true
	}
	apiDown := func(cl *harness.Cluster, f func()) {
		down.Store(cl.Name, true)
		defer down.Delete(cl.Name)
		f()
	}
	restartCoreDNS := func(between func()) {
		coreDown.Store(true)
		d.Stop(t)
		between()
		d.Start(t)
		coreStart.Store(time.Now().UnixNano())
		coreDown.Store(false)
	}
	restartController := func(sig syscall.Signal, between func()) {
		ctl.Kill(t, sig)
		between()
		ctl = harness.StartAnnotator(t, a.Kubeconfig, ctlArgs...)
	}
	cycles := 0
	for ok := true; ok; cycles++ {
		ok = fault("apiserver_kill", []string{dnsA, mcsA, mcsB}, func() {
			apiDown(a, func() { a.KillAPIServer(t, syscall.SIGKILL); time.Sleep(3 * time.Second); a.StartAPIServer(t) })
		}) &&
			fault("apiserver_hang", []string{dnsA, mcsA, mcsB}, func() {
				apiDown(a, func() { a.PauseAPIServer(t); time.Sleep(4 * time.Second); a.ResumeAPIServer(t) })
			}) &&
			fault("controller_restart", []string{mcsA, mcsB}, func() { restartController(syscall.SIGTERM, func() {}) }) &&
			fault("peer_flaps", []string{dnsB, mcsB}, func() {
				for range 3 {
					peer.Cut(t)
					time.Sleep(1500 * time.Millisecond)
					peer.Restore(t)
					time.Sleep(1500 * time.Millisecond)
				}
			}) &&
			fault("peer_silent", []string{dnsB, mcsB}, func() { peer.Blackhole(t); time.Sleep(4 * time.Second); peer.Restore(t) }) &&
			fault("controller_kill", []string{mcsA, mcsB}, func() {
				restartController(syscall.SIGKILL, func() { time.Sleep(3 * time.Second) }) // the churn goes on meanwhile
			}) &&
			fault("coredns_restart", []string{dnsA, dnsB}, func() { restartCoreDNS(func() {}) }) &&
			fault("coredns_reload", []string{dnsA, dnsB}, func() {
				if err := d.Process().Signal(syscall.SIGUSR1); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Second)
			}) &&
			fault("snapshot_damage", []string{dnsA, dnsB}, func() {
				restartCoreDNS(func() { damage(t, filepath.Join(d.Dir, "snapshot.db")) })
			}) &&
			fault("peer_apiserver_kill", []string{dnsB, mcsB}, func() {
				apiDown(b, func() { b.KillAPIServer(t, syscall.SIGKILL); time.Sleep(3 * time.Second); b.StartAPIServer(t) })
			}) &&
			fault("controller_restart_peer_cut", []string{dnsB, mcsA, mcsB}, func() {
				peer.Cut(t)
				restartController(syscall.SIGTERM, func() { time.Sleep(time.Second) })
				time.Sleep(3 * time.Second) // the new controller holds edge-b's share as the slices carry it
				peer.Restore(t)
			})
	}
	cancel()
	wg.Wait()

	res := Result{
		Duration: time.Since(start).Round(time.Second).String(), Cycles: cycles, Faults: faults,
		ChurnOps: c.churnOps.Load(), ChurnErrors: c.churnErrors.Load(),
		Checked: c.checked.Load(), OK: c.ok.Load(), Stale: c.stale.Load(), Wrong: c.wrong.Load(), Missing: c.missing.Load(), MissingAfterStart: c.missingStart.Load(),
		Failed: c.failed.Load(), FailedWhileCoreDNSDown: c.failedDown.Load(),
		LongestStalenessMs: c.longest.Load(), LongestStalenessAfterRecoverMs: c.longestAfter.Load(), LongestStalenessAfterRecoverAt: c.longestAfterWhat,
		WrongExamples: c.examples, MissingExamples: c.missingExamples,
		ClusterSetIPChecked: c.vipChecked.Load(),
		MCS: MCSResult{
			Reads: mc.reads.Load(), ReadErrors: mc.readErrors.Load(),
			Checked: mc.checked.Load(), OK: mc.ok.Load(), Stale: mc.stale.Load(), Wrong: mc.wrong.Load(), Missing: mc.missing.Load(), MissingPastBound: mc.missingLate.Load(),
			LongestStalenessMs: mc.longest.Load(), LongestStalenessAfterRecoverMs: mc.longestAfter.Load(), LongestStalenessAfterRecoverAt: mc.longestAfterWhat,
			LongestMissingAfterRecoverMs: mc.longestMissing.Load(), LongestMissingAfterRecoverAt: mc.longestMissingWhat,
			WrongExamples: mc.examples, MissingExamples: mc.missingExamples,
		},
	}
	write(t, res)
	if n := strings.Count(d.Log(), "was unusable"); n < faults["snapshot_damage"] {
		t.Errorf("the snapshot was damaged %d times, found unusable %d times", faults["snapshot_damage"], n)
	}
	if !d.Running() {
		t.Errorf("CoreDNS exited on its own:\n%s", d.LogTail(40))
	}
	if !ctl.Running() {
		t.Errorf("the MCS controller exited on its own:\n%s", harness.Tail(ctl.Process().LogPath, 40))
	}
	if res.Wrong > 0 {
		t.Errorf("%d answers held a set of addresses the service never had: %v", res.Wrong, res.WrongExamples)
	}
	if res.Checked == 0 || res.OK == 0 {
		t.Errorf("no answer checked as current: %+v", res)
	}
	if res.MCS.Wrong > 0 {
		t.Errorf("%d checks found MCS objects the services never had: %v", res.MCS.Wrong, res.MCS.WrongExamples)
	}
	if res.MCS.Checked == 0 || res.MCS.OK == 0 {
		t.Errorf("no MCS objects checked as current: %+v", res.MCS)
	}
	for _, err := range bounds(res) {
		t.Error(err)
	}
}

// bounds checks r against the bounds of a passing run.
func bounds(r Result) []error {
	var errs []error
	if after := time.Duration(r.LongestStalenessAfterRecoverMs) * time.Millisecond; after > maxStalenessAfterRecovery {
		errs = append(errs, fmt.Errorf("an answer was stale %v after the end of the last fault that touched its cluster (%s), want at most %v", after, r.LongestStalenessAfterRecoverAt, maxStalenessAfterRecovery))
	}
	if after := time.Duration(r.MCS.LongestStalenessAfterRecoverMs) * time.Millisecond; after > maxStalenessAfterRecovery {
		errs = append(errs, fmt.Errorf("the MCS objects were stale %v after the end of the last fault that touched them (%s), want at most %v", after, r.MCS.LongestStalenessAfterRecoverAt, maxStalenessAfterRecovery))
	}
	if r.MCS.MissingPastBound > 0 {
		errs = append(errs, fmt.Errorf("%d checks found MCS objects missing more than %v after the end of the last fault that touched them (longest %d ms: %s): %v",
			r.MCS.MissingPastBound, maxStalenessAfterRecovery, r.MCS.LongestMissingAfterRecoverMs, r.MCS.LongestMissingAfterRecoverAt, r.MCS.MissingExamples))
	}
	if float64(r.MCS.OK) < minMCSOKShare*float64(r.MCS.Checked) {
		errs = append(errs, fmt.Errorf("%d of %d checks found the MCS objects current, want at least %.0f%%", r.MCS.OK, r.MCS.Checked, 100*minMCSOKShare))
	}
	if float64(r.MCS.ReadErrors) > maxMCSReadErrorShare*float64(r.MCS.Reads) {
		errs = append(errs, fmt.Errorf("%d of %d reads of the MCS objects failed while edge-a's API server was up, want at most %.0f%%", r.MCS.ReadErrors, r.MCS.Reads, 100*maxMCSReadErrorShare))
	}
	share := func(n int64) float64 { return float64(n) / float64(max(r.Checked, 1)) }
	if share(r.Missing) > maxMissingShare {
		errs = append(errs, fmt.Errorf("%d of %d answers missed a cluster's part outside the %v after a CoreDNS start, want at most %.1f%%: %v",
			r.Missing, r.Checked, startWindow, 100*maxMissingShare, r.MissingExamples))
	}
	if share(r.Failed) > maxFailedShare {
		errs = append(errs, fmt.Errorf("%d of %d answers failed while CoreDNS ran, want at most %.1f%%", r.Failed, r.Checked, 100*maxFailedShare))
	}
	if up := r.Checked - r.FailedWhileCoreDNSDown - r.MissingAfterStart; float64(r.OK) < minOKShare*float64(up) {
		errs = append(errs, fmt.Errorf("%d of %d answers checked while CoreDNS ran (outside the %v after a start) were current, want at least %.0f%%",
			r.OK, up, startWindow, 100*minOKShare))
	}
	return errs
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// serviceLabel names the service a Pod of the soak exports (for relist).
const serviceLabel = "soak.mcsannotations.io/service"

// exportEntry is an entry of the export annotation with its type, which
// harness.ExportService leaves out (absent: Headless).
type exportEntry struct {
	harness.ExportService
	Type string `json:"type,omitempty"`
}

func exporter(p *pod) harness.Pod {
	e := exportEntry{ExportService: harness.ExportService{Name: p.svc, Ports: []harness.ExportPort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}}}, Type: "Headless"}
	if isClusterSetIP(p.svc) {
		e.Type = "ClusterSetIP"
	}
	b, err := json.Marshal(map[string][]exportEntry{"services": {e}})
	if err != nil {
		panic(err)
	}
	hp := harness.ExporterPod(p.name, "", e.ExportService)
	hp.Annotations[harness.ExportAnnotation] = string(b)
	hp.Labels[serviceLabel] = p.svc
	return hp
}

// setStatus writes p's status as the kubelet would: Running, its IP, Ready
// or not.
func setStatus(ctx context.Context, c kubernetes.Interface, ns string, p pod) error {
	cond := corev1.ConditionFalse
	if p.ready {
		cond = corev1.ConditionTrue
	}
	b, err := json.Marshal(map[string]any{"status": map[string]any{
		"phase": corev1.PodRunning, "podIP": p.ip, "podIPs": []map[string]string{{"ip": p.ip}},
		"conditions": []corev1.PodCondition{{Type: corev1.PodReady, Status: cond, LastTransitionTime: metav1.Now()}},
	}})
	if err != nil {
		return err
	}
	cx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	_, err = c.CoreV1().Pods(ns).Patch(cx, p.name, types.MergePatchType, b, metav1.PatchOptions{}, "status")
	return err
}

// replacePod deletes old and creates its replacement, Ready with a new IP.
func replacePod(ctx context.Context, c kubernetes.Interface, ns string, old, p pod) error {
	cx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	zero := int64(0)
	if err := c.CoreV1().Pods(ns).Delete(cx, old.name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return err
	}
	if _, err := c.CoreV1().Pods(ns).Create(cx, exporter(&p).Object(ns), metav1.CreateOptions{}); err != nil {
		return err
	}
	return setStatus(ctx, c, ns, p)
}

// relist reads cl's Pods into the model after a write whose outcome is
// unknown, trying for at most a minute.
func relist(ctx context.Context, cl *harness.Cluster, ns string, m *model) error {
	var err error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(500 * time.Millisecond) {
		cx, cancel := context.WithTimeout(ctx, opTimeout)
		var list *corev1.PodList
		list, err = cl.Client.CoreV1().Pods(ns).List(cx, metav1.ListOptions{})
		cancel()
		if err != nil {
			continue
		}
		m.mu.Lock()
		for k, p := range m.pods {
			if p.cluster == cl.Name {
				delete(m.pods, k)
			}
		}
		svcs := map[string]bool{}
		for _, lp := range list.Items {
			svc := lp.Labels[serviceLabel]
			svcs[svc] = true
			ready := lp.DeletionTimestamp == nil && lp.Status.Phase == corev1.PodRunning && lp.Status.PodIP != ""
			ok := false
			for _, cond := range lp.Status.Conditions {
				if cond.Type == corev1.PodReady {
					ok = cond.Status == corev1.ConditionTrue
				}
			}
			m.pods[cl.Name+"/"+lp.Name] = &pod{cluster: cl.Name, name: lp.Name, svc: svc, ip: lp.Status.PodIP, ready: ready && ok}
		}
		for svc := range svcs {
			m.settle(part{svc, cl.Name})
		}
		for k := range m.current { // a service whose Pods are all gone
			if k.cluster == cl.Name && !svcs[k.svc] {
				m.settle(k)
			}
		}
		m.mu.Unlock()
		return nil
	}
	return err
}

// damage overwrites both of bbolt's meta pages (the first 8 KiB) and 8 KiB
// in the middle of the snapshot file with bytes that are no bbolt page: the
// next start must find it unusable, move it aside and resync.
func damage(t *testing.T, path string) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("damage %s: %v", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 8192)
	for i := range junk {
		junk[i] = byte(i*7 + 13)
	}
	for _, at := range []int64{0, st.Size() / 2} {
		if _, err := f.WriteAt(junk, at); err != nil {
			t.Fatalf("damage %s: %v", path, err)
		}
	}
}

// write saves the result as soak.json and soak.md in SOAK_OUT (default: the
// test's temporary folder, logged).
func write(t *testing.T, r Result) {
	dir := os.Getenv("SOAK_OUT")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	var md strings.Builder
	fmt.Fprintf(&md, "### Soak (%s, %d fault cycles begun)\n\n", r.Duration, r.Cycles)
	fmt.Fprintf(&md, "Faults: %s. Churn: %d Pod changes (%d failed while an API server was down).\n\n", faultList(r.Faults), r.ChurnOps, r.ChurnErrors)
	md.WriteString("| answers checked | ok | stale | wrong | missing | missing just after a CoreDNS start | failed | failed while CoreDNS was down | longest staleness | longest after recovery |\n")
	md.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(&md, "| %d | %d | %d | %d | %d | %d | %d | %d | %d ms | %d ms |\n", r.Checked, r.OK, r.Stale, r.Wrong, r.Missing, r.MissingAfterStart, r.Failed, r.FailedWhileCoreDNSDown, r.LongestStalenessMs, r.LongestStalenessAfterRecoverMs)
	fmt.Fprintf(&md, "\n%d of the answers were of ClusterSetIP services (ok: their ClusterSetIP).\n\n", r.ClusterSetIPChecked)
	o := r.MCS
	md.WriteString("The MCS controller's objects (ServiceImport, ClusterSetIP, EndpointSlices' ready addresses by cluster), each service's at each check:\n\n")
	md.WriteString("| checked | ok | stale | wrong | missing | missing past the bound | longest staleness | longest after recovery | reads (failed) |\n")
	md.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(&md, "| %d | %d | %d | %d | %d | %d | %d ms | %d ms | %d (%d) |\n", o.Checked, o.OK, o.Stale, o.Wrong, o.Missing, o.MissingPastBound, o.LongestStalenessMs, o.LongestStalenessAfterRecoverMs, o.Reads, o.ReadErrors)
	for name, b := range map[string][]byte{"soak.json": append(js, '\n'), "soak.md": []byte(md.String())} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("soak result in %s:\n%s\n%s", dir, js, md.String())
}

func faultList(f map[string]int) string {
	var out []string
	for k, v := range f {
		out = append(out, fmt.Sprintf("%s x%d", k, v))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}
