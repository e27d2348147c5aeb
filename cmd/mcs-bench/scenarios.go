package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// world is the running clusters and the files made from the data.
type world struct {
	ds        dataset
	a, b      *harness.Cluster // a holds the data; b is the small peer
	dir       string
	hostsFile string
	queries   map[string]string // qtype -> dnsperf file
	sample    []int
	wrapper   string
	added     int // Pods the live stage added to a, each an endpoint
}

const (
	clusterA = "bench-a"
	clusterB = "bench-b"
)

// setup starts the two clusters and loads the data into the first.
func setup(b *harness.Program, res *results) *world {
	cfg := res.Cfg
	w := &world{ds: dataset{cluster: clusterA, services: cfg.Services, endpoints: cfg.Endpoints, namespaces: cfg.Namespaces}}
	w.dir = harness.TempDir(b)
	start := time.Now()
	cs := harness.StartClusters(b, clusterA, clusterB)
	w.a, w.b = cs[0], cs[1]
	res.ClustersTook = time.Since(start)
	// The in-tree plugin's ServiceImports and EndpointSlices serve the DNS
	// comparisons only (they take minutes at full size).
	res.Create = w.ds.load(b, w.a, cfg.Workers, cfg.wants("dns") || cfg.wants("instr"))

	w.hostsFile = filepath.Join(w.dir, "hosts")
	if err := w.ds.writeHostsFile(w.hostsFile); err != nil {
		b.Fatalf("%v", err)
	}
	w.queries = map[string]string{}
	for _, q := range []string{"A", "SRV"} {
		path := filepath.Join(cfg.Raw, "queries-"+q+".txt")
		if err := w.ds.writeQueryFile(path, q); err != nil {
			b.Fatalf("%v", err)
		}
		w.queries[q] = path
	}
	w.sample = sampleOf(w.ds, 25)
	w.wrapper = pinWrapper(b, w.dir)
	return w
}

// contenders are the three servers over the world's data.
func (w *world) contenders(b *harness.Program) []*contender {
	return []*contender{
		{Name: ours, SRV: true, tmpl: oursCorefile, vars: map[string]string{
			"CLUSTER": clusterA, "KUBECONFIG": w.a.Kubeconfig, "EXTRA": "",
			"SNAPSHOT": filepath.Join(harness.TempDir(b), "table.db")}},
		{Name: hosts, tmpl: hostsCorefile, vars: map[string]string{"HOSTS": w.hostsFile}},
		{Name: intree, SRV: true, tmpl: intreeCorefile, vars: map[string]string{"KUBECONFIG": w.a.Kubeconfig}},
	}
}

// throughput runs the dnsperf points of one mode: the three contenders
// started side by side, each point run for A and SRV, Runs times, with the
// contenders' order rotated every run. Pinned: CoreDNS on CPU 0, dnsperf on
// CPU 1, and then the fixed-rate latency runs and a CPU profile of ours.
// Unpinned: also the heap and RSS of each.
func throughput(ctx context.Context, b *harness.Program, res *results, w *world, pin bool) {
	cfg := res.Cfg
	mode, dnsperfPin := "unpinned", ""
	if pin {
		mode, dnsperfPin = "pinned", "1"
	}
	cs := w.contenders(b)
	for _, c := range cs {
		wrapper := ""
		if pin {
			wrapper = w.wrapper
		}
		took := c.start(b, wrapper, w.ds, w.sample, startBound)
		b.Logf("%s (%s, PID %d) answers every sample correctly %s after start", c.Name, mode, c.d.Process().PID(), took.Round(time.Millisecond))
		res.setSync(mode, c.Name, took)
	}
	defer func() {
		for _, c := range cs {
			c.stop(b)
			c.keepLog(cfg.Raw, mode+"-"+slug(c.Name))
		}
	}()
	if !pin {
		// Heap and RSS with the data loaded, before any load test.
		for _, c := range cs {
			res.memory(b, c, "loaded")
		}
	}
	for _, qtype := range []string{"A", "SRV"} {
		for run := 0; run < cfg.Runs; run++ {
			for k := range cs {
				c := cs[(k+run)%len(cs)]
				if qtype == "SRV" && !c.SRV {
					continue
				}
				raw := filepath.Join(cfg.Raw, fmt.Sprintf("dnsperf-%s-%s-%s-run%d.txt", mode, qtype, slug(c.Name), run+1))
				pid := c.d.Process().PID()
				cpu0, err := procCPU(pid)
				if err != nil {
					b.Fatalf("%s: %v", c.Name, err)
				}
				start := time.Now()
				p, err := runDNSPerf(ctx, dnsperfOpts{Port: c.d.Port, File: w.queries[qtype], Duration: cfg.Duration,
					Clients: cfg.Clients, Pin: dnsperfPin, Raw: raw})
				if err != nil {
					b.Fatalf("%s %s %s: %v", mode, qtype, c.Name, err)
				}
				p.Took = time.Since(start)
				cpu1, err := procCPU(pid)
				if err != nil {
					b.Fatalf("%s: %v", c.Name, err)
				}
				p.CPU = cpu1 - cpu0
				b.Logf("%s %-4s %-24s run %d: %8.0f QPS, %d lost, %s; CoreDNS CPU %s (%.1f µs per answer)", mode, qtype, c.Name, run+1,
					p.QPS, p.Lost, p.Rcodes, p.CPU, float64(p.CPUPerAnswer())/1e3)
				res.addQPS(mode, qtype, c.Name, p)
			}
		}
	}
	if !pin {
		for _, c := range cs {
			res.memory(b, c, "after load")
		}
		// The live baseline: our plugin watching a cluster with no exporter
		// Pods (the peer cluster, still empty now).
		base := &contender{Name: ours + " (empty)", tmpl: oursCorefile, vars: map[string]string{
			"CLUSTER": clusterB, "KUBECONFIG": w.b.Kubeconfig, "EXTRA": "",
			"SNAPSHOT": filepath.Join(harness.TempDir(b), "table.db")}}
		empty := dataset{cluster: clusterB, services: 0, endpoints: 1, namespaces: 1}
		base.start(b, "", empty, nil, startBound)
		time.Sleep(time.Second)
		res.memory(b, base, "loaded")
		base.stop(b)
		return
	}
	// Fixed-rate latency, pinned.
	for _, qtype := range []string{"A", "SRV"} {
		for _, c := range cs {
			if qtype == "SRV" && !c.SRV {
				continue
			}
			raw := filepath.Join(cfg.Raw, fmt.Sprintf("latency-%s-%s-%dqps.txt", qtype, slug(c.Name), cfg.Rate))
			p, err := runDNSPerf(ctx, dnsperfOpts{Port: c.d.Port, File: w.queries[qtype], Duration: cfg.LatDur,
				Clients: cfg.Clients, Pin: dnsperfPin, Rate: cfg.Rate, Verbose: true, Raw: raw})
			if err != nil {
				b.Fatalf("latency %s %s: %v", qtype, c.Name, err)
			}
			res.addLatency(qtype, c.Name, p)
			b.Logf("latency %-4s %-24s at %d QPS: p50 %.0f µs, p99 %.0f µs (%d answers, %d lost)", qtype, c.Name, cfg.Rate,
				percentile(p.Latencies, 50)*1e6, percentile(p.Latencies, 99)*1e6, len(p.Latencies), p.Lost)
		}
	}
	// A CPU profile of each under an unlimited A load (not counted points).
	profDur := max(time.Second, cfg.Duration-2*time.Second)
	for _, c := range cs {
		var (
			top     string
			profErr error
			wg      sync.WaitGroup
		)
		prof := filepath.Join(cfg.Raw, "cpu-"+slug(c.Name)+"-A.pprof")
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(500 * time.Millisecond)
			top, profErr = cpuProfile(ctx, c.pprof, harness.FindTools().CoreDNS, prof, profDur)
		}()
		_, err := runDNSPerf(ctx, dnsperfOpts{Port: c.d.Port, File: w.queries["A"], Duration: profDur + time.Second,
			Clients: cfg.Clients, Pin: dnsperfPin, Raw: filepath.Join(cfg.Raw, "dnsperf-profiled-A-"+slug(c.Name)+".txt")})
		wg.Wait()
		if err != nil || profErr != nil {
			b.Errorf("CPU profile of %s: dnsperf %v, profile %v", c.Name, err, profErr)
			continue
		}
		if c.Name == ours {
			res.ProfileTop = top
		}
		// The share of CPU spent growing goroutine stacks (each query runs
		// in a new goroutine).
		if cum, err := os.ReadFile(strings.TrimSuffix(prof, ".pprof") + ".top-cum.txt"); err == nil {
			if m := regexp.MustCompile(`(?m)\s([0-9.]+)%\s+runtime\.newstack$`).FindSubmatch(cum); m != nil {
				v, _ := strconv.ParseFloat(string(m[1]), 64)
				res.NewStack = append(res.NewStack, newStackShare{c.Name, v})
			}
		}
	}
}

func slug(s string) string { return strings.ReplaceAll(strings.Fields(s)[0], "mcsannotations", "ours") }

// memory records the heap (pprof, after a GC) and VmRSS of a contender,
// and for ours keeps a heap profile.
func (r *results) memory(t harness.T, c *contender, when string) {
	h, err := heapAlloc(c.pprof)
	if err != nil {
		t.Fatalf("%s heap: %v", c.Name, err)
	}
	rss, err := vmRSS(c.d.Process().PID())
	if err != nil {
		t.Fatalf("%s RSS: %v", c.Name, err)
	}
	t.Logf("%s %s: heap %.1f MB, VmRSS %.1f MB", c.Name, when, float64(h)/1e6, float64(rss)/1e6)
	mp := memPoint{Contender: c.Name, When: when, Heap: h, RSS: rss}
	if strings.HasPrefix(c.Name, ours) {
		name := "heap-" + strings.NewReplacer(" ", "-", "(", "", ")", "", ",", "").Replace(c.Name+"-"+when) + ".pprof"
		top, err := heapProfile(context.Background(), c.pprof, harness.FindTools().CoreDNS, filepath.Join(r.Cfg.Raw, name))
		if err != nil {
			t.Errorf("%s heap profile: %v", c.Name, err)
		}
		mp.Top = top
	}
	r.Mems = append(r.Mems, mp)
}

// liveTurn measures propagation (local and peer) and the resync after a cut
// link, on one CoreDNS (bin, "" for bin/coredns) with our plugin watching the
// data cluster through proxy and the peer cluster directly. tag sets apart
// the namespaces and files of one turn from another's.
func liveTurn(b *harness.Program, res *results, w *world, proxy *harness.Proxy, bin, tag string) liveRun {
	cfg := res.Cfg
	c := &contender{Name: ours + " (live)", SRV: true, bin: bin, tmpl: oursCorefile, vars: map[string]string{
		"CLUSTER": clusterA, "KUBECONFIG": w.a.KubeconfigVia(b, proxy),
		"EXTRA":    fmt.Sprintf("        peer %s %s\n", clusterB, w.b.Kubeconfig),
		"SNAPSHOT": filepath.Join(harness.TempDir(b), "table.db")}}
	c.start(b, "", w.ds, w.sample, startBound)
	defer c.keepLog(cfg.Raw, "live"+tag)
	defer c.stop(b)

	var run liveRun
	for _, side := range []struct {
		name string
		cl   *harness.Cluster
		ip   string
	}{{"local", w.a, "10.250.0.1"}, {"peer", w.b, "10.251.0.1"}} {
		lat, api := propagate(b, c, w, side.cl, side.ip, cfg.Changes, tag)
		run.Prop = append(run.Prop, propResult{side.name, lat, api})
		b.Logf("propagation %s: %d changes, p50 %s, p99 %s (the PATCH itself: p50 %s)", side.name, len(lat),
			pct(lat, 50), pct(lat, 99), pct(api, 50))
	}
	run.Resync = resync(b, c, w, proxy, cfg, false, tag)
	run.Relist = resync(b, c, w, proxy, cfg, true, tag)
	return run
}

// propagate makes n annotation changes on one Pod of cluster cl, each
// exporting a new service name, and times each from the PATCH to the first
// correct answer for the new name (and the PATCH round trip alone).
func propagate(t harness.T, c *contender, w *world, cl *harness.Cluster, ip string, n int, tag string) (lat, api []time.Duration) {
	ns := "prop-" + cl.Name + tag
	cl.CreateNamespace(t, ns)
	export := func(k int) string {
		return harness.ExportJSON(harness.ExportService{Name: fmt.Sprintf("prop-%d", k), Ports: []harness.ExportPort{{Name: portName, Port: svcPort, TargetPort: targetPort}}})
	}
	pod := harness.ExporterPod("prop", "", harness.ExportService{Name: "prop-0"})
	pod.Annotations[harness.ExportAnnotation] = export(0)
	cl.CreateReadyPods(t, ns, harness.ReadyPod{Pod: pod, IPs: []string{ip}})
	if cl == w.a {
		w.added++
	}
	waitName(t, c, "prop-0."+ns+".svc."+zone, ip, 60*time.Second)
	for k := 1; k <= n; k++ {
		name := fmt.Sprintf("prop-%d.%s.svc.%s", k, ns, zone)
		start := time.Now()
		cl.SetPodAnnotation(t, ns, "prop", harness.ExportAnnotation, export(k))
		api = append(api, time.Since(start))
		waitName(t, c, name, ip, 10*time.Second)
		lat = append(lat, time.Since(start))
	}
	return lat, api
}

// waitName polls (every millisecond) until name answers A with ip.
func waitName(t harness.T, c *contender, name, ip string, bound time.Duration) {
	deadline := time.Now().Add(bound)
	for {
		m, err := c.d.Exchange(harness.Query{Name: name, Type: dns.TypeA, Timeout: 500 * time.Millisecond})
		if err == nil && slices.Contains(harness.Addrs(m), ip) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s does not answer %s after %s (last: %v %v)\n%s", c.Name, name, ip, bound, m, err, c.d.LogTail(20))
		}
		time.Sleep(time.Millisecond)
	}
}

// resync cuts the link between CoreDNS and the data cluster's API server,
// changes a Pod while cut, restores the link and times how long the change
// takes to show, while a prober asks for names that exist throughout and
// counts every answer that is not the full, correct one.
//
// With restart, the API server is also killed and started again while the
// link is cut (a crash, a reboot or an upgrade of the control plane). Its new
// watch cache begins after the last change CoreDNS saw, so CoreDNS's watch
// cannot resume ("too old resource version") and its informer lists every
// Pod again: the resync an outage longer than the watch cache's window needs.
// Without restart the watch resumes and brings the one change. The link is
// restored once the new API server's watch cache serves Pods: a restarted
// API server first reads every object from etcd (its warm-up, reported
// apart), and until then it turns watches away; the resync is what follows
// a link that comes back to a running API server.
func resync(b *harness.Program, c *contender, w *world, proxy *harness.Proxy, cfg config, restart bool, tag string) resyncResult {
	cutFor := cfg.CutFor
	ns := "resync" + tag
	if restart {
		ns = "relist" + tag
	}
	w.a.CreateNamespace(b, ns)
	ip := "10.252.0.1"
	if restart {
		ip = "10.252.0.2"
	}
	pod := harness.ExporterPod("marker", "", harness.ExportService{Name: "before"})
	w.a.CreateReadyPods(b, ns, harness.ReadyPod{Pod: pod, IPs: []string{ip}})
	w.added++
	waitName(b, c, "before."+ns+".svc."+zone, ip, 60*time.Second)

	r := resyncResult{Endpoints: w.ds.total() + w.added, CutFor: cutFor, Restart: restart}
	var (
		stop atomic.Bool
		wg   sync.WaitGroup
		mu   sync.Mutex
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for k := 0; !stop.Load(); k++ {
			i := w.sample[k%len(w.sample)]
			bad := check(c, w.ds, i, dns.TypeA)
			mu.Lock()
			r.Probes++
			switch {
			case bad == "":
			case strings.Contains(bad, "i/o timeout") || strings.Contains(bad, "refused"):
				r.ProbeErrors++
			default:
				r.ProbeWrong++
				if r.FirstWrong == "" {
					r.FirstWrong = bad
				}
			}
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()

	heap, err := heapAlloc(c.pprof)
	if err != nil {
		b.Fatalf("CoreDNS's heap: %v", err)
	}
	r.Heap = heap
	proxy.Cut(b)
	cutAt := time.Now()
	after := harness.ExportJSON(harness.ExportService{Name: "after"})
	w.a.SetPodAnnotation(b, ns, "marker", harness.ExportAnnotation, after)
	if restart {
		w.a.KillAPIServer(b, syscall.SIGKILL)
		started := time.Now()
		w.a.StartAPIServer(b)
		r.WarmUp = waitWatchCache(b, w.a, started)
	}
	time.Sleep(time.Until(cutAt.Add(cutFor)))
	r.CutFor = time.Since(cutAt)
	if m, err := c.d.Exchange(harness.Query{Name: "after." + ns + ".svc." + zone, Type: dns.TypeA}); err != nil || m.Rcode != dns.RcodeNameError {
		b.Fatalf("while cut, the change already shows (or no answer): %v %v", m, err)
	}
	accepted, received := proxy.Accepted(), proxy.Received()
	pid := c.d.Process().PID()
	cpu0 := cpuOf(b, pid, w.a.APIServer().PID())
	rss, err := vmRSS(pid)
	if err == nil {
		r.AnonBefore, err = procStatusBytes(pid, "RssAnon")
	}
	if err == nil {
		err = resetPeakRSS(pid)
	}
	if err != nil {
		b.Fatalf("CoreDNS's RSS: %v", err)
	}
	r.RSSBefore = rss
	// A CPU profile of CoreDNS through the list (the pprof listener takes whole
	// seconds; a resumed watch takes milliseconds, so only the list).
	var prof sync.WaitGroup
	if restart {
		prof.Go(func() {
			path := filepath.Join(cfg.Raw, "cpu-ours-relist"+tag+".pprof")
			if _, err := cpuProfile(context.Background(), c.pprof, c.binary(), path, relistProfile); err != nil {
				b.Logf("CPU profile of the relist: %v", err)
			}
		})
		prof.Go(func() {
			path := filepath.Join(cfg.Raw, "cpu-apiserver-relist"+tag+".pprof")
			if _, err := apiServerProfile(context.Background(), w.a, path, relistProfile); err != nil {
				b.Logf("kube-apiserver's CPU profile of the relist: %v", err)
			}
		})
	}
	listed := len(listedPods(c.d.Log()))
	restore := time.Now()
	proxy.Restore(b)
	reconnected := make(chan time.Duration, 1)
	go func() { // the first connection CoreDNS opens through the restored link
		for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if proxy.Accepted() > accepted {
				reconnected <- time.Since(restore)
				return
			}
		}
		reconnected <- -1
	}()
	waitName(b, c, "after."+ns+".svc."+zone, ip, 5*time.Minute)
	r.Took = time.Since(restore)
	r.Received = proxy.Received() - received
	cpu1 := cpuOf(b, pid, w.a.APIServer().PID())
	r.CPUCoreDNS, r.CPUAPIServer = cpu1[0]-cpu0[0], cpu1[1]-cpu0[1]
	prof.Wait()
	r.Reconnect = <-reconnected
	time.Sleep(2 * time.Second) // keep probing after the resync
	stop.Store(true)
	wg.Wait()
	if ls := listedPods(c.d.Log()); len(ls) > listed {
		r.ListedPods = ls[len(ls)-1]
	}
	if r.RSSPeak, err = procStatusBytes(pid, "VmHWM"); err == nil {
		r.AnonAfter, err = procStatusBytes(pid, "RssAnon")
	}
	if err != nil {
		b.Fatalf("CoreDNS's peak RSS: %v", err)
	}
	b.Logf("resync of %d endpoints after a %s cut (API server restarted: %v, its warm-up %s): %s (first new connection after %s; %.1f MB from the API server; CPU: CoreDNS %s, kube-apiserver %s; CoreDNS heap %.1f MB, RSS %.1f MB, peak %.1f MB, anonymous %.1f MB then %.1f MB); prober: %d queries, %d wrong (empty/NXDOMAIN/other), %d errors",
		r.Endpoints, r.CutFor.Round(time.Millisecond), restart, r.WarmUp.Round(time.Millisecond), r.Took.Round(time.Millisecond), r.Reconnect.Round(time.Millisecond), float64(r.Received)/1e6,
		r.CPUCoreDNS.Round(time.Millisecond), r.CPUAPIServer.Round(time.Millisecond), float64(r.Heap)/1e6, float64(r.RSSBefore)/1e6, float64(r.RSSPeak)/1e6, float64(r.AnonBefore)/1e6, float64(r.AnonAfter)/1e6, r.Probes, r.ProbeWrong, r.ProbeErrors)
	return r
}

// waitWatchCache waits until c's API server serves a watch of Pods from its
// watch cache, which a restarted API server fills from etcd first (meanwhile
// it answers such watches 429, or holds them), and returns the time since
// since. The watch's selector matches nothing: it lists no Pod.
func waitWatchCache(t harness.T, c *harness.Cluster, since time.Time) time.Duration {
	t.Helper()
	timeout := int64(1)
	opts := metav1.ListOptions{ResourceVersion: "0", LabelSelector: "mcs-bench-warm-check=none", TimeoutSeconds: &timeout, Watch: true}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		// No retries inside client-go: it would sleep out each 429's Retry-After (1 s).
		w, err := c.Client.CoreV1().RESTClient().Get().Resource("pods").
			VersionedParams(&opts, scheme.ParameterCodec).MaxRetries(0).Watch(ctx)
		if err == nil {
			w.Stop()
			cancel()
			return time.Since(since)
		}
		cancel()
		if time.Now().After(deadline) {
			t.Fatalf("%s: the API server's watch cache does not serve Pods %s after its start: %v", c.Name, time.Since(since).Round(time.Second), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// relistProfile is how long the CPU profile of a relist runs from the restore.
const relistProfile = 15 * time.Second

// cpuOf reads the CPU time (user + system) of each process.
func cpuOf(t harness.T, pids ...int) []time.Duration {
	out := make([]time.Duration, len(pids))
	for i, pid := range pids {
		d, err := procCPU(pid)
		if err != nil {
			t.Fatalf("CPU time of PID %d: %v", pid, err)
		}
		out[i] = d
	}
	return out
}

// coldStart writes a snapshot of ColdEndpoints endpoints with the plugin's
// own packages, then starts bin/coredns with that snapshot and an API server
// that does not exist, and times process start to the first correct answer.
func coldStart(b *harness.Program, res *results) {
	cfg := res.Cfg
	ds := dataset{cluster: clusterA, services: max(1, cfg.ColdEndpoints/10), endpoints: 10, namespaces: 50}
	dir := harness.TempDir(b)
	snap := filepath.Join(dir, "table.db")
	start := time.Now()
	size := writeSnapshot(b, ds, snap)
	r := coldResult{Endpoints: ds.total(), Services: ds.services, FileBytes: size, WriteTook: time.Since(start)}
	b.Logf("snapshot of %d endpoints (%d services) written in %s: %.1f MB", r.Endpoints, r.Services, r.WriteTook.Round(time.Millisecond), float64(r.FileBytes)/1e6)
	kc := unreachableKubeconfig(b, dir)
	empty := filepath.Join(dir, "empty.db")
	base := &contender{Name: ours + " (empty snapshot)", tmpl: oursCorefile, vars: map[string]string{
		"CLUSTER": clusterA, "KUBECONFIG": kc, "EXTRA": "", "SNAPSHOT": empty}}
	base.start(b, "", dataset{cluster: clusterA, endpoints: 1, namespaces: 1}, nil, startBound)
	time.Sleep(500 * time.Millisecond)
	res.memory(b, base, "no API server, empty snapshot")
	r.HeapEmpty = res.Mems[len(res.Mems)-1].Heap
	base.stop(b)
	// The same start with an empty snapshot (the process's own start-up: Go
	// runtime, every in-tree plugin's init, the server) is timed in turns
	// with the cold starts below, so both see the machine in the same state:
	// its speed here moves a start by tens of milliseconds from one quarter
	// hour to the next.
	emptyStart := func(k int) {
		t0 := base.d.StartNoWait(b)
		deadline := t0.Add(30 * time.Second)
		for {
			if _, err := base.d.Exchange(harness.Query{Name: ds.qname(0), Type: dns.TypeA, Timeout: time.Second}); err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("empty start %d: no answer after 30 s:\n%s", k+1, base.d.LogTail(20))
			}
			time.Sleep(time.Millisecond)
		}
		r.EmptyRuns = append(r.EmptyRuns, time.Since(t0))
		base.d.Stop(b)
	}

	c := &contender{Name: ours + " (cold)", tmpl: oursCorefile, vars: map[string]string{
		"CLUSTER": clusterA, "KUBECONFIG": kc, "EXTRA": "", "SNAPSHOT": snap}}
	sample := sampleOf(ds, 25)
	c.start(b, "", ds, sample, startBound)
	if m := regexp.MustCompile(`loaded (\d+) records`).FindStringSubmatch(c.d.Log()); m != nil {
		r.Loaded, _ = strconv.Atoi(m[1])
	}
	if r.Loaded != ds.total() {
		b.Fatalf("CoreDNS loaded %d records of the snapshot's %d:\n%s", r.Loaded, ds.total(), c.d.LogTail(20))
	}
	time.Sleep(500 * time.Millisecond)
	res.memory(b, c, "no API server, snapshot loaded")
	r.HeapLoaded = res.Mems[len(res.Mems)-1].Heap
	for i := 0; i < ds.services; i++ { // every service asked once: every answer rendered
		if bad := check(c, ds, i, dns.TypeA); bad != "" {
			b.Fatalf("cold: %s", bad)
		}
	}
	res.memory(b, c, "no API server, every service asked once")
	r.HeapRendered = res.Mems[len(res.Mems)-1].Heap
	c.d.Stop(b)

	probe := sample[len(sample)/2]
	for k := 0; k < cfg.ColdRuns; k++ {
		emptyStart(k)
		t0 := c.d.StartNoWait(b)
		deadline := t0.Add(30 * time.Second)
		for check(c, ds, probe, dns.TypeA) != "" {
			if time.Now().After(deadline) {
				b.Fatalf("cold start %d: no correct answer after 30 s:\n%s", k+1, c.d.LogTail(20))
			}
			time.Sleep(time.Millisecond)
		}
		took := time.Since(t0)
		r.Runs = append(r.Runs, took)
		b.Logf("cold start %d: first correct answer %s after the process started (empty snapshot just before: %s)", k+1, took.Round(100*time.Microsecond), r.EmptyRuns[k].Round(100*time.Microsecond))
		c.d.Stop(b)
	}
	_ = os.WriteFile(filepath.Join(cfg.Raw, "cold-start-coredns.log"), []byte(c.d.Log()), 0o644)
	res.Cold = &r
	if _, err := exec.LookPath("perf"); err == nil {
		r.Perf = perfColdStart(b, c, ds, probe, filepath.Join(cfg.Raw, "cold-start.perf"))
	}
}

// writeSnapshot writes the data set into a snapshot file at path with the
// plugin's own packages, as a source that was last in contact now, and
// returns the file's size.
func writeSnapshot(b *harness.Program, ds dataset, path string) int64 {
	st, _, err := snapshot.Open(path, snapshot.Options{Logf: b.Logf})
	if err != nil {
		b.Fatalf("snapshot: %v", err)
	}
	recs := make(map[string][]byte, ds.total())
	for i := 0; i < ds.services; i++ {
		for j := 0; j < ds.endpoints; j++ {
			p := ds.tablePod(i, j)
			v, err := snapshot.EncodePod(p)
			if err != nil {
				b.Fatalf("encode: %v", err)
			}
			recs[p.Namespace+"/"+p.Name] = v
		}
	}
	now := time.Now()
	st.ReplaceSource(ds.cluster, recs, snapshot.Meta{ClusterID: ds.cluster, LastContact: now, LastFullSync: now})
	if err := st.Close(); err != nil {
		b.Fatalf("snapshot: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatalf("snapshot: %v", err)
	}
	return fi.Size()
}

// unreachableKubeconfig writes a kubeconfig in dir whose API server is not
// there (a port nothing listens on) and returns its path.
func unreachableKubeconfig(t harness.T, dir string) string {
	kc := filepath.Join(dir, "unreachable.kubeconfig")
	if err := harness.WriteKubeconfig(kc, clusterA, "https://127.0.0.1:"+strconv.Itoa(harness.FreePort(t)), "none"); err != nil {
		t.Fatalf("%v", err)
	}
	return kc
}

// perfColdStart runs one more cold start under `perf record -g` (the CPU
// time of start-up, which pprof cannot see), until the first correct
// answer, and returns `perf report` by symbol, children included. perf is
// optional (a machine may not allow it): failing to run it is only noted.
func perfColdStart(b *harness.Program, c *contender, ds dataset, probe int, out string) string {
	if err := harness.PortFree(c.d.Port); err != nil {
		b.Logf("skipping the perf profile: perf cold start: %v", err)
		return ""
	}
	cx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log, _ := os.Create(out + ".log")
	defer log.Close()
	cmd := exec.CommandContext(cx, "perf", "record", "-F", "2000", "-g", "-o", out, "--", harness.FindTools().CoreDNS, "-conf", c.d.CorefilePath)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 20 * time.Second
	if err := cmd.Start(); err != nil {
		b.Logf("skipping the perf profile: perf: %v", err)
		return ""
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for check(c, ds, probe, dns.TypeA) != "" && time.Now().Before(deadline) {
		select {
		case err := <-exited:
			b.Logf("skipping the perf profile: perf ended early (%v); see %s.log", err, out)
			return ""
		default:
		}
		time.Sleep(time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGINT) // perf passes it on to CoreDNS and writes its file
	<-exited                               // bounded: the context's cancel and WaitDelay end perf
	if err := harness.PortFree(c.d.Port); err != nil {
		b.Errorf("perf cold start: CoreDNS still there after perf ended: %v", err)
	}
	rep, err := exec.CommandContext(context.Background(), "perf", "report", "-i", out, "--children", "--sort", "symbol", "-g", "none", "--stdio").Output()
	if err != nil {
		b.Logf("skipping the perf profile: perf report: %v", err)
		return ""
	}
	var lines []string
	for _, l := range strings.Split(string(rep), "\n") {
		if strings.HasPrefix(l, "#") || !strings.Contains(l, "%") {
			continue
		}
		lines = append(lines, strings.TrimRight(l, " -"))
		if len(lines) == 45 {
			break
		}
	}
	_ = os.WriteFile(out+".report.txt", rep, 0o644)
	return strings.Join(lines, "\n")
}

// goBenchmarks runs the plugin's own Go benchmarks and keeps their output.
func goBenchmarks(ctx context.Context, b *harness.Program, res *results) {
	for _, gb := range []struct{ pkg, args string }{
		{"./internal/snapshot/", "-run ^TestLookupDoesNotAllocate$ -bench ^(BenchmarkIndexHeap|BenchmarkColdLoad)$ -benchtime 3x -benchmem"},
		{"./plugin/mcsannotations/", "-run ^$ -bench ^(BenchmarkServeDNS|BenchmarkServeDNSProbe)$ -benchmem"},
		{"./internal/probe/", "-run ^$ -bench ^BenchmarkRound$ -benchmem"},
		{"./internal/snapshot/", "-run ^$ -bench ^(BenchmarkLoad100k|BenchmarkOpenAndLoad100k)$ -benchtime 5x -benchmem"},
		{"./internal/clients/", "-run ^$ -bench ^BenchmarkSlimClientMemory$ -benchtime 3x"},
		{"./annotation/", "-run ^$ -bench ^(BenchmarkVerify|BenchmarkParseExports)$ -benchtime 2000x -benchmem"},
	} {
		args := append([]string{"test", "-count=1", "-v"}, strings.Fields(gb.args)...)
		args = append(args, gb.pkg)
		cx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		cmd := exec.CommandContext(cx, "go", args...)
		cmd.Dir = res.Root
		start := time.Now()
		out, err := cmd.CombinedOutput()
		cancel()
		raw := filepath.Join(res.Cfg.Raw, "gobench-"+filepath.Base(gb.pkg)+".txt")
		_ = os.WriteFile(raw, append([]byte("$ go "+strings.Join(args, " ")+"\n"), out...), 0o644)
		if err != nil {
			b.Fatalf("go %s: %v (output in %s)", strings.Join(args, " "), err, raw)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if (strings.HasPrefix(l, "Benchmark") && strings.Contains(l, "/op")) || strings.HasPrefix(l, "--- PASS: TestLookup") {
				res.GoBench = append(res.GoBench, strings.Join(strings.Fields(l), " "))
			}
		}
		b.Logf("go test %s: %s", gb.pkg, time.Since(start).Round(100*time.Millisecond))
	}
}
