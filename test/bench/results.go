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

// results is what a run measured, one struct per stage (nil when the stage
// did not run): the run's results.json and the report's only input.
type results struct {
	Cfg      config
	Root     string
	Started  time.Time
	Took     time.Duration
	Machine  machineInfo
	Stages   []stageTime
	Failures []string
	OldBuild *oldBuild `json:",omitempty"` // -compare-coredns

	GoBench []string     // the Go benchmarks' result lines
	Cold    *coldResult  // cold start from a snapshot
	Probe   *probeResult // failover and the cost of probing
	Data    *dataResult  // the clusters and data of the dns, instr and live stages
	DNS     *dnsResult   // QPS, latency, memory of the three contenders
	Instr   instrPoints  // instructions per answer under callgrind
	Live    *liveResult  // propagation and resync
	MCS     *mcsResult   // the MCS controller over three clusters
	Soak    *soakReport  // a make soak run's summary, when given
	Relay   *soakReport  // a make bench-relay run's summary, when given
}

type stageTime struct {
	Name string
	Took time.Duration
	OK   bool
}

// dataResult says how long starting the clusters and loading the data took.
type dataResult struct {
	ClustersTook          time.Duration
	Pods, Imports, Slices int
	PodsTook, MCSTook     time.Duration
}

// PodRate is the exporter Pods created per second.
func (d *dataResult) PodRate() float64 { return float64(d.Pods) / math.Max(d.PodsTook.Seconds(), 1e-9) }

// dnsResult is the dns stage: the three contenders side by side.
type dnsResult struct {
	Sync       []syncPoint     // start to every sample answered
	Points     map[string]runs // "mode/qtype/contender" -> dnsperf runs
	Latency    map[string]perf // "qtype/contender" -> the fixed-rate run
	Mems       []memPoint
	ProfileTop string // go tool pprof -top of ours under an A load
	NewStack   []newStackShare
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

type newStackShare struct {
	Contender string
	Percent   float64 // of the CPU profile, cumulative
}

// Runs are the dnsperf runs of a point, none when it was not measured.
func (d *dnsResult) Runs(mode, qtype, name string) runs { return d.Points[mode+"/"+qtype+"/"+name] }

func (d *dnsResult) add(mode, qtype, name string, p perf) {
	if d.Points == nil {
		d.Points = map[string]runs{}
	}
	k := mode + "/" + qtype + "/" + name
	d.Points[k] = append(d.Points[k], p)
}

// LatencyOf is a fixed-rate latency point, nil when not measured.
func (d *dnsResult) LatencyOf(qtype, name string) *perf {
	if p, ok := d.Latency[qtype+"/"+name]; ok {
		return &p
	}
	return nil
}

// LivePerEndpoint is our plugin's heap per endpoint with live sources: the
// heap with the data less the heap watching an empty cluster; NaN when not
// measured.
func (r *results) LivePerEndpoint() float64 { return r.livePerEndpoint(ours) }

// OldLivePerEndpoint is LivePerEndpoint of the old build (-compare-coredns).
func (r *results) OldLivePerEndpoint() float64 { return r.livePerEndpoint(oursOld) }

func (r *results) livePerEndpoint(name string) float64 {
	if r.Data == nil || r.Data.Pods == 0 {
		return math.NaN()
	}
	a, e := r.Mem(name, "loaded"), r.Mem(name+" (empty)", "loaded")
	if a == nil || e == nil {
		return math.NaN()
	}
	return float64(a.Heap-e.Heap) / float64(r.Data.Pods)
}

// Mems are every memory point, the dns stage's and the cold start's.
func (r *results) Mems() []memPoint {
	var ms []memPoint
	if r.DNS != nil {
		ms = append(ms, r.DNS.Mems...)
	}
	if r.Cold != nil {
		ms = append(ms, r.Cold.Mems...)
	}
	return ms
}

// Mem is a memory point, nil when not measured.
func (r *results) Mem(name, when string) *memPoint {
	for _, m := range r.Mems() {
		if m.Contender == name && m.When == when {
			return &m
		}
	}
	return nil
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

func machine(root string) machineInfo {
	m := machineInfo{CPUs: runtime.NumCPU(), Date: time.Now().UTC(), GoVersion: runtime.Version(), LoadStart: loadavg(), Commit: commitOf(root)}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if mm := regexp.MustCompile(`(?m)^model name\s*:\s*(.+)$`).FindSubmatch(b); mm != nil {
			m.CPUModel = strings.TrimSpace(string(mm[1]))
		}
	}
	if out, _ := exec.Command("dnsperf", "-h").CombinedOutput(); len(out) > 0 {
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
	b, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

// commitOf is the commit checked out in the git tree holding dir (with a
// note when the tree has uncommitted changes), "unknown" outside one.
func commitOf(dir string) string {
	out, err := exec.Command("git", "-C", dir, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown (not in a git tree)"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", dir, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		c += " (with uncommitted changes in the tree)"
	}
	return c
}

// checkSane records a failure for any figure that cannot be right: the
// smoke run's test of the whole program (no timing thresholds).
func checkSane(r *results) {
	bad := func(format string, args ...any) { r.Failures = append(r.Failures, fmt.Sprintf(format, args...)) }
	// each calls f for every contender and query type it answers.
	each := func(f func(q, c string)) {
		for _, q := range []string{"A", "SRV"} {
			for _, c := range []string{ours, hosts, intree} {
				if q != "SRV" || c != hosts {
					f(q, c)
				}
			}
		}
	}
	checkRuns := func(what string, ps runs) {
		if len(ps) != r.Cfg.Runs {
			bad("%s: %d dnsperf runs, want %d", what, len(ps), r.Cfg.Runs)
		}
		for _, p := range ps {
			// CoreDNS worked during the run, on at most every CPU.
			if !(p.QPS > 0) || p.Completed == 0 || p.CPU <= 0 || p.Took <= 0 || p.CPU.Seconds() > 1.05*p.Took.Seconds()*float64(runtime.NumCPU()) {
				bad("%s: QPS %.0f, %d completed, CoreDNS CPU %s in a run of %s", what, p.QPS, p.Completed, p.CPU, p.Took)
			}
			if !strings.HasPrefix(p.Rcodes, "NOERROR") || strings.Contains(p.Rcodes, "NXDOMAIN") || strings.Contains(p.Rcodes, "SERVFAIL") {
				bad("%s: response codes %q, want NOERROR only", what, p.Rcodes)
			}
		}
	}
	if d := r.DNS; d == nil {
		bad("dns: not measured")
	} else {
		each(func(q, c string) {
			for _, mode := range []string{"pinned", "unpinned"} {
				checkRuns(mode+" "+q+" "+c, d.Runs(mode, q, c))
			}
			if p := d.LatencyOf(q, c); p == nil || len(p.Latencies) == 0 || !(percentile(p.Latencies, 50) > 0) || percentile(p.Latencies, 99) < percentile(p.Latencies, 50) {
				bad("latency %s %s: missing or no samples", q, c)
			}
		})
		if d.ProfileTop == "" {
			bad("no CPU profile")
		}
		for _, c := range []string{ours, hosts, intree} {
			if m := r.Mem(c, "loaded"); m == nil || m.Heap <= 0 || m.RSS <= 0 {
				bad("no heap/RSS for %s", c)
			}
		}
		if r.Cfg.CompareCoreDNS != "" {
			qs := d.CompareQPS()
			for _, q := range qs {
				checkRuns(q.Mode+" "+q.QType+" "+oursOld, q.Old)
			}
			if len(qs) != 4 || math.IsNaN(r.OldLivePerEndpoint()) {
				bad("dns compared: %d of 4 points of %s, its heap per endpoint %s", len(qs), oursOld, num(r.OldLivePerEndpoint()))
			}
		}
	}
	if c := r.Cold; c == nil || len(c.Runs) != r.Cfg.ColdRuns || len(c.EmptyRuns) != r.Cfg.ColdRuns || c.HeapLoaded <= c.HeapEmpty {
		bad("cold start: incomplete")
	}
	if c := r.Cold; c != nil && r.Cfg.CompareCoreDNS != "" {
		if c.Compare == nil || len(c.Compare.Runs) != 2*r.Cfg.CompareTurns {
			bad("cold start compared: not %d turns", 2*r.Cfg.CompareTurns)
		} else {
			for _, run := range c.Compare.Runs {
				if len(run.Runs) != r.Cfg.ColdRuns || len(run.EmptyRuns) != r.Cfg.ColdRuns || run.HeapLoaded <= run.HeapEmpty || run.Loaded != c.Endpoints {
					bad("cold start compared, %s build turn %d: incomplete", run.Build, run.Turn)
				}
			}
		}
	}
	if l := r.Live; l == nil || len(l.Prop) != 2 {
		bad("propagation: not measured from both sources")
	} else {
		for _, p := range l.Prop {
			if len(p.Lat) != r.Cfg.Changes {
				bad("propagation %s: %d changes, want %d", p.Source, len(p.Lat), r.Cfg.Changes)
			}
		}
		if l.Resync.Took <= 0 || l.Resync.Probes == 0 {
			bad("resync: not measured")
		}
		if rl := l.Relist; rl.Took <= 0 || rl.Probes == 0 || rl.WarmUp <= 0 {
			bad("resync after an API server restart: not measured (or its warm-up)")
		} else if rl.ListedPods != rl.Endpoints {
			bad("resync after an API server restart: CoreDNS's log says it listed %d Pods again, want all %d", rl.ListedPods, rl.Endpoints)
		}
		if c := l.Compare; c != nil && len(c.Runs) != 2*r.Cfg.CompareTurns {
			bad("compare: %d live runs, want %d", len(c.Runs), 2*r.Cfg.CompareTurns)
		}
	}
	each(func(q, c string) {
		n := 0
		for _, p := range r.Instr {
			if p.QType != q || p.Contender != c {
				continue
			}
			n++
			// An answer takes more than a thousand instructions and fewer
			// than a hundred million, and at least one heap allocation (the
			// reply); every query was answered; stack growth, which each
			// query's goroutine does with the GC off (it starts at the
			// smallest stack), is a part of the whole.
			if pa := p.PerAnswer(); p.Lost > 0 || !(pa > 1e3 && pa < 1e8) || p.StackGrowth <= 0 || p.StackGrowth >= p.Instr ||
				p.Allocs < int64(p.Answers) || p.AllocBytes <= 0 {
				bad("callgrind %s %s run %d: %d answers, %d lost, %.0f instructions per answer (%d of %d growing stacks), %d allocations of %d B",
					q, c, p.Run, p.Answers, p.Lost, pa, p.StackGrowth, p.Instr, p.Allocs, p.AllocBytes)
			}
		}
		if n != r.Cfg.InstrRuns {
			bad("callgrind %s %s: %d counted runs, want %d", q, c, n, r.Cfg.InstrRuns)
		}
	})
	if r.Cfg.GoBench && len(r.GoBench) == 0 {
		bad("no Go benchmark output")
	}
	if p := r.Probe; p == nil || len(p.Failover) != r.Cfg.ProbeRepeats {
		bad("probe failover: not measured %d times", r.Cfg.ProbeRepeats)
	} else {
		checkRuns("probe on", p.On)
		checkRuns("probe off", p.Off)
		if p.Rounds() < 1 || p.CPUOn <= 0 || p.WrongAfter > 0 {
			bad("probe cost: %.1f rounds, CPU %s, %d services wrong after", p.Rounds(), p.CPUOn, p.WrongAfter)
		}
	}
	if m := r.MCS; m == nil || len(m.Lat) == 0 || m.HeapPerEndpoint <= 0 {
		bad("MCS controller: not measured")
	}
}
