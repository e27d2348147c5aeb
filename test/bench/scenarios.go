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
	"syscall"
	"time"

	"github.com/miekg/dns"

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
	// The in-tree plugin's ServiceImports and EndpointSlices serve the DNS
	// comparisons only (they take minutes at full size).
	clusters := time.Since(start)
	res.Data = w.ds.load(b, w.a, cfg.Workers, cfg.wants("dns") || cfg.wants("instr"))
	res.Data.ClustersTook = clusters

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
	return w
}

// contenders are the three servers over the world's data.
func (w *world) contenders(b *harness.Program) []*contender {
	return []*contender{
		w.ours(b, ours, ""),
		{Name: hosts, tmpl: hostsCorefile, vars: map[string]string{"HOSTS": w.hostsFile}},
		{Name: intree, SRV: true, tmpl: intreeCorefile, vars: map[string]string{"KUBECONFIG": w.a.Kubeconfig}},
	}
}

// ours is our plugin on bin (a coredns binary, "" for bin/coredns) over
// the world's data.
func (w *world) ours(b *harness.Program, name, bin string) *contender {
	return &contender{Name: name, SRV: true, bin: bin, tmpl: oursCorefile, vars: map[string]string{
		"CLUSTER": clusterA, "KUBECONFIG": w.a.Kubeconfig, "EXTRA": "",
		"SNAPSHOT": filepath.Join(harness.TempDir(b), "table.db")}}
}

// dnsStage runs the three contenders side by side, pinned then unpinned.
func dnsStage(ctx context.Context, b *harness.Program, res *results, w *world) {
	res.DNS = &dnsResult{}
	throughput(ctx, b, res, w, true)
	throughput(ctx, b, res, w, false)
}

// throughput runs the dnsperf points of one mode: the three contenders
// started side by side, each point run for A and SRV, Runs times, with the
// contenders' order rotated every run. Pinned: CoreDNS on CPU 0, dnsperf on
// CPU 1, and then the fixed-rate latency runs and a CPU profile of each.
// Unpinned: also the heap and RSS of each. With -compare-coredns, ours on
// the old build is a fourth contender of the rotated runs and of the memory
// points (not of the latency runs and profiles).
func throughput(ctx context.Context, b *harness.Program, res *results, w *world, pin bool) {
	cfg, d := res.Cfg, res.DNS
	mode, dnsperfPin := "unpinned", ""
	if pin {
		mode, dnsperfPin = "pinned", "1"
	}
	cs := w.contenders(b)
	if cfg.CompareCoreDNS != "" {
		cs = append(cs, w.ours(b, oursOld, cfg.CompareCoreDNS))
	}
	for _, c := range cs {
		wrapper := ""
		if pin {
			wrapper = c.pinWrapper(b, w.dir)
		}
		took := c.start(b, wrapper, w.ds, w.sample, startBound)
		b.Logf("%s (%s, PID %d) answers every sample correctly %s after start", c.Name, mode, c.d.Process().PID(), took.Round(time.Millisecond))
		d.Sync = append(d.Sync, syncPoint{mode, c.Name, took})
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
			d.Mems = append(d.Mems, memory(b, cfg.Raw, c, "loaded"))
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
				cpu0, start := cpuOf(b, c.d.Process()), time.Now()
				p, err := runDNSPerf(ctx, dnsperfOpts{Port: c.d.Port, File: w.queries[qtype], Duration: cfg.Duration,
					Clients: cfg.Clients, Pin: dnsperfPin, Raw: raw})
				if err != nil {
					b.Fatalf("%s %s %s: %v", mode, qtype, c.Name, err)
				}
				p.Took, p.CPU = time.Since(start), cpuOf(b, c.d.Process())[0]-cpu0[0]
				b.Logf("%s %-4s %-24s run %d: %8.0f QPS, %d lost, %s; CoreDNS CPU %s (%.1f µs per answer)", mode, qtype, c.Name, run+1,
					p.QPS, p.Lost, p.Rcodes, p.CPU, float64(p.CPUPerAnswer())/1e3)
				d.add(mode, qtype, c.Name, p)
			}
		}
	}
	if !pin {
		for _, c := range cs {
			d.Mems = append(d.Mems, memory(b, cfg.Raw, c, "after load"))
		}
		// The live baseline: our plugin watching a cluster with no exporter
		// Pods (the peer cluster, still empty now), on each build.
		for _, c := range cs {
			if !strings.HasPrefix(c.Name, ours) {
				continue
			}
			base := &contender{Name: c.Name + " (empty)", bin: c.bin, tmpl: oursCorefile, vars: map[string]string{
				"CLUSTER": clusterB, "KUBECONFIG": w.b.Kubeconfig, "EXTRA": "",
				"SNAPSHOT": filepath.Join(harness.TempDir(b), "table.db")}}
			empty := dataset{cluster: clusterB, services: 0, endpoints: 1, namespaces: 1}
			base.start(b, "", empty, nil, startBound)
			time.Sleep(time.Second)
			d.Mems = append(d.Mems, memory(b, cfg.Raw, base, "loaded"))
			base.stop(b)
		}
		return
	}
	// The latency runs and the CPU profiles: the three contenders, not the old build.
	three := slices.DeleteFunc(slices.Clone(cs), func(c *contender) bool { return c.Name == oursOld })
	// Fixed-rate latency, pinned.
	for _, qtype := range []string{"A", "SRV"} {
		for _, c := range three {
			if qtype == "SRV" && !c.SRV {
				continue
			}
			raw := filepath.Join(cfg.Raw, fmt.Sprintf("latency-%s-%s-%dqps.txt", qtype, slug(c.Name), cfg.Rate))
			p, err := runDNSPerf(ctx, dnsperfOpts{Port: c.d.Port, File: w.queries[qtype], Duration: cfg.LatDur,
				Clients: cfg.Clients, Pin: dnsperfPin, Rate: cfg.Rate, Verbose: true, Raw: raw})
			if err != nil {
				b.Fatalf("latency %s %s: %v", qtype, c.Name, err)
			}
			if d.Latency == nil {
				d.Latency = map[string]perf{}
			}
			d.Latency[qtype+"/"+c.Name] = p
			b.Logf("latency %-4s %-24s at %d QPS: p50 %.0f µs, p99 %.0f µs (%d answers, %d lost)", qtype, c.Name, cfg.Rate,
				percentile(p.Latencies, 50)*1e6, percentile(p.Latencies, 99)*1e6, len(p.Latencies), p.Lost)
		}
	}
	// A CPU profile of each under an unlimited A load (not counted points).
	profDur := max(time.Second, cfg.Duration-2*time.Second)
	for _, c := range three {
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
			top, profErr = cpuProfile(ctx, c.pprof, c.binary(), prof, profDur)
		}()
		_, err := runDNSPerf(ctx, dnsperfOpts{Port: c.d.Port, File: w.queries["A"], Duration: profDur + time.Second,
			Clients: cfg.Clients, Pin: dnsperfPin, Raw: filepath.Join(cfg.Raw, "dnsperf-profiled-A-"+slug(c.Name)+".txt")})
		wg.Wait()
		if err != nil || profErr != nil {
			b.Errorf("CPU profile of %s: dnsperf %v, profile %v", c.Name, err, profErr)
			continue
		}
		if c.Name == ours {
			d.ProfileTop = top
		}
		// The share of CPU spent growing goroutine stacks (each query runs
		// in a new goroutine).
		if cum, err := os.ReadFile(strings.TrimSuffix(prof, ".pprof") + ".top-cum.txt"); err == nil {
			if m := regexp.MustCompile(`(?m)\s([0-9.]+)%\s+runtime\.newstack$`).FindSubmatch(cum); m != nil {
				v, _ := strconv.ParseFloat(string(m[1]), 64)
				d.NewStack = append(d.NewStack, newStackShare{c.Name, v})
			}
		}
	}
}

func slug(s string) string {
	if s == oursOld {
		return "ours-old"
	}
	return strings.ReplaceAll(strings.Fields(s)[0], "mcsannotations", "ours")
}

// memory reads the heap (pprof, after a GC) and VmRSS of a contender, and
// for ours keeps a heap profile in raw.
func memory(t harness.T, raw string, c *contender, when string) memPoint {
	h, err := heapAlloc(c.pprof)
	if err != nil {
		t.Fatalf("%s heap: %v", c.Name, err)
	}
	rss, err := c.d.Process().StatusBytes("VmRSS")
	if err != nil {
		t.Fatalf("%s RSS: %v", c.Name, err)
	}
	t.Logf("%s %s: heap %.1f MB, VmRSS %.1f MB", c.Name, when, float64(h)/1e6, float64(rss)/1e6)
	mp := memPoint{Contender: c.Name, When: when, Heap: h, RSS: rss}
	if strings.HasPrefix(c.Name, ours) {
		name := "heap-" + strings.NewReplacer(" ", "-", "(", "", ")", "", ",", "").Replace(c.Name+"-"+when) + ".pprof"
		if mp.Top, err = heapProfile(context.Background(), c.pprof, c.binary(), filepath.Join(raw, name)); err != nil {
			t.Errorf("%s heap profile: %v", c.Name, err)
		}
	}
	return mp
}

// cpuOf reads the CPU time (user + system) of each process.
func cpuOf(t harness.T, procs ...*harness.Process) []time.Duration {
	out := make([]time.Duration, len(procs))
	for i, p := range procs {
		d, err := p.CPUTime()
		if err != nil {
			t.Fatalf("%v", err)
		}
		out[i] = d
	}
	return out
}

// coldResult is the cold start from a snapshot: bin/coredns's (first)
// turn and, with -compare-coredns, every turn of both builds.
type coldResult struct {
	Endpoints, Services int
	FileBytes           int64
	WriteTook           time.Duration
	coldRun
	Mems    []memPoint   // the first turn's
	Perf    string       // perf report of one more cold start
	Compare *coldCompare `json:",omitempty"`
}

// coldRun is what one CoreDNS measured in the cold stage.
type coldRun struct {
	Build                               string `json:",omitempty"` // "new" or "old", in turns
	Turn                                int    `json:",omitempty"`
	Loaded                              int
	HeapEmpty, HeapLoaded, HeapRendered int64
	Runs                                []time.Duration
	EmptyRuns                           []time.Duration // the same start with an empty snapshot, just before each of Runs
}

// coldCompare is the cold stage's turns of both builds.
type coldCompare struct {
	Runs []coldRun
}

// snapshotShare is the median of each cold start's time less the empty start
// timed just before it: the cost of loading the snapshot, with the machine's
// speed of the moment mostly taken out.
func (c coldRun) snapshotShare() (time.Duration, bool) {
	if len(c.Runs) == 0 || len(c.EmptyRuns) != len(c.Runs) {
		return 0, false
	}
	d := make([]time.Duration, len(c.Runs))
	for i := range c.Runs {
		d[i] = c.Runs[i] - c.EmptyRuns[i]
	}
	return pct(d, 50), true
}

// SnapshotShare is snapshotShare for the report (0 when unpaired).
func (c coldRun) SnapshotShare() time.Duration {
	d, _ := c.snapshotShare()
	return d
}

// PerEndpoint is a heap figure less the empty heap, per endpoint.
func (c *coldResult) PerEndpoint(heap int64) float64 {
	return float64(heap-c.HeapEmpty) / float64(c.Endpoints)
}

// coldStart writes a snapshot of ColdEndpoints endpoints with the plugin's
// own packages, then starts bin/coredns with that snapshot and an API server
// that does not exist, and times process start to the first correct answer;
// with -compare-coredns in turns with the old build, each build on its own
// copy of the snapshot.
func coldStart(_ context.Context, b *harness.Program, res *results, _ *world) {
	cfg := res.Cfg
	ds := dataset{cluster: clusterA, services: max(1, cfg.ColdEndpoints/10), endpoints: 10, namespaces: 50}
	dir := harness.TempDir(b)
	snap := map[string]string{"new": filepath.Join(dir, "table.db")}
	start := time.Now()
	size := writeSnapshot(b, ds, snap["new"])
	r := &coldResult{Endpoints: ds.total(), Services: ds.services, FileBytes: size, WriteTook: time.Since(start)}
	res.Cold = r
	b.Logf("snapshot of %d endpoints (%d services) written in %s: %.1f MB", r.Endpoints, r.Services, r.WriteTook.Round(time.Millisecond), float64(r.FileBytes)/1e6)
	if cfg.CompareCoreDNS != "" {
		r.Compare = &coldCompare{}
		snap["old"] = filepath.Join(dir, "table-old.db")
		writeSnapshot(b, ds, snap["old"])
	}
	kc := unreachableKubeconfig(b, dir)
	var first *contender
	ts := turns(cfg)
	for _, t := range ts {
		if len(ts) > 1 {
			b.Logf("turn %d of %d: %s build", t.N, cfg.CompareTurns, t.Build)
		}
		run, c := coldTurn(b, res, ds, t, snap[t.Build], filepath.Join(dir, "empty-"+t.Build+".db"), kc)
		if t.first() {
			r.coldRun, first = run, c
		}
		if r.Compare != nil {
			run.Build, run.Turn = t.Build, t.N
			r.Compare.Runs = append(r.Compare.Runs, run)
		}
	}
	if _, err := exec.LookPath("perf"); err == nil {
		r.Perf = perfColdStart(b, first, ds, filepath.Join(cfg.Raw, "cold-start.perf"))
	}
}

// coldTurn measures one build (t.Bin) from the snapshot snap: the heap with
// an empty snapshot (empty), with snap loaded and with every service asked
// once, then ColdRuns starts of each, in pairs. It returns them and the
// contender of snap, stopped.
func coldTurn(b *harness.Program, res *results, ds dataset, t turn, snap, empty, kc string) (coldRun, *contender) {
	cfg, r := res.Cfg, res.Cold
	var run coldRun
	label := ""
	if !t.first() {
		label = fmt.Sprintf(", %s build, turn %d", t.Build, t.N)
	}
	// The first turn's memory points are the report's, with a heap profile
	// each; the other turns read the heap only.
	mem := func(c *contender, when string) int64 {
		if !t.first() {
			h, err := heapAlloc(c.pprof)
			if err != nil {
				b.Fatalf("%s heap: %v", c.Name, err)
			}
			b.Logf("%s %s: heap %.1f MB", c.Name, when, float64(h)/1e6)
			return h
		}
		m := memory(b, cfg.Raw, c, when)
		r.Mems = append(r.Mems, m)
		return m.Heap
	}
	base := &contender{Name: ours + " (empty snapshot" + label + ")", bin: t.Bin, tmpl: oursCorefile, vars: map[string]string{
		"CLUSTER": clusterA, "KUBECONFIG": kc, "EXTRA": "", "SNAPSHOT": empty}}
	base.start(b, "", dataset{cluster: clusterA, endpoints: 1, namespaces: 1}, nil, startBound)
	time.Sleep(500 * time.Millisecond)
	run.HeapEmpty = mem(base, "no API server, empty snapshot")
	base.stop(b)
	c := &contender{Name: ours + " (cold" + label + ")", bin: t.Bin, tmpl: oursCorefile, vars: map[string]string{
		"CLUSTER": clusterA, "KUBECONFIG": kc, "EXTRA": "", "SNAPSHOT": snap}}
	sample := sampleOf(ds, 25)
	c.start(b, "", ds, sample, startBound)
	if m := regexp.MustCompile(`loaded (\d+) records`).FindStringSubmatch(c.d.Log()); m != nil {
		run.Loaded, _ = strconv.Atoi(m[1])
	}
	if run.Loaded != ds.total() {
		b.Fatalf("%s: CoreDNS loaded %d records of the snapshot's %d:\n%s", c.Name, run.Loaded, ds.total(), c.d.LogTail(20))
	}
	time.Sleep(500 * time.Millisecond)
	run.HeapLoaded = mem(c, "no API server, snapshot loaded")
	for i := 0; i < ds.services; i++ { // every service asked once: every answer rendered
		if bad := check(c, ds, i, dns.TypeA); bad != "" {
			b.Fatalf("cold: %s", bad)
		}
	}
	run.HeapRendered = mem(c, "no API server, every service asked once")
	c.d.Stop(b)

	// The same start with an empty snapshot (the process's own start-up: Go
	// runtime, every in-tree plugin's init, the server) is timed in turns
	// with the cold starts, so both see the machine in the same state.
	probe := sample[len(sample)/2]
	for k := 0; k < cfg.ColdRuns; k++ {
		run.EmptyRuns = append(run.EmptyRuns, timedStart(b, base, fmt.Sprintf("empty start %d", k+1), func() bool {
			_, err := base.d.Exchange(harness.Query{Name: ds.qname(0), Type: dns.TypeA, Timeout: time.Second})
			return err == nil
		}))
		run.Runs = append(run.Runs, timedStart(b, c, fmt.Sprintf("cold start %d", k+1), func() bool { return check(c, ds, probe, dns.TypeA) == "" }))
		b.Logf("cold start %d%s: first correct answer %s after the process started (empty snapshot just before: %s)", k+1, label, run.Runs[k].Round(100*time.Microsecond), run.EmptyRuns[k].Round(100*time.Microsecond))
	}
	_ = os.WriteFile(filepath.Join(cfg.Raw, "cold-start-coredns"+t.Tag+".log"), []byte(c.d.Log()), 0o644)
	return run, c
}

// timedStart starts c's CoreDNS again, returns the time from the start
// until answered holds (asked every millisecond, for at most 30 s), and
// stops it.
func timedStart(b *harness.Program, c *contender, what string, answered func() bool) time.Duration {
	t0 := c.d.StartNoWait(b)
	for deadline := t0.Add(30 * time.Second); !answered(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("%s: no correct answer after 30 s:\n%s", what, c.d.LogTail(20))
		}
	}
	took := time.Since(t0)
	c.d.Stop(b)
	return took
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
// time of start-up, which pprof cannot see) until every sample answers
// correctly, and returns `perf report` by symbol, children included. perf is
// optional (a machine may not allow it): failing to run it is only noted.
func perfColdStart(b *harness.Program, c *contender, ds dataset, out string) string {
	ok := b.Scoped(func(t *harness.Program) {
		pc := *c
		pc.start(t, wrapper(t, t.TempDir(), "coredns-perf", fmt.Sprintf("perf record -F 2000 -g -o %q --", out), c.bin), ds, sampleOf(ds, 25), 30*time.Second)
		// perf passes SIGINT on to CoreDNS, and writes its file once it ended.
		pc.d.Kill(t, syscall.SIGINT)
	})
	if !ok {
		b.Logf("skipping the perf profile: perf cold start failed (see above)")
		return ""
	}
	rep, err := exec.Command("perf", "report", "-i", out, "--children", "--sort", "symbol", "-g", "none", "--stdio").Output()
	if err != nil {
		b.Logf("skipping the perf profile: perf report: %v", err)
		return ""
	}
	_ = os.WriteFile(out+".report.txt", rep, 0o644)
	var lines []string
	for _, l := range strings.Split(string(rep), "\n") {
		if !strings.HasPrefix(l, "#") && strings.Contains(l, "%") && len(lines) < 45 {
			lines = append(lines, strings.TrimRight(l, " -"))
		}
	}
	return strings.Join(lines, "\n")
}

// goBenchmarks runs the Go benchmarks of the plugin and the annotator and
// keeps their output.
func goBenchmarks(ctx context.Context, b *harness.Program, res *results, _ *world) {
	for _, gb := range []struct{ pkg, args string }{
		{"./internal/table/", "-run ^TestLookupDoesNotAllocate$ -bench ^$"},
		{"./internal/snapshot/", "-run ^$ -bench ^(BenchmarkIndexHeap|BenchmarkColdLoad|BenchmarkDecodeOrigins|BenchmarkLoad100k|BenchmarkOpenAndLoad100k)$ -benchtime 3x -benchmem"},
		{"./plugin/mcsannotations/", "-run ^$ -bench ^(BenchmarkServeDNS|BenchmarkServeDNSProbe|BenchmarkRelayEdgeHeap)$ -benchmem"},
		{"./internal/relay/", "-run ^$ -bench ^BenchmarkRelayHeap$ -benchtime 2x"},
		{"./internal/probe/", "-run ^$ -bench ^BenchmarkRound$ -benchmem"},
		{"./internal/clients/", "-run ^$ -bench ^BenchmarkSlimClientMemory$ -benchtime 3x"},
		{"./annotation/", "-run ^$ -bench ^(BenchmarkVerify|BenchmarkParseExports)$ -benchtime 2000x -benchmem"},
		{"./annotator/", "-run ^$ -bench ^BenchmarkReconcileSettled$ -benchmem"},
	} {
		start := time.Now()
		out := goTest(ctx, b, res, "gobench-"+filepath.Base(gb.pkg)+".txt", 10*time.Minute, append(append([]string{"-v"}, strings.Fields(gb.args)...), gb.pkg)...)
		for _, l := range strings.Split(out, "\n") {
			if (strings.HasPrefix(l, "Benchmark") && strings.Contains(l, "/op")) || strings.HasPrefix(l, "--- PASS: TestLookup") {
				res.GoBench = append(res.GoBench, strings.Join(strings.Fields(l), " "))
			}
		}
		b.Logf("go test %s: %s", gb.pkg, time.Since(start).Round(100*time.Millisecond))
	}
}

// goTest runs `go test -count=1 args` in the repository, keeps its output
// in the raw folder as name, and returns it.
func goTest(ctx context.Context, b *harness.Program, res *results, name string, bound time.Duration, args ...string) string {
	args = append([]string{"test", "-count=1"}, args...)
	cx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	cmd := exec.CommandContext(cx, "go", args...)
	cmd.Dir = res.Root
	out, err := cmd.CombinedOutput()
	raw := filepath.Join(res.Cfg.Raw, name)
	_ = os.WriteFile(raw, append([]byte("$ go "+strings.Join(args, " ")+"\n"), out...), 0o644)
	if err != nil {
		b.Fatalf("go %s: %v (output in %s)", strings.Join(args, " "), err, raw)
	}
	return string(out)
}

// probeStage measures the probes' failover, then their cost (also when the
// failover failed).
func probeStage(ctx context.Context, b *harness.Program, res *results, _ *world) {
	failover := b.Run(func() { probeFailover(b, res) })
	probeCost(ctx, b, res)
	if !failover {
		b.Fatalf("probe failover failed (see above)")
	}
}
