package main

// The relay benchmark (make bench-relay; -relay): many origin clusters
// carried by a few real kube-apiservers, two hubs (each a real kube-apiserver
// and the real bin/mcs-annotator --mcs-controller --relay with one --peer per
// origin), one edge CoreDNS reading only the hubs. Exports without a cluster
// field take the reading source's cluster ID, so one API server read under
// many peer names stands in for many origin clusters (unsigned: a signature
// binds the cluster ID, so a shared API server cannot carry signed records).
//
// Every check asks per-endpoint names (<dashed IP>.<origin>.<svc>.<ns>.svc),
// one per origin endpoint: a clusterset name would union every origin's
// endpoints into one answer too large for UDP.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// relayConfig is what the -relay-* flags set.
type relayConfig struct {
	On                  bool
	Origins, APIServers int
	Services, Endpoints int
	Changes, Burst      int
	Runs                int
	CutFor, QPSDur      time.Duration
	Out                 string
}

// relaySmokeDefaults are the sizes of -relay-smoke.
var relaySmokeDefaults = map[string]string{
	"relay-origins": "4", "relay-apiservers": "1", "relay-changes": "5", "relay-burst": "4",
	"relay-runs": "1", "relay-cut": "10s", "relay-qps-duration": "2s",
}

func relayFlags(c *relayConfig) {
	flag.BoolVar(&c.On, "relay", false, "run the relay benchmark (make bench-relay) instead of the other stages: origins through two hubs to one edge CoreDNS")
	flag.Bool("relay-smoke", false, "the relay benchmark at tiny sizes (4 origins on 1 API server), as make test could run it")
	flag.IntVar(&c.Origins, "relay-origins", 1000, "origin clusters (peer names o0000...) the hubs read")
	flag.IntVar(&c.APIServers, "relay-apiservers", 4, "real kube-apiservers carrying the origins (origin i is read from API server i mod this)")
	flag.IntVar(&c.Services, "relay-services", 10, "services per origin")
	flag.IntVar(&c.Endpoints, "relay-endpoints", 3, "endpoints (ready exporter Pods) per service")
	flag.IntVar(&c.Changes, "relay-changes", 40, "readiness flips timed origin -> hub -> edge")
	flag.IntVar(&c.Burst, "relay-burst", 20, "Pod readiness changes in the burst that the hubs' CPU time is read over")
	flag.IntVar(&c.Runs, "relay-runs", 3, "dnsperf runs of the edge and of hosts each (median)")
	flag.DurationVar(&c.CutFor, "relay-cut", 10*time.Second, "how long the edge's links to both hubs (and the direct link) stay cut")
	flag.DurationVar(&c.QPSDur, "relay-qps-duration", 10*time.Second, "length of one dnsperf run")
	flag.StringVar(&c.Out, "relay-out", "", "folder for relay.json, relay.md and the raw output (default bench/relay)")
}

// applyRelaySmoke sets -relay-smoke's sizes for the flags not given.
func applyRelaySmoke(c *relayConfig) {
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["relay-smoke"] {
		return
	}
	c.On = true
	for name, v := range relaySmokeDefaults {
		if !set[name] {
			_ = flag.Set(name, v)
		}
	}
	if !set["relay-out"] {
		c.Out = filepath.Join("bench", "raw", "relay-smoke")
	}
}

// relayResult is relay.json.
type relayResult struct {
	Cfg      relayConfig
	Command  string
	Machine  machineInfo
	Started  time.Time
	Took     time.Duration
	Stages   []stageTime
	Failures []string

	Origins, Endpoints int // origin clusters; origin endpoints at the edge
	SetupTook          time.Duration
	HubStart           []time.Duration // from each hub controller's start to its /healthz
	EdgeSync           time.Duration   // from the edge's start to every name right

	EdgeBaseHeap, EdgeHeap int64 // heap after a GC: no data (hubs unreachable), every endpoint
	EdgeRSS                int64
	EdgeWatches            int     // watches the hubs' API servers serve more with the edge than without
	EdgeConns              int     // connections open through the edge's hub links
	HubWatches             []int   // watches each hub's API server serves (all clients)
	HubHeap                []int64 // go_memstats_heap_alloc_bytes of each hub controller
	HubGoroutines          []int
	HubSlices              []int // mcs_controller_endpointslices

	QPSOurs, QPSHosts []float64 // each dnsperf run

	Prop      []time.Duration // each flip until the edge answers it for every watched origin
	PropHub   []time.Duration // each flip until the first hub wrote the slices of every watched origin
	PerFlip   int             // origins one flip changes
	PropBytes int64           // received by the edge through both hub links over Prop
	PropCPU   []cpuShare      // CPU time per flip of Prop, by group of processes

	// One origin's change: a Pod whose export names one origin.
	Solo, SoloHub    []time.Duration // as Prop and PropHub
	SoloBytes        int64
	SoloCPU          []cpuShare
	SoloRefused      int // the hubs' cluster_mismatch refusals before the flips
	SoloRefusedAfter int // more over the flips

	ProfileFlips int             // flips over the edge's CPU profile
	ProfileTop   string          // its top entries
	BurstCPU     []time.Duration // CPU time of each hub controller over the burst
	BurstChanges int             // Pod changes in the burst (each one per origin on that API server)

	Resync      time.Duration // from the restore until the change made while cut answers in the watched origins
	ResyncAll   time.Duration // until then a pass over every name found all right (a pass takes its own time)
	ResyncBytes []int64       // per hub link, from the restore to the end of the resync
	ResyncProbe probeCount

	DirectPods      int
	DirectFlipBytes int64         // per flip, direct
	DirectResync    int64         // after a cut, direct
	DirectIdle      int64         // per 10 s idle, direct
	HubIdle         int64         // per 10 s idle, per hub link
	HubSettle       time.Duration // the wait for the hub links to go quiet before the idle is measured

	KillProbe probeCount // while hub-1's API server is killed

	Cold []time.Duration // cold starts offline from the snapshot
}

// probeCount is what a continuous check of answers saw.
type probeCount struct {
	Queries, Wrong, Missing int
	First                   string
}

// relayEdgeCorefile is the edge: both hubs, a snapshot, pprof and metrics.
const relayEdgeCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    errors
    pprof 127.0.0.1:{PPROF}
    prometheus 127.0.0.1:{METRICS}
    mcsannotations clusterset.local {
        cluster edge
        kubeconfig {KUBECONFIG}
{EXTRA}        snapshot {SNAPSHOT}
        ttl 5
    }
}
`

// relayWorld is the running topology.
type relayWorld struct {
	cfg     relayConfig
	ds      dataset
	origins []*harness.Cluster // the API servers
	hubs    []*harness.Cluster
	ctl     []*harness.Annotator
	links   []*harness.Proxy
	edge    *contender
	ready   map[string]bool // "apiserver/pod" -> ready, for the Pods the bench changed
	mu      sync.Mutex
}

func originName(i int) string { return fmt.Sprintf("o%04d", i) }

// epName is the per-endpoint name of endpoint j of service s in origin i.
func (w *relayWorld) epName(i, s, j int) string {
	return strings.ReplaceAll(w.ds.ip(s, j).String(), ".", "-") + "." + originName(i) + "." + w.ds.service(s) + "." + w.ds.namespace(s) + ".svc." + zone
}

// wantReady tells whether the endpoint should answer (its Pod is ready on
// origin i's API server).
func (w *relayWorld) wantReady(i, s, j int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.ready[fmt.Sprintf("%d/%s", i%len(w.origins), w.ds.pod(s, j))]
	return !ok || r
}

// checkEp asks one per-endpoint name: "" when the answer is what the Pod's
// readiness says, else what was wrong; missing tells an empty answer or an
// error from a wrong one.
func (w *relayWorld) checkEp(d *harness.CoreDNS, i, s, j int) (bad string, missing bool) {
	name, ip := w.epName(i, s, j), w.ds.ip(s, j).String()
	m, err := d.Exchange(harness.Query{Name: name, Type: dns.TypeA, Timeout: time.Second})
	if err != nil {
		return name + ": " + err.Error(), true
	}
	got := harness.Addrs(m)
	if w.wantReady(i, s, j) {
		if !slices.Equal(got, []string{ip}) {
			return fmt.Sprintf("%s: %s %v, want %s", name, harness.Rcode(m), got, ip), len(got) == 0
		}
		return "", false
	}
	if len(got) != 0 {
		return fmt.Sprintf("%s: %v, want none (not ready)", name, got), false
	}
	return "", false
}

// allRight checks every endpoint of every origin once and returns the first
// wrong answer ("" for none).
func (w *relayWorld) allRight(d *harness.CoreDNS) string {
	for i := 0; i < w.cfg.Origins; i++ {
		for s := 0; s < w.ds.services; s++ {
			for j := 0; j < w.ds.endpoints; j++ {
				if bad, _ := w.checkEp(d, i, s, j); bad != "" {
					return bad
				}
			}
		}
	}
	return ""
}

// waitAllRight polls allRight until it finds nothing wrong.
func (w *relayWorld) waitAllRight(t harness.T, d *harness.CoreDNS, bound time.Duration) time.Duration {
	start := time.Now()
	for {
		bad := w.allRight(d)
		if bad == "" {
			return time.Since(start)
		}
		if time.Since(start) > bound {
			t.Fatalf("edge: not every answer right after %s: %s\n%s", bound, bad, d.LogTail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// probe asks the names of service 1 (never changed) of origins spread
// over the fleet, one every 2 ms, until stop; it counts wrong and missing
// answers.
func (w *relayWorld) probe(d *harness.CoreDNS) (stop func() probeCount) {
	var (
		done atomic.Bool
		wg   sync.WaitGroup
		pc   probeCount
	)
	s := min(1, w.ds.services-1)
	wg.Go(func() {
		for k := 0; !done.Load(); k++ {
			i := (k * 7919) % w.cfg.Origins
			bad, missing := w.checkEp(d, i, s, k%w.ds.endpoints)
			pc.Queries++
			if bad != "" {
				if missing {
					pc.Missing++
				} else {
					pc.Wrong++
				}
				if pc.First == "" {
					pc.First = bad
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	return sync.OnceValue(func() probeCount { done.Store(true); wg.Wait(); return pc })
}

// setReady flips Pod (s, j) on API server k and records it.
func (w *relayWorld) setReady(t harness.T, k, s, j int, ready bool) {
	w.origins[k].SetPodReady(t, w.ds.namespace(s), w.ds.pod(s, j), ready, w.ds.ip(s, j).String())
	w.mu.Lock()
	w.ready[fmt.Sprintf("%d/%s", k, w.ds.pod(s, j))] = ready
	w.mu.Unlock()
}

// watched are the origins read from API server k that a change there is
// timed on: the first and the last.
func (w *relayWorld) watched(k int) []int {
	last := k + ((w.cfg.Origins-1-k)/len(w.origins))*len(w.origins)
	if last == k {
		return []int{k}
	}
	return []int{k, last}
}

// waitEp polls until endpoint (s, j) answers as its readiness says in every
// origin of is.
func (w *relayWorld) waitEp(t harness.T, d *harness.CoreDNS, is []int, s, j int, bound time.Duration) {
	deadline := time.Now().Add(bound)
	for _, i := range is {
		for {
			bad, _ := w.checkEp(d, i, s, j)
			if bad == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("edge: %s after %s", bad, bound)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// apiWatches is the number of watches an API server serves now
// (apiserver_longrunning_requests, verb WATCH).
func apiWatches(c *harness.Cluster) (int, error) {
	cx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(cx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "apiserver_longrunning_requests{") && strings.Contains(l, `verb="WATCH"`) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += int(v)
		}
	}
	return n, nil
}

func sumWatches(t harness.T, cs []*harness.Cluster) (int, []int) {
	total, each := 0, make([]int, len(cs))
	for k, c := range cs {
		n, err := apiWatches(c)
		if err != nil {
			t.Fatalf("%s: watches: %v", c.Name, err)
		}
		each[k], total = n, total+n
	}
	return total, each
}

func received(ps []*harness.Proxy) int64 {
	var n int64
	for _, p := range ps {
		n += p.Received()
	}
	return n
}

// relayMain runs the relay benchmark and returns the exit code.
func relayMain(cfg config, root string) int {
	rc := cfg.Relay
	if rc.Out == "" {
		rc.Out = filepath.Join("bench", "relay")
	}
	if !filepath.IsAbs(rc.Out) {
		rc.Out = filepath.Join(root, rc.Out)
	}
	if err := os.MkdirAll(rc.Out, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "mcs-bench: %v\n", err)
		return 2
	}
	start := time.Now()
	b := harness.NewProgram("mcs-bench-relay", func(msg string) {
		fmt.Printf("   [%6.1fs] %s\n", time.Since(start).Seconds(), msg)
	})
	r := &relayResult{Cfg: rc, Command: cfg.Command, Started: start.UTC(), Machine: machine(root)}
	code := b.Main(func() {
		defer func() {
			r.Took = time.Since(start)
			if err := writeRelay(r, rc.Out); err != nil {
				b.Errorf("relay results: %v", err)
			}
		}()
		relayRun(b, r)
	})
	if code == 0 && len(r.Failures) > 0 {
		code = 1
	}
	fmt.Printf("mcs-bench-relay: done in %s (exit %d); %s\n", time.Since(start).Round(time.Second), code, filepath.Join(rc.Out, "relay.md"))
	return code
}

// relayTimed is timed for the relay result.
func relayTimed(b *harness.Program, r *relayResult, name string, f func()) bool {
	fmt.Printf("== %s\n", name)
	start, failedBefore := time.Now(), b.Failed()
	ok := b.Run(f) && (failedBefore || !b.Failed())
	took := time.Since(start)
	r.Stages = append(r.Stages, stageTime{name, took, ok})
	if !ok {
		r.Failures = append(r.Failures, name+" failed")
		fmt.Printf("== %s FAILED after %s\n", name, took.Round(100*time.Millisecond))
		return false
	}
	fmt.Printf("== %s: %s\n", name, took.Round(100*time.Millisecond))
	return true
}

func relayRun(b *harness.Program, r *relayResult) {
	cfg := r.Cfg
	w := &relayWorld{cfg: cfg, ds: dataset{cluster: "", services: cfg.Services, endpoints: cfg.Endpoints, namespaces: min(2, cfg.Services)},
		ready: map[string]bool{}}
	r.Origins, r.Endpoints = cfg.Origins, cfg.Origins*w.ds.total()
	if !relayTimed(b, r, "clusters, data, hubs, edge", func() { relaySetup(b, r, w) }) {
		return
	}
	relayTimed(b, r, "edge memory and watches", func() { relayEdgeFigures(b, r, w) })
	relayTimed(b, r, "QPS beside hosts", func() { relayQPS(b, r, w) })
	relayTimed(b, r, "propagation", func() { relayPropagation(b, r, w) })
	relayTimed(b, r, "single-origin propagation", func() { relaySolo(b, r, w) })
	relayTimed(b, r, "edge CPU profile", func() { relayEdgeProfile(b, r, w) })
	relayTimed(b, r, "hub CPU per change", func() { relayBurst(b, r, w) })
	relayTimed(b, r, "resync after a cut", func() { relayResync(b, r, w) })
	relayTimed(b, r, "direct wire cost", func() { relayDirect(b, r, w) })
	relayTimed(b, r, "one hub killed", func() { relayKill(b, r, w) })
	relayTimed(b, r, "cold start offline", func() { relayCold(b, r, w) })
}

func relaySetup(b *harness.Program, r *relayResult, w *relayWorld) {
	cfg := w.cfg
	start := time.Now()
	var names []string
	for k := 0; k < cfg.APIServers; k++ {
		names = append(names, fmt.Sprintf("origins-%d", k+1))
	}
	cs := harness.StartClusters(b, append(names, "hub-1", "hub-2", "edge")...)
	w.origins, w.hubs = cs[:cfg.APIServers], cs[cfg.APIServers:cfg.APIServers+2]
	edgeCluster := cs[len(cs)-1]
	for k, c := range w.origins {
		w.ds.load(b, c, 8, false)
		w.createSolo(b, k)
	}
	for _, h := range w.hubs {
		h.InstallMCSCRDs(b)
		for n := 0; n < w.ds.namespaces; n++ {
			h.CreateNamespace(b, w.ds.namespace(n))
		}
	}
	r.SetupTook = time.Since(start)

	// The edge's heap with nothing loaded: the same Corefile, both hubs
	// unreachable, no snapshot.
	dir := harness.TempDir(b)
	unreach := unreachableKubeconfig(b, dir)
	base := &contender{Name: ours + " (edge, empty)", tmpl: relayEdgeCorefile, vars: map[string]string{
		"KUBECONFIG": edgeCluster.Kubeconfig, "METRICS": strconv.Itoa(harness.FreePort(b)),
		"EXTRA":    "        hub hub-1 " + unreach + "\n        hub hub-2 " + unreach + "\n",
		"SNAPSHOT": filepath.Join(dir, "empty.db")}}
	startEdge(b, base)
	time.Sleep(2 * time.Second)
	h, err := heapAlloc(base.pprof)
	if err != nil {
		b.Fatalf("edge heap: %v", err)
	}
	r.EdgeBaseHeap = h
	base.stop(b)

	before, _ := sumWatches(b, w.hubs)
	for k, h := range w.hubs {
		args := []string{"--cluster", h.Name, "--leader-elect=false", "-mcs-controller", "--relay"}
		for i := 0; i < cfg.Origins; i++ {
			args = append(args, "-peer", originName(i)+"="+w.origins[i%len(w.origins)].Kubeconfig)
		}
		t0 := time.Now()
		w.ctl = append(w.ctl, harness.StartAnnotator(b, h.Kubeconfig, args...))
		r.HubStart = append(r.HubStart, time.Since(t0))
		b.Logf("hub %s: controller with %d peers answers /healthz after %s", h.Name, cfg.Origins, r.HubStart[k].Round(time.Millisecond))
	}
	_ = before
	for _, h := range w.hubs {
		w.links = append(w.links, harness.StartProxy(b, h.APIServerAddr()))
	}
	w.edge = &contender{Name: ours + " (edge)", tmpl: relayEdgeCorefile, vars: map[string]string{
		"KUBECONFIG": edgeCluster.Kubeconfig, "METRICS": strconv.Itoa(harness.FreePort(b)),
		"EXTRA":    "        hub hub-1 " + w.hubs[0].KubeconfigVia(b, w.links[0]) + "\n        hub hub-2 " + w.hubs[1].KubeconfigVia(b, w.links[1]) + "\n",
		"SNAPSHOT": filepath.Join(dir, "edge.db")}}
	t0 := time.Now()
	startEdge(b, w.edge)
	w.waitAllRight(b, w.edge.d, 30*time.Minute)
	r.EdgeSync = time.Since(t0)
	b.Logf("edge: every one of %d origin endpoints right %s after its start", r.Endpoints, r.EdgeSync.Round(time.Millisecond))
}

// startEdge starts a contender's CoreDNS with a pprof port.
func startEdge(t harness.T, c *contender) {
	pp := harness.FreePort(t)
	c.vars["PPROF"] = strconv.Itoa(pp)
	c.pprof = "127.0.0.1:" + strconv.Itoa(pp)
	c.d = harness.StartCoreDNS(t, c.tmpl, c.vars)
}

func relayEdgeFigures(b *harness.Program, r *relayResult, w *relayWorld) {
	h, err := heapAlloc(w.edge.pprof)
	if err != nil {
		b.Fatalf("edge heap: %v", err)
	}
	r.EdgeHeap = h
	if r.EdgeRSS, err = w.edge.d.Process().StatusBytes("VmRSS"); err != nil {
		b.Fatalf("edge RSS: %v", err)
	}
	if _, err := heapProfile(context.Background(), w.edge.pprof, w.edge.binary(), filepath.Join(w.cfg.Out, "heap-edge.pprof")); err != nil {
		b.Logf("edge heap profile: %v", err)
	}
	with, each := sumWatches(b, w.hubs)
	r.HubWatches = each
	// The watches the edge holds: the hubs' API servers' count with the edge
	// minus without it (the edge stopped for the reading).
	w.edge.d.Stop(b)
	time.Sleep(2 * time.Second)
	without, _ := sumWatches(b, w.hubs)
	r.EdgeWatches = with - without
	w.edge.d.Start(b)
	w.waitAllRight(b, w.edge.d, 5*time.Minute)
	for _, l := range w.links {
		r.EdgeConns += l.Open()
	}
	for _, a := range w.ctl {
		heap, _, err := a.Metric("go_memstats_heap_alloc_bytes")
		if err != nil {
			b.Fatalf("hub metrics: %v", err)
		}
		g, _, _ := a.Metric("go_goroutines")
		sl, _, _ := a.Metric("mcs_controller_endpointslices")
		r.HubHeap, r.HubGoroutines, r.HubSlices = append(r.HubHeap, int64(heap)), append(r.HubGoroutines, int(g)), append(r.HubSlices, int(sl))
	}
	b.Logf("edge: heap %.1f MB (%.1f MB empty) = %.0f B per endpoint; %d watches on the hubs; hubs: heap %v, goroutines %v, slices %v, watches served %v",
		float64(r.EdgeHeap)/1e6, float64(r.EdgeBaseHeap)/1e6, r.EdgePerEndpoint(), r.EdgeWatches, r.HubHeap, r.HubGoroutines, r.HubSlices, r.HubWatches)
}

// EdgePerEndpoint is the edge's heap per origin endpoint beyond the empty edge.
func (r *relayResult) EdgePerEndpoint() float64 {
	return float64(r.EdgeHeap-r.EdgeBaseHeap) / float64(max(1, r.Endpoints))
}

func relayQPS(b *harness.Program, r *relayResult, w *relayWorld) {
	dir := harness.TempDir(b)
	var hostsF, queries strings.Builder
	for i := 0; i < w.cfg.Origins; i++ {
		for s := 0; s < w.ds.services; s++ {
			for j := 0; j < w.ds.endpoints; j++ {
				name := strings.TrimSuffix(w.epName(i, s, j), ".")
				fmt.Fprintf(&hostsF, "%s %s\n", w.ds.ip(s, j), name)
				fmt.Fprintf(&queries, "%s A\n", name)
			}
		}
	}
	hf, qf := filepath.Join(dir, "hosts"), filepath.Join(dir, "queries")
	if err := os.WriteFile(hf, []byte(hostsF.String()), 0o644); err != nil {
		b.Fatalf("%v", err)
	}
	if err := os.WriteFile(qf, []byte(queries.String()), 0o644); err != nil {
		b.Fatalf("%v", err)
	}
	h := &contender{Name: hosts, tmpl: hostsCorefile, vars: map[string]string{"HOSTS": hf}}
	startEdge(b, h)
	defer h.stop(b)
	for run := 0; run < w.cfg.Runs; run++ {
		for _, c := range []*contender{w.edge, h} {
			p, err := runDNSPerf(context.Background(), dnsperfOpts{Port: c.d.Port, File: qf, Duration: w.cfg.QPSDur, Clients: 4,
				Raw: filepath.Join(w.cfg.Out, fmt.Sprintf("dnsperf-%s-%d.txt", slug(c.Name), run))})
			if err != nil {
				b.Fatalf("%v", err)
			}
			if p.Lost > p.Completed/100 {
				b.Errorf("%s: dnsperf lost %d of %d queries", c.Name, p.Lost, p.Completed)
			}
			if c == h {
				r.QPSHosts = append(r.QPSHosts, p.QPS)
			} else {
				r.QPSOurs = append(r.QPSOurs, p.QPS)
			}
		}
	}
	b.Logf("QPS: edge %v, hosts %v", r.QPSOurs, r.QPSHosts)
}

// QPSRatio is the edge's median QPS over hosts's.
func (r *relayResult) QPSRatio() float64 {
	return median(r.QPSOurs) / max(1, median(r.QPSHosts))
}

func relayPropagation(b *harness.Program, r *relayResult, w *relayWorld) {
	r.PerFlip = (w.cfg.Origins + len(w.origins) - 1) / len(w.origins)
	sw := w.watchSlices(b)
	defer sw.stop()
	cpu := newCPUMeter(b, w.cpuGroups())
	before := received(w.links)
	for n := 0; n < w.cfg.Changes; n++ {
		k, j := n%len(w.origins), (n/len(w.origins))%w.ds.endpoints
		ready := !w.wantReady(k, 0, j)
		cpu.quiet(quietGap)
		cpu.flip(func() {
			start := time.Now()
			sw.reset(start)
			w.setReady(b, k, 0, j, ready)
			w.waitEp(b, w.edge.d, w.watched(k), 0, j, time.Minute)
			r.Prop = append(r.Prop, time.Since(start))
			r.PropHub = append(r.PropHub, sw.hubTook(w.watched(k)))
		})
	}
	r.PropCPU = cpu.shares()
	r.PropBytes = received(w.links) - before
	b.Logf("propagation: %d flips (each in %d origins), p50 %s, p99 %s (first hub's slices: p50 %s, p99 %s); %d bytes through both hub links; CPU per flip %v",
		len(r.Prop), r.PerFlip, pct(r.Prop, 50), pct(r.Prop, 99), pct(r.PropHub, 50), pct(r.PropHub, 99), r.PropBytes, r.PropCPU)
}

func relayBurst(b *harness.Program, r *relayResult, w *relayWorld) {
	var procs []*harness.Process
	for _, a := range w.ctl {
		procs = append(procs, a.Process())
	}
	cpu0 := cpuOf(b, procs...)
	for pass, ready := range []bool{false, true} {
		for n := 0; n < w.cfg.Burst; n++ {
			k := n % len(w.origins)
			s, j := 2+(n/len(w.origins))%max(1, w.ds.services-2), 0
			if w.ds.services < 3 {
				s = 0
			}
			w.setReady(b, k, s, j, ready)
		}
		_ = pass
	}
	w.waitAllRight(b, w.edge.d, 5*time.Minute)
	time.Sleep(time.Second)
	cpu1 := cpuOf(b, procs...)
	r.BurstChanges = 2 * w.cfg.Burst
	for k := range cpu1 {
		r.BurstCPU = append(r.BurstCPU, cpu1[k]-cpu0[k])
	}
	b.Logf("hub CPU over %d Pod changes: %v", r.BurstChanges, r.BurstCPU)
}

func relayResync(b *harness.Program, r *relayResult, w *relayWorld) {
	// The hubs may still be writing what the last stage changed (damped
	// writes of a service that changed many times, each origin's slice at
	// the client's rate limit), although the edge already answers right:
	// idle is measured once the links carried less than 1 KB in 2 s (at
	// most 3 min).
	settle0 := time.Now()
	for last := received(w.links); time.Since(settle0) < 3*time.Minute; {
		time.Sleep(2 * time.Second)
		now := received(w.links)
		if now-last < 1024 {
			break
		}
		last = now
	}
	r.HubSettle = time.Since(settle0)
	idle0 := received(w.links)
	time.Sleep(10 * time.Second)
	r.HubIdle = (received(w.links) - idle0) / int64(len(w.links))
	stop := w.probe(w.edge.d)
	for _, l := range w.links {
		l.Cut(b)
	}
	cutAt := time.Now()
	w.setReady(b, 0, 0, 0, !w.wantReady(0, 0, 0))
	time.Sleep(time.Until(cutAt.Add(w.cfg.CutFor)))
	var before []int64
	for _, l := range w.links {
		before = append(before, l.Received())
	}
	restore := time.Now()
	for _, l := range w.links {
		l.Restore(b)
	}
	w.waitEp(b, w.edge.d, w.watched(0), 0, 0, 5*time.Minute)
	r.Resync = time.Since(restore)
	r.ResyncAll = w.waitAllRight(b, w.edge.d, 5*time.Minute) + r.Resync
	time.Sleep(2 * time.Second)
	for k, l := range w.links {
		r.ResyncBytes = append(r.ResyncBytes, l.Received()-before[k])
	}
	r.ResyncProbe = stop()
	b.Logf("resync after a %s cut of both hub links: %s; bytes per link %v; probe %+v", w.cfg.CutFor, r.Resync.Round(time.Millisecond), r.ResyncBytes, r.ResyncProbe)
}

// relayDirect is the reference: an edge reading origin o0000 as a peer
// through a counting proxy, no hub.
func relayDirect(b *harness.Program, r *relayResult, w *relayWorld) {
	o := w.origins[0]
	link := harness.StartProxy(b, o.APIServerAddr())
	dir := harness.TempDir(b)
	c := &contender{Name: ours + " (direct)", tmpl: relayEdgeCorefile, vars: map[string]string{
		"KUBECONFIG": unreachableKubeconfig(b, dir), "METRICS": strconv.Itoa(harness.FreePort(b)),
		"EXTRA":    "        peer " + originName(0) + " " + o.KubeconfigVia(b, link) + "\n",
		"SNAPSHOT": filepath.Join(dir, "direct.db")}}
	startEdge(b, c)
	defer c.stop(b)
	pods, err := o.Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		b.Fatalf("%v", err)
	}
	r.DirectPods = len(pods.Items)
	w.waitEp(b, c.d, []int{0}, 1, 0, time.Minute)
	time.Sleep(2 * time.Second)
	idle0 := link.Received()
	time.Sleep(10 * time.Second)
	r.DirectIdle = link.Received() - idle0
	const flips = 10
	before := link.Received()
	for n := 0; n < flips; n++ {
		j := n % w.ds.endpoints
		w.setReady(b, 0, 1, j, !w.wantReady(0, 1, j))
		w.waitEp(b, c.d, []int{0}, 1, j, time.Minute)
	}
	r.DirectFlipBytes = (link.Received() - before) / flips
	link.Cut(b)
	cutAt := time.Now()
	w.setReady(b, 0, 1, 0, !w.wantReady(0, 1, 0))
	time.Sleep(time.Until(cutAt.Add(w.cfg.CutFor)))
	before = link.Received()
	link.Restore(b)
	w.waitEp(b, c.d, []int{0}, 1, 0, 5*time.Minute)
	time.Sleep(2 * time.Second)
	r.DirectResync = link.Received() - before
	// Service 1 back as it was, everywhere.
	for j := 0; j < w.ds.endpoints; j++ {
		if !w.wantReady(0, 1, j) {
			w.setReady(b, 0, 1, j, true)
		}
	}
	w.waitAllRight(b, w.edge.d, 5*time.Minute)
	b.Logf("direct: %d B per flip, %d B per resync after %s cut, %d B per 10 s idle (%d Pods)", r.DirectFlipBytes, r.DirectResync, w.cfg.CutFor, r.DirectIdle, r.DirectPods)
}

func relayKill(b *harness.Program, r *relayResult, w *relayWorld) {
	stop := w.probe(w.edge.d)
	time.Sleep(time.Second)
	w.hubs[0].KillAPIServer(b, syscall.SIGKILL)
	time.Sleep(5 * time.Second)
	r.KillProbe = stop()
	if bad := w.allRight(w.edge.d); bad != "" {
		b.Errorf("with hub-1 killed: %s", bad)
	}
	b.Logf("hub-1's API server killed: %+v", r.KillProbe)
}

func relayCold(b *harness.Program, r *relayResult, w *relayWorld) {
	for _, l := range w.links {
		l.Cut(b)
	}
	for run := 0; run < 3; run++ {
		w.edge.d.Stop(b)
		start := w.edge.d.StartNoWait(b)
		for {
			if bad, _ := w.checkEp(w.edge.d, w.cfg.Origins-1, 1, 0); bad == "" {
				break
			}
			if time.Since(start) > time.Minute {
				b.Fatalf("edge offline: no answer from the snapshot after a minute")
			}
			time.Sleep(time.Millisecond)
		}
		r.Cold = append(r.Cold, time.Since(start))
		if bad := w.allRight(w.edge.d); bad != "" {
			b.Errorf("edge offline from its snapshot: %s", bad)
		}
	}
	b.Logf("cold start offline: %v", r.Cold)
}

// writeRelay writes relay.json and relay.md into dir.
func writeRelay(r *relayResult, dir string) error {
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "relay.json"), js, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "relay.md"), []byte(relayMarkdown(r)), 0o644)
}

// relayMarkdown is relay.md: the figures against the targets.
func relayMarkdown(r *relayResult) string {
	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	hubs := 2
	p("### Relay hubs (`make bench-relay`)\n\n")
	p("%d origin clusters × %d services × %d endpoints (%d origin endpoints), carried by %d real kube-apiserver(s) (origin `oNNNN` is API server NNNN mod %d, read under its own peer name; unsigned; each API server also carries one Pod whose export names one origin, the first read from it), two hubs (each a real kube-apiserver and `bin/mcs-annotator --mcs-controller --relay` with %d `--peer` flags), one edge `bin/coredns` reading only the hubs, each through a counting proxy. Run %s UTC, took %s; `%s`.\n\n",
		r.Origins, r.Cfg.Services, r.Cfg.Endpoints, r.Endpoints, r.Cfg.APIServers, r.Cfg.APIServers, r.Origins, r.Started.Format("2006-01-02 15:04"), r.Took.Round(time.Second), r.Command)
	if len(r.Failures) > 0 {
		p("**FAILED: %s**\n\n", strings.Join(r.Failures, "; "))
	}
	row := func(what, fig, target string, ok bool, have bool) {
		v := "—"
		if have {
			v = "met"
			if !ok {
				v = "**missed**"
			}
		}
		p("| %s | %s | %s | %s |\n", what, fig, target, v)
	}
	p("| figure | this run | target | |\n|---|---|---|---|\n")
	row("edge: watches held on the hubs", fmt.Sprintf("%d (over %d connections)", r.EdgeWatches, r.EdgeConns), fmt.Sprintf("≤ %d (hubs × 2 kinds), not one per origin", hubs*2), r.EdgeWatches <= hubs*2, r.EdgeHeap > 0)
	row("edge: heap per origin endpoint", fmt.Sprintf("%.0f B (%.1f MB with data, %.1f MB empty; RSS %.1f MB)", r.EdgePerEndpoint(), float64(r.EdgeHeap)/1e6, float64(r.EdgeBaseHeap)/1e6, float64(r.EdgeRSS)/1e6), "≤ 200 B", r.EdgePerEndpoint() <= 200, r.EdgeHeap > 0)
	row("edge: cold start offline from its snapshot (both hubs unreachable), median", ms(medianDur(r.Cold)), "≤ 300 ms", medianDur(r.Cold) <= 300*time.Millisecond, len(r.Cold) > 0)
	row("edge: QPS ÷ hosts (per-endpoint names, median)", fmt.Sprintf("%.2f (%.0f ÷ %.0f)", r.QPSRatio(), median(r.QPSOurs), median(r.QPSHosts)), "≥ 0.95", r.QPSRatio() >= 0.95, len(r.QPSOurs) > 0)
	row("propagation origin → hub → edge of one origin's change, p50 / p99", fmt.Sprintf("%s / %s (%d flips of a Pod whose export names one origin, each after %s quiet)", ms(pct(r.Solo, 50)), ms(pct(r.Solo, 99)), len(r.Solo), quietGap), "p99 ≤ 2 s", pct(r.Solo, 99) <= 2*time.Second, len(r.Solo) > 0)
	row(fmt.Sprintf("propagation origin → hub → edge of one Pod change in %d origins at once, p50 / p99", r.PerFlip), fmt.Sprintf("%s / %s (%d flips, each in %d origins, each after %s quiet)", ms(pct(r.Prop, 50)), ms(pct(r.Prop, 99)), len(r.Prop), r.PerFlip, quietGap), "p99 ≤ 2 s", pct(r.Prop, 99) <= 2*time.Second, len(r.Prop) > 0)
	row(fmt.Sprintf("edge resync after a %s cut of both hub links", r.Cfg.CutFor), fmt.Sprintf("%s (a full pass over every name right at %s); %d of %d checked answers wrong, %d missing", ms(r.Resync), ms(r.ResyncAll), r.ResyncProbe.Wrong, r.ResyncProbe.Queries, r.ResyncProbe.Missing), "≤ 5 s, 0 wrong", r.Resync <= 5*time.Second && r.ResyncProbe.Wrong+r.ResyncProbe.Missing == 0, r.Resync > 0)
	row("hub-1's API server killed", fmt.Sprintf("%d answers checked: %d wrong, %d missing", r.KillProbe.Queries, r.KillProbe.Wrong, r.KillProbe.Missing), "0 wrong, 0 missing", r.KillProbe.Wrong+r.KillProbe.Missing == 0, r.KillProbe.Queries > 0)
	p("\n")
	p("| hub | heap (go_memstats_heap_alloc_bytes) | per origin | goroutines | per origin | EndpointSlices written | watches its API server serves | CPU over %d Pod changes | per Pod change | per origin endpoint change | start to /healthz |\n|---|---|---|---|---|---|---|---|---|---|---|\n", r.BurstChanges)
	for k := range r.HubHeap {
		cpu, start := time.Duration(0), time.Duration(0)
		if k < len(r.BurstCPU) {
			cpu = r.BurstCPU[k]
		}
		if k < len(r.HubStart) {
			start = r.HubStart[k]
		}
		w := 0
		if k < len(r.HubWatches) {
			w = r.HubWatches[k]
		}
		per := cpu / time.Duration(max(1, r.BurstChanges))
		p("| hub-%d | %s | %s | %d | %.1f | %d | %d | %s | %s | %s | %s |\n", k+1, mb(r.HubHeap[k]), kbmb(r.HubHeap[k]/int64(max(1, r.Origins))),
			r.HubGoroutines[k], float64(r.HubGoroutines[k])/float64(max(1, r.Origins)), r.HubSlices[k], w,
			ms(cpu), ms(per), fmt.Sprintf("%.1f µs", float64(per)/float64(max(1, r.PerFlip))/1e3), ms(start))
	}
	p("\nPer-origin figures divide the whole process (its fixed part included) by the %d origins. A Pod change on an API server is an endpoint change in each of the %d origins read from it.\n\n", r.Origins, r.PerFlip)
	p("Wire cost (bytes the edge receives, counted by the proxy of each link; TLS included):\n\n| | through a hub (per link) | direct (one origin as a `peer`, %d Pods) |\n|---|---|---|\n", r.DirectPods)
	perChange := r.PropBytes / int64(max(1, len(r.Prop))) / int64(hubs) // both links carry each change
	p("| per Pod readiness flip | %d B per link (%d B per origin endpoint change) | %d B |\n", perChange, perChange/int64(max(1, r.PerFlip)), r.DirectFlipBytes)
	var rs int64
	for _, x := range r.ResyncBytes {
		rs = max(rs, x)
	}
	p("| per resync after a %s cut (one change while cut) | %d B (largest link) | %d B |\n", r.Cfg.CutFor, rs, r.DirectResync)
	p("| per 10 s idle | %d B (after the links went quiet, %s after the last change's answers) | %d B |\n", r.HubIdle, r.HubSettle.Round(time.Second), r.DirectIdle)
	p("\n")
	soloMarkdown(p, r)
	if r.ProfileTop != "" {
		p("The edge's CPU profile over %d back-to-back flips, each in %d origins (cpu-edge-flips.pprof in the run's folder):\n\n```\n%s```\n\n", r.ProfileFlips, r.PerFlip, r.ProfileTop)
	}
	p("The issue's reference, direct through a TLS proxy: 1,581 B per Ready flip, 7.9 KB to resume a watch of 200 Pods after a 10 s cut, 243 B per 10 s idle.\n\n")
	p("Set-up: clusters and data %s; edge's first sync of every endpoint %s.", r.SetupTook.Round(time.Second), r.EdgeSync.Round(time.Millisecond))
	for _, s := range r.Stages {
		p(" %s: %s%s;", s.Name, s.Took.Round(100*time.Millisecond), map[bool]string{true: "", false: " (FAILED)"}[s.OK])
	}
	p("\n")
	return sb.String()
}

func medianDur(ds []time.Duration) time.Duration { return pct(ds, 50) }
