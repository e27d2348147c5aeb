package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// Instructions per answer, counted by valgrind's callgrind while a
// contender answers the query file: unlike time, the count does not move
// with the machine's load. CoreDNS runs with GOGC=off, because a collector
// cycle falling into a run or not, and the start size of goroutine stacks
// the runtime adapts at each cycle, moved the count between runs; the
// collector's share is read from the heap bytes and allocations per answer.

// instrPoint is one counted pass of a contender over a query file.
type instrPoint struct {
	Contender, QType string
	Run              int
	Instr            int64  // instructions while the queries ran
	Answers          int    // queries answered (dnsperf's "completed")
	Lost             int    // queries not answered within dnsperf's timeout
	StackGrowth      int64  // of Instr, in the runtime's functions that grow goroutine stacks (their own instructions)
	AllocBytes       int64  // bytes the Go heap allocated during the run (TotalAlloc, from the pprof listener)
	Allocs           int64  // heap allocations during the run (Mallocs)
	Top              string // callgrind_annotate, the functions with the most instructions of their own
	Dump             string // the callgrind output file
}

// perAnswer divides a count of the run by the queries answered.
func (p instrPoint) perAnswer(n int64) float64 {
	if p.Answers == 0 {
		return 0
	}
	return float64(n) / float64(p.Answers)
}

// PerAnswer is the instructions per answered query.
func (p instrPoint) PerAnswer() float64 { return p.perAnswer(p.Instr) }

// Figure is one per-answer figure of the run: "all" instructions, "stack"
// (those growing stacks), "nostack" (the rest), heap "bytes" or "allocs".
func (p instrPoint) Figure(which string) float64 {
	switch which {
	case "all":
		return p.PerAnswer()
	case "stack":
		return p.perAnswer(p.StackGrowth)
	case "nostack":
		return p.perAnswer(p.Instr - p.StackGrowth)
	case "bytes":
		return p.perAnswer(p.AllocBytes)
	case "allocs":
		return p.perAnswer(p.Allocs)
	}
	panic("instrPoint.Figure: unknown figure " + which)
}

// instrPoints are every counted run.
type instrPoints []instrPoint

// Figure is the median over a contender's counted runs of a per-answer
// Figure; NaN when not measured.
func (ps instrPoints) Figure(qtype, name, which string) float64 {
	var xs []float64
	for _, p := range ps {
		if p.QType == qtype && p.Contender == name && p.Answers > 0 {
			xs = append(xs, p.Figure(which))
		}
	}
	if len(xs) == 0 {
		return math.NaN()
	}
	return median(xs)
}

// Range is the least and most instructions per answer of a contender's
// counted runs.
func (ps instrPoints) Range(qtype, name string) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range ps {
		if x.QType == qtype && x.Contender == name && x.Answers > 0 { // as Figure: a run with no answer has no figure
			lo, hi = math.Min(lo, x.PerAnswer()), math.Max(hi, x.PerAnswer())
		}
	}
	return fmt.Sprintf("%.0f-%.0f", lo, hi)
}

// OursATop is our first counted A run with a callgrind listing, nil if none.
func (ps instrPoints) OursATop() *instrPoint {
	for i, x := range ps {
		if x.Contender == ours && x.QType == "A" && x.Top != "" {
			return &ps[i]
		}
	}
	return nil
}

// instrRunBound bounds one counted run: valgrind runs CoreDNS tens of times
// slower than natively.
const instrRunBound = 10 * time.Minute

// instructions starts each contender under callgrind, one after the other,
// and counts the instructions of InstrRuns passes of about InstrQueries
// queries each, for A and for SRV, after one pass that is not counted (so
// that our plugin has rendered each answer once, as it does on a name's
// first query, and every contender's caches and pools are warm).
func instructions(ctx context.Context, b *harness.Program, res *results, w *world) {
	cfg := res.Cfg
	dir := harness.TempDir(b)
	passes := max(1, (cfg.InstrQueries+w.ds.services-1)/w.ds.services)
	for _, c := range w.contenders(b) {
		name := slug(c.Name)
		out := filepath.Join(cfg.Raw, "callgrind-"+name+".out")
		wrapper := callgrindWrapper(b, dir, name, out)
		// Valgrind takes a few seconds to start, and every list the
		// contender makes at start is slower by the same factor.
		took := c.start(b, wrapper, w.ds, w.sample, 5*startBound)
		pid := c.d.Process().PID()
		b.Logf("%s under callgrind (PID %d) answers every sample correctly %s after start", c.Name, pid, took.Round(time.Millisecond))
		func() {
			defer c.stop(b)
			defer c.keepLog(cfg.Raw, "callgrind-"+name)
			for _, qtype := range []string{"A", "SRV"} {
				if qtype == "SRV" && !c.SRV {
					continue
				}
				warm := filepath.Join(cfg.Raw, fmt.Sprintf("dnsperf-callgrind-%s-%s-warmup.txt", qtype, name))
				if _, err := runDNSPerf(ctx, dnsperfOpts{Port: c.d.Port, File: w.queries[qtype], Duration: instrRunBound,
					Clients: 1, Window: 20, Passes: 1, Raw: warm}); err != nil {
					b.Fatalf("%s %s warm-up under callgrind: %v", c.Name, qtype, err)
				}
				for run := 1; run <= cfg.InstrRuns; run++ {
					pt := countRun(ctx, b, c, w, cfg.Raw, qtype, run, passes, out)
					res.Instr = append(res.Instr, pt)
					b.Logf("callgrind %-4s %-24s run %d: %d answers (%d lost), %.0f instructions per answer (%.0f growing stacks); %.0f B and %.1f allocations per answer",
						qtype, c.Name, run, pt.Answers, pt.Lost, pt.PerAnswer(), pt.perAnswer(pt.StackGrowth), pt.perAnswer(pt.AllocBytes), pt.perAnswer(pt.Allocs))
				}
			}
		}()
	}
}

// countRun counts the instructions of one run of passes through the query
// file: counters zeroed and counting switched on just before dnsperf
// starts, off and dumped just after it ends.
func countRun(ctx context.Context, b *harness.Program, c *contender, w *world, raw, qtype string, run, passes int, out string) instrPoint {
	pid := c.d.Process().PID()
	tag := fmt.Sprintf("%s-%s-run%d", qtype, slug(c.Name), run)
	before := callgrindDumps(out)
	m0, err := memStats(c.pprof, false)
	if err != nil {
		b.Fatalf("%s: %v", c.Name, err)
	}
	callgrindControl(b, pid, "--zero")
	callgrindControl(b, pid, "--instr=on")
	p, err := runDNSPerf(ctx, dnsperfOpts{Port: c.d.Port, File: w.queries[qtype], Duration: instrRunBound,
		Clients: 1, Window: 20, Passes: passes, Raw: filepath.Join(raw, "dnsperf-callgrind-"+tag+".txt")})
	callgrindControl(b, pid, "--instr=off")
	callgrindControl(b, pid, "--dump="+tag)
	if err != nil {
		b.Fatalf("%s %s under callgrind: %v", c.Name, qtype, err)
	}
	m1, err := memStats(c.pprof, false)
	if err != nil {
		b.Fatalf("%s: %v", c.Name, err)
	}
	if want := passes * w.ds.services; p.Completed+p.Lost != want {
		b.Fatalf("%s %s under callgrind: dnsperf sent %d queries, want %d (%d passes of %d): cut short by its %s bound?",
			c.Name, qtype, p.Completed+p.Lost, want, passes, w.ds.services, instrRunBound)
	}
	dumps := callgrindDumps(out)
	if len(dumps) != len(before)+1 {
		b.Fatalf("%s: callgrind wrote %d dump files for one dump (%s*)", c.Name, len(dumps)-len(before), out)
	}
	dump := dumps[len(dumps)-1]
	total, err := callgrindTotal(dump)
	if err != nil {
		b.Fatalf("%s: %v", c.Name, err)
	}
	pt := instrPoint{Contender: c.Name, QType: qtype, Run: run, Instr: total, Answers: p.Completed, Lost: p.Lost, Dump: dump,
		AllocBytes: m1["TotalAlloc"] - m0["TotalAlloc"], Allocs: m1["Mallocs"] - m0["Mallocs"]}
	pt.StackGrowth, pt.Top, err = callgrindAnnotate(ctx, dump)
	if err != nil {
		b.Errorf("%s: callgrind_annotate: %v", c.Name, err)
	}
	return pt
}

// callgrindWrapper writes a script that execs bin/coredns under callgrind
// (exec keeps the PID, so the harness stops valgrind, and CoreDNS in it,
// itself). Counting starts switched off; countRun switches it on.
// GOGC=off: see the top of this file. Two Go runtime settings make valgrind
// work at all: cpu.rdtscp=off, because the runtime reads the clock with
// RDTSCP where the CPU has it, an instruction valgrind 3.19 cannot run
// (SIGILL; RDTSC instead); asyncpreemptoff=1, because callgrind 3.19 fails
// an assertion on the SIGURG the runtime sends to preempt a goroutine that
// runs long (goroutines that answer a query yield long before that).
func callgrindWrapper(t harness.T, dir, name, out string) string {
	for _, old := range callgrindDumps(out) {
		_ = os.Remove(old)
	}
	_ = os.Remove(out)
	return wrapper(t, dir, "coredns-callgrind-"+name, fmt.Sprintf("env GOGC=off GODEBUG=${GODEBUG:+$GODEBUG,}cpu.rdtscp=off,asyncpreemptoff=1 valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=%q", out), "")
}

// callgrindControl sends a command to the callgrind running as pid and
// waits until it has been carried out.
func callgrindControl(t harness.T, pid int, arg string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "callgrind_control", arg, strconv.Itoa(pid)).CombinedOutput()
	if err != nil || strings.Contains(string(out), "Error") {
		t.Fatalf("callgrind_control %s %d: %v: %s", arg, pid, err, out)
	}
}

// callgrindDumps lists the dump files of out (out.1, out.2, ...) in the
// order they were written.
func callgrindDumps(out string) []string {
	matches, _ := filepath.Glob(out + ".*")
	type numbered struct {
		n    int
		path string
	}
	var ds []numbered
	for _, m := range matches {
		if n, err := strconv.Atoi(strings.TrimPrefix(m, out+".")); err == nil {
			ds = append(ds, numbered{n, m})
		}
	}
	slices.SortFunc(ds, func(a, b numbered) int { return a.n - b.n })
	paths := make([]string, len(ds))
	for i, d := range ds {
		paths[i] = d.path
	}
	return paths
}

var reTotals = regexp.MustCompile(`(?m)^(?:totals|summary):\s+(\d+)\s*$`)

// callgrindTotal is the instruction count of a callgrind dump.
func callgrindTotal(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var best int64 = -1
	for _, m := range reTotals.FindAllSubmatch(b, -1) {
		n, err := strconv.ParseInt(string(m[1]), 10, 64)
		if err == nil && n > best {
			best = n
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("%s: no totals line", path)
	}
	return best, nil
}

// stackGrowthFuncs are the Go runtime's functions that grow a goroutine's
// stack: newstack copies it, walking every frame with the unwinder and the
// PC-value tables. With the collector off nothing else walks stacks in a
// running server (no GC scans them, nothing prints a traceback).
var stackGrowthFuncs = regexp.MustCompile(`^runtime\.(newstack|copystack|adjust\w+|morestack\w*|pcvalue|step|findfunc|funcMaxSPDelta|funcspdelta|pcdatavalue\w*|funcdata|readvarint|stackalloc|stackfree|stackcache\w*|\(\*moduledata\)\.textAddr|\(\*stkframe\)\.\w+|\(\*unwinder\)\.\w+|funcInfo\.\w+)(\.abi0)?('\d+)?$`)

// reAnnotateLine is a function's line in callgrind_annotate's listing:
// count and share, then file:function (and the binary's name).
var reAnnotateLine = regexp.MustCompile(`^(\s*([0-9,]+) \(\s*[0-9.]+%\))\s+(\S*):(\S+)`)

// callgrindAnnotate runs callgrind_annotate on a dump (its whole listing
// kept beside the dump) and parses it with parseAnnotate.
func callgrindAnnotate(ctx context.Context, dump string) (stackGrowth int64, top string, err error) {
	cx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	self, err := exec.CommandContext(cx, "callgrind_annotate", "--threshold=100", "--auto=no", dump).Output()
	if err != nil {
		return 0, "", err
	}
	_ = os.WriteFile(dump+".top.txt", self, 0o644)
	stackGrowth, top = parseAnnotate(self)
	return stackGrowth, top, nil
}

// parseAnnotate sums the instructions of the runtime's functions that grow
// stacks in a callgrind_annotate listing (each function's own instructions:
// callgrind's inclusive counts are not sound for Go, whose goroutines and
// runtime switch stacks), and returns its first 15 functions.
func parseAnnotate(listing []byte) (stackGrowth int64, top string) {
	var lines []string
	in := false // inside the function list, which follows the "Ir  file:function" header
	for _, l := range strings.Split(string(listing), "\n") {
		if strings.Contains(l, "file:function") {
			in = true
			continue
		}
		if !in {
			continue
		}
		m := reAnnotateLine.FindStringSubmatch(l)
		if m == nil {
			if len(lines) > 0 {
				break // the list ends at its first other line
			}
			continue // the header's rule
		}
		if stackGrowthFuncs.MatchString(m[4]) {
			n, _ := strconv.ParseInt(strings.ReplaceAll(m[2], ",", ""), 10, 64)
			stackGrowth += n
		}
		lines = append(lines, m[1]+"  "+m[4])
	}
	if len(lines) > 15 {
		lines = lines[:15]
	}
	return stackGrowth, strings.Join(lines, "\n")
}
