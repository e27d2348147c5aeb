package main

// Propagation of one origin's change (the target) beside the change
// of one Pod that many origins share, and where the time of each goes.
//
// Every origin API server carries, beside the dataset, one "solo" Pod whose
// export names the first origin read from it (a cluster field): that peer
// name takes it, every other peer name reading the same API server refuses
// it (annotation.ReasonClusterOutside), so flipping it changes one origin.

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// soloService is the dataset service a solo Pod exports (in its namespace).
const soloService = 0

// quietGap is the pause before each timed flip. A hub paces the writes of
// one service (its MCS controller's damping: written again within twice
// Damp, one second by default, more than three times in a row, it waits
// twice as long each time), and every timed flip is of service 0: without
// the pause, flips following each other within two seconds would time the
// damping of a service that keeps changing, not one change.
const quietGap = 2500 * time.Millisecond

// soloPod is the name of the solo Pod on API server k.
func soloPod(k int) string { return fmt.Sprintf("solo-%s", originName(k)) }

// soloIP is the solo Pod's address on API server k: past every dataset
// endpoint.
func (w *relayWorld) soloIP(k int) string { return w.ds.ip(w.ds.services, k).String() }

// soloName is the per-endpoint name of API server k's solo Pod in origin i.
func (w *relayWorld) soloName(k, i int) string {
	return strings.ReplaceAll(w.soloIP(k), ".", "-") + "." + originName(i) + "." + w.ds.service(soloService) + "." + w.ds.namespace(soloService) + ".svc." + zone
}

// createSolo creates API server k's solo Pod, ready.
func (w *relayWorld) createSolo(t harness.T, k int) {
	svc := w.ds.exportService(soloService)
	svc.Cluster = originName(k)
	w.origins[k].CreateReadyPods(t, w.ds.namespace(soloService), harness.ReadyPod{Pod: harness.ExporterPod(soloPod(k), "", svc), IPs: []string{w.soloIP(k)}})
}

// checkSolo asks the solo Pod of API server k in origin i: "" when the
// answer is right (its address while ready, only in origin k; nothing in
// any other origin, which refuses it).
func (w *relayWorld) checkSolo(d *harness.CoreDNS, k, i int, ready bool) string {
	name := w.soloName(k, i)
	m, err := d.Exchange(harness.Query{Name: name, Type: 1, Timeout: time.Second})
	if err != nil {
		return name + ": " + err.Error()
	}
	got := harness.Addrs(m)
	if ready && i == k {
		if len(got) != 1 || got[0] != w.soloIP(k) {
			return fmt.Sprintf("%s: %s %v, want %s", name, harness.Rcode(m), got, w.soloIP(k))
		}
		return ""
	}
	if len(got) != 0 {
		return fmt.Sprintf("%s: %v, want none", name, got)
	}
	return ""
}

// waitSolo polls until the solo Pod of API server k answers as ready says
// in origin k.
func (w *relayWorld) waitSolo(t harness.T, d *harness.CoreDNS, k int, ready bool, bound time.Duration) {
	deadline := time.Now().Add(bound)
	for {
		bad := w.checkSolo(d, k, k, ready)
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("edge: %s after %s", bad, bound)
		}
		time.Sleep(time.Millisecond)
	}
}

// sliceWatch notes, on each hub, when the relay slices of the watched
// service were first written after a mark, by origin.
type sliceWatch struct {
	mu     sync.Mutex
	mark   time.Time
	first  []map[string]time.Time // per hub: origin -> first write after mark
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// watchSlices starts watching every hub's relay slices of the solo service.
func (w *relayWorld) watchSlices(t harness.T) *sliceWatch {
	ctx, cancel := context.WithCancel(context.Background())
	sw := &sliceWatch{cancel: cancel}
	sel := labels.Set{discoveryv1.LabelManagedBy: clusterset.ManagedBy, mcsv1beta1.LabelServiceName: w.ds.service(soloService)}.String()
	for k, h := range w.hubs {
		sw.first = append(sw.first, map[string]time.Time{})
		wi, err := h.WatchClient.DiscoveryV1().EndpointSlices(w.ds.namespace(soloService)).Watch(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			cancel()
			t.Fatalf("%s: watching relay slices: %v", h.Name, err)
		}
		sw.wg.Go(func() {
			defer wi.Stop()
			for ev := range wi.ResultChan() {
				at := time.Now()
				if ev.Type != watch.Added && ev.Type != watch.Modified {
					continue
				}
				s, ok := ev.Object.(*discoveryv1.EndpointSlice)
				if !ok {
					continue
				}
				o := s.Labels[mcsv1beta1.LabelSourceCluster]
				sw.mu.Lock()
				if _, seen := sw.first[k][o]; !seen && !sw.mark.IsZero() {
					sw.first[k][o] = at
				}
				sw.mu.Unlock()
			}
		})
	}
	return sw
}

// reset marks the start of a change: later writes count.
func (sw *sliceWatch) reset(at time.Time) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	sw.mark = at
	for k := range sw.first {
		sw.first[k] = map[string]time.Time{}
	}
}

// hubTook is how long after the mark the first hub had written the slices
// of every origin in is (0 when none has yet).
func (sw *sliceWatch) hubTook(is []int) time.Duration {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	best := time.Duration(0)
	for _, m := range sw.first {
		var last time.Time
		all := true
		for _, i := range is {
			at, ok := m[originName(i)]
			if !ok {
				all = false
				break
			}
			if at.After(last) {
				last = at
			}
		}
		if all && (best == 0 || last.Sub(sw.mark) < best) {
			best = last.Sub(sw.mark)
		}
	}
	return best
}

func (sw *sliceWatch) stop() {
	sw.cancel()
	sw.wg.Wait()
}

// processCPU is a group of processes whose CPU time is read together.
type processCPU struct {
	Name  string
	procs []*harness.Process
}

// cpuGroups are the processes a change crosses: the edge, the hub
// controllers, the hubs' API servers (with etcd) and the origins'.
func (w *relayWorld) cpuGroups() []processCPU {
	g := []processCPU{{Name: "edge CoreDNS", procs: []*harness.Process{w.edge.d.Process()}}, {Name: "hub controllers"}, {Name: "hub API servers + etcd"}, {Name: "origin API servers + etcd"}}
	for k, h := range w.hubs {
		g[1].procs = append(g[1].procs, w.ctl[k].Process())
		g[2].procs = append(g[2].procs, h.APIServer(), h.Etcd())
	}
	for _, o := range w.origins {
		g[3].procs = append(g[3].procs, o.APIServer(), o.Etcd())
	}
	return g
}

// cpuNow is the CPU time of each group.
func cpuNow(t harness.T, gs []processCPU) []time.Duration {
	out := make([]time.Duration, len(gs))
	for i, g := range gs {
		for _, d := range cpuOf(t, g.procs...) {
			out[i] += d
		}
	}
	return out
}

// cpuShare is one group's CPU time per change.
type cpuShare struct {
	Name    string
	PerFlip time.Duration
}

// cpuMeter counts each group's CPU time while changes are under way (from
// a flip until the edge answers it) and while all is quiet (the gaps
// between flips), so that a change's share is what it adds to the idle
// rate (Leases, health checks, the edge's questions excepted).
type cpuMeter struct {
	t          harness.T
	gs         []processCPU
	busy, idle []time.Duration
	busyFor    time.Duration
	idleFor    time.Duration
	flips      int
}

func newCPUMeter(t harness.T, gs []processCPU) *cpuMeter {
	return &cpuMeter{t: t, gs: gs, busy: make([]time.Duration, len(gs)), idle: make([]time.Duration, len(gs))}
}

// quiet sleeps d, counting it as idle.
func (m *cpuMeter) quiet(d time.Duration) {
	c0, t0 := cpuNow(m.t, m.gs), time.Now()
	time.Sleep(d)
	c1 := cpuNow(m.t, m.gs)
	m.idleFor += time.Since(t0)
	for i := range c1 {
		m.idle[i] += c1[i] - c0[i]
	}
}

// flip runs f, one change until the edge answers it, counting it as busy.
func (m *cpuMeter) flip(f func()) {
	c0, t0 := cpuNow(m.t, m.gs), time.Now()
	f()
	c1 := cpuNow(m.t, m.gs)
	m.busyFor += time.Since(t0)
	m.flips++
	for i := range c1 {
		m.busy[i] += c1[i] - c0[i]
	}
}

// shares is each group's CPU time per change beyond its idle rate.
func (m *cpuMeter) shares() []cpuShare {
	out := make([]cpuShare, len(m.gs))
	for i, g := range m.gs {
		extra := m.busy[i]
		if m.idleFor > 0 {
			extra -= time.Duration(float64(m.idle[i]) * float64(m.busyFor) / float64(m.idleFor))
		}
		out[i] = cpuShare{g.Name, max(0, extra) / time.Duration(max(1, m.flips))}
	}
	return out
}

// clusterMismatches sums the hubs' refusals of export entries for a cluster
// field other than the peer name (mcs_controller_rejected_annotations_total).
func (w *relayWorld) clusterMismatches(t harness.T) int {
	n := 0.0
	for _, a := range w.ctl {
		fams, err := a.Metrics()
		if err != nil {
			t.Fatalf("hub metrics: %v", err)
		}
		f := fams["mcs_controller_rejected_annotations_total"]
		if f == nil {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelIs(m, "reason", string(annotation.ReasonClusterOutside)) {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return int(n)
}

func labelIs(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}

// relaySolo times flips of the solo Pods: one origin's change, origin ->
// hub -> edge; it checks that the other origins of each API server refuse
// them, and counts what the refusals and the flips cost.
func relaySolo(b *harness.Program, r *relayResult, w *relayWorld) {
	// Refused by the peers of the other names, each once (when the Pod
	// came): the flips add none.
	r.SoloRefused = w.clusterMismatches(b)
	for k := range w.origins {
		for _, i := range w.watched(k) {
			if bad := w.checkSolo(w.edge.d, k, i, true); bad != "" {
				b.Errorf("single-origin Pod: %s", bad)
			}
		}
	}
	sw := w.watchSlices(b)
	defer sw.stop()
	cpu := newCPUMeter(b, w.cpuGroups())
	ready := make([]bool, len(w.origins))
	for k := range ready {
		ready[k] = true
	}
	before := received(w.links)
	for n := 0; n < w.cfg.Changes; n++ {
		k := n % len(w.origins)
		ready[k] = !ready[k]
		cpu.quiet(quietGap)
		cpu.flip(func() {
			start := time.Now()
			sw.reset(start)
			w.origins[k].SetPodReady(b, w.ds.namespace(soloService), soloPod(k), ready[k], w.soloIP(k))
			w.waitSolo(b, w.edge.d, k, ready[k], time.Minute)
			r.Solo = append(r.Solo, time.Since(start))
			r.SoloHub = append(r.SoloHub, sw.hubTook([]int{k}))
		})
	}
	r.SoloCPU = cpu.shares()
	r.SoloBytes = received(w.links) - before
	r.SoloRefusedAfter = w.clusterMismatches(b) - r.SoloRefused
	// Back ready, and never answered in another origin.
	for k := range ready {
		if !ready[k] {
			w.origins[k].SetPodReady(b, w.ds.namespace(soloService), soloPod(k), true, w.soloIP(k))
			w.waitSolo(b, w.edge.d, k, true, time.Minute)
		}
		for _, i := range w.watched(k) {
			if bad := w.checkSolo(w.edge.d, k, i, true); bad != "" {
				b.Errorf("single-origin Pod: %s", bad)
			}
		}
	}
	b.Logf("single-origin propagation: %d flips, p50 %s, p99 %s (first hub's slice: p50 %s, p99 %s); %d refusals of the solo Pods at the hubs, %d more over the flips; CPU per flip %v",
		len(r.Solo), pct(r.Solo, 50), pct(r.Solo, 99), pct(r.SoloHub, 50), pct(r.SoloHub, 99), r.SoloRefused, r.SoloRefusedAfter, r.SoloCPU)
}

// relayEdgeProfile takes a CPU profile of the edge while Pods shared by
// every origin of an API server flip back to back, each flip of another
// service than the last (the hubs damp a service that keeps changing), the
// edge asked every 10 ms (so that the profile shows the changes more than
// the questions).
func relayEdgeProfile(b *harness.Program, r *relayResult, w *relayWorld) {
	const d = 10 * time.Second
	path := filepath.Join(w.cfg.Out, "cpu-edge-flips.pprof")
	var (
		top string
		err error
		wg  sync.WaitGroup
	)
	start := time.Now()
	wg.Go(func() { top, err = cpuProfile(context.Background(), w.edge.pprof, w.edge.binary(), path, d) })
	flips := 0
	for time.Since(start) < d {
		n := flips
		s, k := n%w.ds.services, (n/w.ds.services)%len(w.origins)
		j := (n / (w.ds.services * len(w.origins))) % w.ds.endpoints
		w.setReady(b, k, s, j, !w.wantReady(k, s, j))
		deadline := time.Now().Add(time.Minute)
		for _, i := range w.watched(k) {
			for {
				bad, _ := w.checkEp(w.edge.d, i, s, j)
				if bad == "" {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("edge: %s after a minute", bad)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		flips++
	}
	wg.Wait()
	if err != nil {
		b.Logf("edge CPU profile: %v", err)
		return
	}
	r.ProfileFlips = flips
	r.ProfileTop = top
	b.Logf("edge CPU profile over %d flips (each in %d origins):\n%s", flips, r.PerFlip, top)
}

// soloMarkdown is relay.md's section on where a change's time goes.
func soloMarkdown(p func(string, ...any), r *relayResult) {
	if len(r.Solo) == 0 && len(r.Prop) == 0 {
		return
	}
	hubs := 2
	p("Where a change's time goes (the first hub's relay slice of the watched origins written, as a watch on the hub's API server sees it; the edge answering; CPU time of each group of processes per change beyond its idle rate, from the flip until the edge answers, the edge's asking every millisecond included):\n\n")
	cols := r.SoloCPU
	if len(cols) == 0 {
		cols = r.PropCPU
	}
	p("| change | first hub's slice, p50 / p99 | edge answers, p50 / p99 | bytes per hub link |")
	for _, s := range cols {
		p(" CPU: %s |", s.Name)
	}
	p("\n|---|---|---|---|%s\n", strings.Repeat("---|", len(cols)))
	row := func(what string, hub, edge []time.Duration, bytes int64, cpu []cpuShare) {
		if len(edge) == 0 {
			return
		}
		p("| %s | %s / %s | %s / %s | %d B |", what, ms(pct(hub, 50)), ms(pct(hub, 99)), ms(pct(edge, 50)), ms(pct(edge, 99)), bytes/int64(max(1, len(edge)))/int64(hubs))
		for i := range cols {
			v := "—"
			if i < len(cpu) {
				v = ms(cpu[i].PerFlip)
			}
			p(" %s |", v)
		}
		p("\n")
	}
	row("one origin's Pod", r.SoloHub, r.Solo, r.SoloBytes, r.SoloCPU)
	row(fmt.Sprintf("one Pod in %d origins", r.PerFlip), r.PropHub, r.Prop, r.PropBytes, r.PropCPU)
	p("\n")
	if len(r.Solo) == 0 {
		return
	}
	p("The single-origin Pods (one per origin API server, its export naming the first origin read from it) are refused by the other peer names that read the same API server: %d refusals (cluster_mismatch) counted by the hubs when they came, %d more over the %d flips.\n\n",
		r.SoloRefused, r.SoloRefusedAfter, len(r.Solo))
}
