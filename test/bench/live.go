package main

import (
	"context"
	"fmt"
	"os"
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
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// liveResult is the live stage: propagation and resync on bin/coredns and,
// with -compare-coredns, the same in turns against an older build.
type liveResult struct {
	liveRun                // bin/coredns's (first) turn
	Compare *compareResult `json:",omitempty"`
}

// liveRun is what one CoreDNS measured in the live stage.
type liveRun struct {
	Build          string `json:",omitempty"` // "new" (bin/coredns) or "old" (-compare-coredns), in turns
	Turn           int    `json:",omitempty"`
	Prop           []propResult
	Resync, Relist resyncResult // the watch resumes; the API server restarted while cut, every Pod listed again
}

// compareResult is the live stage in turns against an older build.
type compareResult struct {
	Old, OldCommit string
	Runs           []liveRun
}

type propResult struct {
	Source   string
	Lat, API []time.Duration
}

type resyncResult struct {
	Endpoints                       int
	Restart                         bool // the API server restarted while cut: a full list, not a resumed watch
	CutFor, Took                    time.Duration
	WarmUp                          time.Duration // with Restart: the API server's start until its watch cache served Pods (before the restore)
	Received                        int64         // bytes from the API server through the proxy, restore to the changed answer
	CPUCoreDNS, CPUAPIServer        time.Duration // CPU time of each process, restore to the changed answer
	Heap                            int64         // CoreDNS's heap after a GC (HeapAlloc) before the cut
	RSSBefore, RSSPeak              int64         // CoreDNS's RSS at the restore and its peak until the end of the probing
	AnonBefore, AnonAfter           int64         // its anonymous RSS (the heap and stacks, not the binary or the snapshot's map) at the restore and at the end
	Reconnect                       time.Duration // restore to the first connection through the proxy; -1 if none
	Probes, ProbeWrong, ProbeErrors int
	FirstWrong                      string
	ListedPods                      int // Pods of the data cluster listed again from the restore to the end, by CoreDNS's log; 0 if none
}

// Kind names the case, as the report's rows say it.
func (rs resyncResult) Kind() string {
	if rs.Restart {
		return "API server restarted while cut: every Pod listed again"
	}
	return "the watch resumes"
}

// ResyncRows are the resync cases that were measured.
func (r liveRun) ResyncRows() []resyncResult {
	var rs []resyncResult
	for _, x := range []resyncResult{r.Resync, r.Relist} {
		if x.Probes > 0 {
			rs = append(rs, x)
		}
	}
	return rs
}

// liveStage runs the live stage on bin/coredns or, with -compare-coredns,
// in turns on each build (see turns); the first new turn is the stage's
// figures.
func liveStage(_ context.Context, b *harness.Program, res *results, w *world) {
	cfg := res.Cfg
	proxy := harness.StartProxy(b, w.a.APIServerAddr())
	res.Live = &liveResult{}
	ts := turns(cfg)
	if old := res.Old(); old != nil {
		res.Live.Compare = &compareResult{Old: old.Path, OldCommit: old.Commit}
	}
	for _, t := range ts {
		if len(ts) > 1 {
			b.Logf("turn %d of %d: %s build", t.N, cfg.CompareTurns, t.Build)
		}
		r := liveTurn(b, res, w, proxy, t.Bin, t.Tag)
		if c := res.Live.Compare; c != nil {
			r.Build, r.Turn = t.Build, t.N
			c.Runs = append(c.Runs, r)
		}
		if t.first() {
			res.Live.liveRun = r
		}
	}
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

// probeAnswers asks for the world's sample services, one every 2 ms, until
// the returned func is called, and counts into r every answer that is not
// the full, correct one.
func probeAnswers(c *contender, w *world, r *resyncResult) (stop func()) {
	var (
		done atomic.Bool
		wg   sync.WaitGroup
	)
	wg.Go(func() {
		for k := 0; !done.Load(); k++ {
			bad := check(c, w.ds, w.sample[k%len(w.sample)], dns.TypeA)
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
			time.Sleep(2 * time.Millisecond)
		}
	})
	return sync.OnceFunc(func() { done.Store(true); wg.Wait() })
}

// resync cuts the link between CoreDNS and the data cluster's API server,
// changes a Pod while cut, restores the link and times how long the change
// takes to show, while probeAnswers asks for names that exist throughout.
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
	ns, ip := "resync"+tag, "10.252.0.1"
	if restart {
		ns, ip = "relist"+tag, "10.252.0.2"
	}
	w.a.CreateNamespace(b, ns)
	pod := harness.ExporterPod("marker", "", harness.ExportService{Name: "before"})
	w.a.CreateReadyPods(b, ns, harness.ReadyPod{Pod: pod, IPs: []string{ip}})
	w.added++
	waitName(b, c, "before."+ns+".svc."+zone, ip, 60*time.Second)

	r := resyncResult{Endpoints: w.ds.total() + w.added, CutFor: cfg.CutFor, Restart: restart}
	// The prober counts into its own value, copied into r once it stopped.
	var probed resyncResult
	stopProbing := probeAnswers(c, w, &probed)
	defer stopProbing()

	heap, err := heapAlloc(c.pprof)
	if err != nil {
		b.Fatalf("CoreDNS's heap: %v", err)
	}
	r.Heap = heap
	proxy.Cut(b)
	cutAt := time.Now()
	w.a.SetPodAnnotation(b, ns, "marker", harness.ExportAnnotation, harness.ExportJSON(harness.ExportService{Name: "after"}))
	if restart {
		w.a.KillAPIServer(b, syscall.SIGKILL)
		started := time.Now()
		w.a.StartAPIServer(b)
		r.WarmUp = waitWatchCache(b, w.a, started)
	}
	time.Sleep(time.Until(cutAt.Add(cfg.CutFor)))
	r.CutFor = time.Since(cutAt)
	if m, err := c.d.Exchange(harness.Query{Name: "after." + ns + ".svc." + zone, Type: dns.TypeA}); err != nil || m.Rcode != dns.RcodeNameError {
		b.Fatalf("while cut, the change already shows (or no answer): %v %v", m, err)
	}
	accepted, received := proxy.Accepted(), proxy.Received()
	proc := c.d.Process()
	cpu0 := cpuOf(b, proc, w.a.APIServer())
	r.RSSBefore, err = proc.StatusBytes("VmRSS")
	if err == nil {
		r.AnonBefore, err = proc.StatusBytes("RssAnon")
	}
	if err == nil {
		err = proc.ResetPeakRSS()
	}
	if err != nil {
		b.Fatalf("CoreDNS's RSS: %v", err)
	}
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
	// The relist's allocations: an allocation profile before the restore and
	// one with the peak (2 s after the change showed), compared with go tool
	// pprof -base. A profile shows allocations up to the last GC.
	var allocsBefore []byte
	if restart {
		if allocsBefore, err = get("http://"+c.pprof+"/debug/pprof/allocs", 30*time.Second); err != nil {
			b.Logf("allocation profile before the relist: %v", err)
		}
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
	cpu1 := cpuOf(b, proc, w.a.APIServer())
	r.CPUCoreDNS, r.CPUAPIServer = cpu1[0]-cpu0[0], cpu1[1]-cpu0[1]
	r.Reconnect = <-reconnected
	time.Sleep(2 * time.Second) // keep probing after the resync
	stopProbing()
	r.Probes, r.ProbeWrong, r.ProbeErrors, r.FirstWrong = probed.Probes, probed.ProbeWrong, probed.ProbeErrors, probed.FirstWrong
	if ls := listedPods(c.d.Log()); len(ls) > listed {
		r.ListedPods = ls[len(ls)-1]
	}
	if r.RSSPeak, err = proc.StatusBytes("VmHWM"); err == nil {
		r.AnonAfter, err = proc.StatusBytes("RssAnon")
	}
	if err != nil {
		b.Fatalf("CoreDNS's peak RSS: %v", err)
	}
	if allocsBefore != nil {
		saveAllocs(b, c, cfg.Raw, "allocs-ours-relist"+tag, allocsBefore)
	}
	prof.Wait() // after the prober and the peak: both end 2 s after the change, in either row
	b.Logf("resync of %d endpoints after a %s cut (API server restarted: %v, its warm-up %s): %s (first new connection after %s; %.1f MB from the API server; CPU: CoreDNS %s, kube-apiserver %s; CoreDNS heap %.1f MB, RSS %.1f MB, peak %.1f MB, anonymous %.1f MB then %.1f MB); prober: %d queries, %d wrong (empty/NXDOMAIN/other), %d errors",
		r.Endpoints, r.CutFor.Round(time.Millisecond), restart, r.WarmUp.Round(time.Millisecond), r.Took.Round(time.Millisecond), r.Reconnect.Round(time.Millisecond), float64(r.Received)/1e6,
		r.CPUCoreDNS.Round(time.Millisecond), r.CPUAPIServer.Round(time.Millisecond), float64(r.Heap)/1e6, float64(r.RSSBefore)/1e6, float64(r.RSSPeak)/1e6, float64(r.AnonBefore)/1e6, float64(r.AnonAfter)/1e6, r.Probes, r.ProbeWrong, r.ProbeErrors)
	return r
}

// saveAllocs keeps the allocation profiles taken before and after a relist
// as name-before.pprof and name-after.pprof, and what the relist allocated
// (the difference, by allocated space) as name-after.top.txt.
func saveAllocs(b *harness.Program, c *contender, raw, name string, before []byte) {
	after, err := get("http://"+c.pprof+"/debug/pprof/allocs", 30*time.Second)
	if err != nil {
		b.Logf("allocation profile after the relist: %v", err)
		return
	}
	base, path := filepath.Join(raw, name+"-before.pprof"), filepath.Join(raw, name+"-after.pprof")
	if err := os.WriteFile(base, before, 0o644); err != nil {
		b.Logf("allocation profile: %v", err)
		return
	}
	if _, err := saveProfile(context.Background(), after, c.binary(), path, []string{"-sample_index=alloc_space", "-base", base}); err != nil {
		b.Logf("allocation profile of the relist: %v", err)
	}
}

// relistProfile is how long the CPU profile of a relist runs from the restore.
const relistProfile = 15 * time.Second

// waitWatchCache waits until c's API server serves a watch of Pods from its
// watch cache, which a restarted API server fills from etcd first (meanwhile
// it answers such watches 429, or holds them), and returns the time since
// since. The watch's selector matches nothing: it lists no Pod.
func waitWatchCache(t harness.T, c *harness.Cluster, since time.Time) time.Duration {
	t.Helper()
	timeout := int64(1)
	opts := metav1.ListOptions{ResourceVersion: "0", LabelSelector: "mcs-bench-warm-check=none", TimeoutSeconds: &timeout, Watch: true}
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		cx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		// No retries inside client-go: it would sleep out each 429's Retry-After (1 s).
		w, err := c.WatchClient.CoreV1().RESTClient().Get().Resource("pods").
			VersionedParams(&opts, scheme.ParameterCodec).MaxRetries(0).Watch(cx)
		if last = err; err == nil {
			w.Stop()
		}
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("%s: the API server's watch cache does not serve Pods %s after its start: %v (%v)", c.Name, time.Since(since).Round(time.Second), last, err)
	}
	return time.Since(since)
}

// reListed matches the line our plugin logs when the data cluster's Pods
// were listed again (ingest's Relisted event).
var reListed = regexp.MustCompile(`cluster/` + clusterA + `: listed (\d+) Pods again`)

// listedPods are the Pod counts of every such line in a CoreDNS log.
func listedPods(log string) []int {
	var ns []int
	for _, m := range reListed.FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[1])
		ns = append(ns, n)
	}
	return ns
}

// Rows are the figures of the comparison.
func (c *compareResult) Rows() []compareRow {
	bytes := func(name string, f func(r liveRun) int64) figure[liveRun] {
		return figure[liveRun]{name, "MB", func(r liveRun) (float64, bool) { return float64(f(r)), r.Relist.Probes > 0 && f(r) > 0 }}
	}
	figures := []figure[liveRun]{
		durFigure("resync, the watch resumes", func(r liveRun) (time.Duration, bool) { return r.Resync.Took, r.Resync.Probes > 0 }),
		durFigure("resync, every Pod listed again", func(r liveRun) (time.Duration, bool) { return r.Relist.Took, r.Relist.Probes > 0 }),
		durFigure("of the list, until the first new connection", func(r liveRun) (time.Duration, bool) {
			return r.Relist.Reconnect, r.Relist.Probes > 0 && r.Relist.Reconnect >= 0
		}),
		durFigure("CoreDNS CPU time through the list", func(r liveRun) (time.Duration, bool) { return r.Relist.CPUCoreDNS, r.Relist.Probes > 0 }),
		bytes("CoreDNS heap before the list's cut (live sources, the data cluster and the peer)", func(r liveRun) int64 { return r.Relist.Heap }),
		bytes("CoreDNS peak RSS through the list", func(r liveRun) int64 { return r.Relist.RSSPeak }),
		bytes("CoreDNS anonymous RSS after the list", func(r liveRun) int64 { return r.Relist.AnonAfter }),
	}
	for _, side := range []string{"local", "peer"} {
		for _, q := range []float64{50, 99} {
			figures = append(figures, durFigure(fmt.Sprintf("propagation p%.0f, %s", q, side), func(r liveRun) (time.Duration, bool) {
				for _, p := range r.Prop {
					if p.Source == side && len(p.Lat) > 0 {
						return pct(p.Lat, q), true
					}
				}
				return 0, false
			}))
		}
	}
	return compareRows(c.Runs, func(r liveRun) string { return r.Build }, figures)
}

// Wrong sums the wrong answers of one build's resyncs, and their probes.
func (c *compareResult) Wrong(build string) string {
	var wrong, probes int
	for _, r := range c.Runs {
		if r.Build == build {
			wrong += r.Resync.ProbeWrong + r.Relist.ProbeWrong
			probes += r.Resync.Probes + r.Relist.Probes
		}
	}
	return fmt.Sprintf("%d of %d", wrong, probes)
}
