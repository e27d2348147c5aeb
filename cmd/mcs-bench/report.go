package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// results is everything measured, for the report.
type results struct {
	Cfg     config
	Root    string
	Started time.Time
	Took    time.Duration
	Machine machineInfo

	Stages   []stageTime
	Failures []string

	ClustersTook time.Duration
	Create       createStats
	Sync         []syncPoint
	Throughput   map[string][]perf // mode/qtype/contender -> runs
	Latency      map[string]perf   // qtype/contender
	Mems         []memPoint
	ProfileTop   string
	NewStack     []newStackShare
	GoBench      []string
	Cold         *coldResult
	Instr        []instrPoint
	Prop         []propResult
	Resync       resyncResult // the watch resumes
	Relist       resyncResult // the API server restarted while cut: every Pod listed again
	Probe        *probeResult
	Compare      *compareResult // the live stage in turns against an older build
	MCS          *mcsResult     // the MCS controller (mcs.go)
	Soak         *soakReport    // a make soak run's summary, when given
}

type stageTime struct {
	Name string
	Took time.Duration
	OK   bool
}

type newStackShare struct {
	Contender string
	Percent   float64 // of the CPU profile, cumulative
}

type syncPoint struct {
	Mode, Contender string
	Took            time.Duration
}

type memPoint struct {
	Contender, When string
	Heap, RSS       int64
	Top             string // go tool pprof -top of the in-use heap (ours only)
}

type coldResult struct {
	Endpoints, Services, Loaded         int
	FileBytes                           int64
	WriteTook                           time.Duration
	HeapEmpty, HeapLoaded, HeapRendered int64
	Runs                                []time.Duration
	EmptyRuns                           []time.Duration // the same start with an empty snapshot, just before each of Runs
	Perf                                string          // perf report of one more cold start
}

// snapshotShare is the median of each cold start's time less the empty start
// timed just before it: the cost of loading the snapshot, with the machine's
// speed of the moment mostly taken out.
func (c *coldResult) snapshotShare() (time.Duration, bool) {
	if len(c.Runs) == 0 || len(c.EmptyRuns) != len(c.Runs) {
		return 0, false
	}
	d := make([]time.Duration, len(c.Runs))
	for i := range c.Runs {
		d[i] = c.Runs[i] - c.EmptyRuns[i]
	}
	return pct(d, 50), true
}

// PerEndpoint is a heap figure less the empty heap, per endpoint.
func (c *coldResult) PerEndpoint(heap int64) float64 {
	return float64(heap-c.HeapEmpty) / float64(c.Endpoints)
}

// SnapshotShare is snapshotShare for the report (0 when unpaired).
func (c *coldResult) SnapshotShare() time.Duration {
	d, _ := c.snapshotShare()
	return d
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

// Kind names the case, as the report's rows say it.
func (rs resyncResult) Kind() string {
	if rs.Restart {
		return "API server restarted while cut: every Pod listed again"
	}
	return "the watch resumes"
}

func (r *results) setSync(mode, name string, d time.Duration) {
	r.Sync = append(r.Sync, syncPoint{mode, name, d})
}

func (r *results) addQPS(mode, qtype, name string, p perf) {
	if r.Throughput == nil {
		r.Throughput = map[string][]perf{}
	}
	k := mode + "/" + qtype + "/" + name
	r.Throughput[k] = append(r.Throughput[k], p)
}

func (r *results) addLatency(qtype, name string, p perf) {
	if r.Latency == nil {
		r.Latency = map[string]perf{}
	}
	r.Latency[qtype+"/"+name] = p
}

// QPS is the median QPS of a point, NaN when it was not measured.
func (r *results) QPS(mode, qtype, name string) float64 {
	ps := r.Throughput[mode+"/"+qtype+"/"+name]
	if len(ps) == 0 {
		return math.NaN()
	}
	xs := make([]float64, len(ps))
	for i, p := range ps {
		xs[i] = p.QPS
	}
	return median(xs)
}

// Runs are the QPS of every run of a point, for the report.
func (r *results) Runs(mode, qtype, name string) []perf { return r.Throughput[mode+"/"+qtype+"/"+name] }

// Instructions is the median over a contender's counted callgrind runs of a
// per-answer figure: "all" instructions, "stack" (growing stacks), "nostack"
// (the rest), "bytes" or "allocs" of the heap; NaN when not measured.
func (r *results) Instructions(qtype, name, which string) float64 {
	var xs []float64
	for _, p := range r.Instr {
		if p.QType == qtype && p.Contender == name && p.Answers > 0 {
			xs = append(xs, p.Figure(which))
		}
	}
	if len(xs) == 0 {
		return math.NaN()
	}
	return median(xs)
}

// InstrRange is the least and most instructions per answer of a
// contender's counted runs.
func (r *results) InstrRange(qtype, name string) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range r.Instr {
		if x.QType == qtype && x.Contender == name {
			lo, hi = math.Min(lo, x.PerAnswer()), math.Max(hi, x.PerAnswer())
		}
	}
	return fmt.Sprintf("%.0f-%.0f", lo, hi)
}

// CPU is the median CoreDNS CPU time per answered query of a point, in
// seconds; NaN when not measured.
func (r *results) CPU(mode, qtype, name string) float64 {
	x, _ := r.cpuPerAnswer(mode, qtype, name)
	return x
}

// Busy is the median share of a point's wall time that CoreDNS was on a CPU.
func (r *results) Busy(mode, qtype, name string) float64 {
	_, b := r.cpuPerAnswer(mode, qtype, name)
	return b
}

func (r *results) cpuPerAnswer(mode, qtype, name string) (perAnswer, busy float64) {
	ps := r.Throughput[mode+"/"+qtype+"/"+name]
	var xs, bs []float64
	for _, p := range ps {
		if p.CPU > 0 && p.Completed > 0 && p.Took > 0 {
			xs = append(xs, p.CPUPerAnswer().Seconds())
			bs = append(bs, p.CPU.Seconds()/p.Took.Seconds())
		}
	}
	if len(xs) == 0 {
		return math.NaN(), math.NaN()
	}
	return median(xs), median(bs)
}

// Mem is a memory point, nil when not measured.
func (r *results) Mem(name, when string) *memPoint {
	for i, m := range r.Mems {
		if m.Contender == name && m.When == when {
			return &r.Mems[i]
		}
	}
	return nil
}

// LivePerEndpoint is our plugin's heap per endpoint with live sources: the
// heap with the data less the heap watching an empty cluster; NaN when not
// measured.
func (r *results) LivePerEndpoint() float64 {
	a, e := r.Mem(ours, "loaded"), r.Mem(ours+" (empty)", "loaded")
	if a == nil || e == nil || r.Create.Pods == 0 {
		return math.NaN()
	}
	return float64(a.Heap-e.Heap) / float64(r.Create.Pods)
}

func pct(ds []time.Duration, q float64) time.Duration {
	return time.Duration(percentile(durations(ds), q) * float64(time.Second)).Round(100 * time.Microsecond)
}

// machineInfo describes where and when the run happened.
type machineInfo struct {
	CPUs       int
	CPUModel   string
	LoadStart  string
	LoadEnd    string
	Date       time.Time
	Commit     string
	GoVersion  string
	DNSPerf    string
	OtherHeavy []string // kube-apiservers and e2e test binaries not started by this run, at its start
	Busiest    string   // the processes using the most CPU at the start (ps)
}

func (m machineInfo) summary() string {
	return fmt.Sprintf("%d CPUs (%s), load %s, commit %s, %d other test processes", m.CPUs, m.CPUModel, m.LoadStart, m.Commit, len(m.OtherHeavy))
}

func machine(root string) machineInfo {
	m := machineInfo{CPUs: runtime.NumCPU(), Date: time.Now().UTC(), GoVersion: runtime.Version(), LoadStart: loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if mm := regexp.MustCompile(`(?m)^model name\s*:\s*(.+)$`).FindSubmatch(b); mm != nil {
			m.CPUModel = strings.TrimSpace(string(mm[1]))
		}
	}
	m.Commit = commitOf(root)
	if out, err := exec.Command("dnsperf", "-h").CombinedOutput(); err == nil || len(out) > 0 {
		if mm := regexp.MustCompile(`Version (\S+)`).FindSubmatch(out); mm != nil {
			m.DNSPerf = string(mm[1])
		}
	}
	if out, err := exec.Command("pgrep", "-fa", "kube-apiserver|e2e.test|harness.test").Output(); err == nil {
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] != strconv.Itoa(os.Getpid()) {
				m.OtherHeavy = append(m.OtherHeavy, f[0]+" "+f[1])
			}
		}
	}
	if out, err := exec.Command("ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers").Output(); err == nil {
		var top []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[1] != "ps" && len(top) < 5 {
				top = append(top, f[1]+" "+f[0]+"%")
			}
		}
		m.Busiest = strings.Join(top, ", ")
	}
	return m
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// checkSane records a failure for any figure that cannot be right: the
// smoke run's test of the whole program (no timing thresholds).
func checkSane(r *results) {
	bad := func(format string, args ...any) { r.Failures = append(r.Failures, fmt.Sprintf(format, args...)) }
	for _, mode := range []string{"pinned", "unpinned"} {
		for _, q := range []string{"A", "SRV"} {
			for _, c := range []string{ours, hosts, intree} {
				if q == "SRV" && c == hosts {
					continue
				}
				ps := r.Throughput[mode+"/"+q+"/"+c]
				if len(ps) != r.Cfg.Runs {
					bad("%s %s %s: %d dnsperf runs, want %d", mode, q, c, len(ps), r.Cfg.Runs)
					continue
				}
				for _, p := range ps {
					if !(p.QPS > 0) || p.Completed == 0 {
						bad("%s %s %s: QPS %.0f, %d completed", mode, q, c, p.QPS, p.Completed)
					}
					// CoreDNS worked during the run, on at most every CPU.
					if p.CPU <= 0 || p.Took <= 0 || p.CPU.Seconds() > 1.05*p.Took.Seconds()*float64(runtime.NumCPU()) {
						bad("%s %s %s: CoreDNS CPU %s in a run of %s", mode, q, c, p.CPU, p.Took)
					}
					if !strings.HasPrefix(p.Rcodes, "NOERROR") || strings.Contains(p.Rcodes, "NXDOMAIN") || strings.Contains(p.Rcodes, "SERVFAIL") {
						bad("%s %s %s: response codes %q, want NOERROR only", mode, q, c, p.Rcodes)
					}
				}
			}
		}
	}
	for k, p := range r.Latency {
		if len(p.Latencies) == 0 || !(percentile(p.Latencies, 50) > 0) || percentile(p.Latencies, 99) < percentile(p.Latencies, 50) {
			bad("latency %s: %d samples", k, len(p.Latencies))
		}
	}
	if len(r.Latency) != 5 {
		bad("%d latency points, want 5", len(r.Latency))
	}
	if r.ProfileTop == "" {
		bad("no CPU profile")
	}
	for _, c := range []string{ours, hosts, intree} {
		if m := r.Mem(c, "loaded"); m == nil || m.Heap <= 0 || m.RSS <= 0 {
			bad("no heap/RSS for %s", c)
		}
	}
	if r.Cold == nil || len(r.Cold.Runs) != r.Cfg.ColdRuns || len(r.Cold.EmptyRuns) != r.Cfg.ColdRuns || r.Cold.HeapLoaded <= r.Cold.HeapEmpty {
		bad("cold start: incomplete")
	}
	if len(r.Prop) != 2 {
		bad("propagation: %d sources measured, want 2", len(r.Prop))
	}
	for _, p := range r.Prop {
		if len(p.Lat) != r.Cfg.Changes {
			bad("propagation %s: %d changes, want %d", p.Source, len(p.Lat), r.Cfg.Changes)
		}
	}
	if r.Resync.Took <= 0 || r.Resync.Probes == 0 {
		bad("resync: not measured")
	}
	if r.Relist.Took <= 0 || r.Relist.Probes == 0 {
		bad("resync after an API server restart: not measured")
	} else if r.Relist.WarmUp <= 0 {
		bad("resync after an API server restart: the API server's warm-up not measured")
	} else if r.Relist.ListedPods != r.Relist.Endpoints {
		bad("resync after an API server restart: CoreDNS's log says it listed %d Pods again, want all %d", r.Relist.ListedPods, r.Relist.Endpoints)
	}
	for _, q := range []string{"A", "SRV"} {
		for _, c := range []string{ours, hosts, intree} {
			if q == "SRV" && c == hosts {
				continue
			}
			n := 0
			for _, p := range r.Instr {
				if p.QType != q || p.Contender != c {
					continue
				}
				n++
				// An answer takes more than a thousand instructions and
				// fewer than a hundred million, and at least one heap
				// allocation (the reply); every query was answered; stack
				// growth, which each query's goroutine does with the GC off
				// (it starts at the smallest stack), is a part of the whole.
				if pa := p.PerAnswer(); p.Lost > 0 || !(pa > 1e3 && pa < 1e8) || p.StackGrowth <= 0 || p.StackGrowth >= p.Instr ||
					p.Allocs < int64(p.Answers) || p.AllocBytes <= 0 {
					bad("callgrind %s %s run %d: %d answers, %d lost, %.0f instructions per answer (%d of %d growing stacks), %d allocations of %d B",
						q, c, p.Run, p.Answers, p.Lost, pa, p.StackGrowth, p.Instr, p.Allocs, p.AllocBytes)
				}
			}
			if n != r.Cfg.InstrRuns {
				bad("callgrind %s %s: %d counted runs, want %d", q, c, n, r.Cfg.InstrRuns)
			}
		}
	}
	if r.Cfg.GoBench && len(r.GoBench) == 0 {
		bad("no Go benchmark output")
	}
	if p := r.Probe; p == nil || len(p.Failover) != r.Cfg.ProbeRepeats {
		bad("probe failover: not measured %d times", r.Cfg.ProbeRepeats)
	} else if on, off := r.Runs("probe", "A", "on"), r.Runs("probe", "A", "off"); p.Rounds() < 1 || p.CPUOn <= 0 || len(on) != r.Cfg.Runs || len(off) != r.Cfg.Runs || p.WrongAfter > 0 {
		bad("probe cost: %.1f rounds, CPU %s, %d and %d QPS runs, %d services wrong after", p.Rounds(), p.CPUOn, len(on), len(off), p.WrongAfter)
	}
	if c := r.Compare; c != nil && len(c.Runs) != 2*r.Cfg.CompareTurns {
		bad("compare: %d live runs, want %d", len(c.Runs), 2*r.Cfg.CompareTurns)
	}
}

// LatencyOf is a fixed-rate latency point, nil when not measured.
func (r *results) LatencyOf(qtype, name string) *perf {
	if p, ok := r.Latency[qtype+"/"+name]; ok {
		return &p
	}
	return nil
}

// OursATop is our first counted A run with a callgrind listing, nil if none.
func (r *results) OursATop() *instrPoint {
	for i, x := range r.Instr {
		if x.Contender == ours && x.QType == "A" && x.Top != "" {
			return &r.Instr[i]
		}
	}
	return nil
}

// ResyncRows are the resync cases that were measured.
func (r *results) ResyncRows() []resyncResult {
	var rs []resyncResult
	for _, x := range []resyncResult{r.Resync, r.Relist} {
		if x.Probes > 0 {
			rs = append(rs, x)
		}
	}
	return rs
}
