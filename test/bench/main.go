// Command mcs-bench is `make bench` (and, with -smoke, `make bench-smoke`):
// our plugin side by side with CoreDNS's own `hosts` and in-tree
// `kubernetes ... { multicluster }` in the same binary, against the same
// deterministic data in a real kube-apiserver, and the offline figures
// (cold start from a snapshot, propagation, resync after a cut link).
//
// It drives test/harness (real etcd + kube-apiserver on 127.0.0.1,
// bin/coredns), runs dnsperf, keeps every raw output under bench/raw/, writes
// what it measured to results.json there and renders BENCHMARKS.md from it
// (report.md.tmpl; -render renders a results.json again). Every process it
// starts is stopped by PID, also on failure and Ctrl-C.
//
//	env $(tools/install.sh env) go run ./test/bench [-smoke] [flags]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// config is what the flags set (see their help).
type config struct {
	Smoke                            bool
	Services, Endpoints, Namespaces  int
	Workers, Runs, Clients, Rate     int
	Duration, LatDur                 time.Duration // one dnsperf point; one fixed-rate latency run
	ColdEndpoints, ColdRuns, Changes int
	CutFor                           time.Duration
	GoBench                          bool
	InstrRuns, InstrQueries          int
	Stages                           string // comma-separated parts; "" for all
	ProbeRepeats, ProbeEndpoints     int
	ProbeWindow                      time.Duration
	CompareCoreDNS                   string // "" for none
	CompareTurns                     int
	SoakReport, Out, Raw, Render     string
	RelayReport                      string      // "" for none
	Relay                            relayConfig // -relay: the relay benchmark instead
	Command                          string      // the command line, for the report
}

// smokeDefaults are the tiny sizes of -smoke, for the flags not given.
var smokeDefaults = map[string]string{
	"services": "60", "endpoints": "2", "namespaces": "4", "duration": "1s", "runs": "1", "rate": "1000",
	"latency-duration": "1s", "cold-endpoints": "5000", "cold-runs": "2", "changes": "10", "cut": "2s",
	"gobench": "false", "instr-queries": "600", "instr-runs": "2", "probe-repeats": "2", "probe-endpoints": "300",
	"probe-window": "3s", "compare-turns": "1",
}

func parseFlags() config {
	var c config
	flag.BoolVar(&c.Smoke, "smoke", false, "a short run that checks the whole program works and its figures are sane (make bench-smoke); small defaults, report under bench/raw/smoke/")
	flag.IntVar(&c.Services, "services", 10000, "services in the API server")
	flag.IntVar(&c.Endpoints, "endpoints", 3, "endpoints (exporter Pods) per service (10,000 x 3 = 30,000 Pods take about 2 min to create here)")
	flag.IntVar(&c.Namespaces, "namespaces", 50, "namespaces the services are spread over")
	flag.IntVar(&c.Workers, "workers", 24, "concurrent API requests while loading the data")
	flag.DurationVar(&c.Duration, "duration", 10*time.Second, "length of one dnsperf point")
	flag.IntVar(&c.Runs, "runs", 3, "repeats of each dnsperf point (median reported)")
	flag.IntVar(&c.Clients, "clients", 4, "dnsperf -c")
	flag.IntVar(&c.Rate, "rate", 5000, "queries per second of the fixed-rate latency runs")
	flag.DurationVar(&c.LatDur, "latency-duration", 10*time.Second, "length of a fixed-rate latency run")
	flag.IntVar(&c.ColdEndpoints, "cold-endpoints", 100000, "endpoints in the snapshot of the cold-start test (10 per service)")
	flag.IntVar(&c.ColdRuns, "cold-runs", 7, "cold starts measured (median reported)")
	flag.IntVar(&c.Changes, "changes", 100, "annotation changes per propagation test")
	flag.DurationVar(&c.CutFor, "cut", 10*time.Second, "how long the link to the API server stays cut in the resync test")
	flag.BoolVar(&c.GoBench, "gobench", true, "also run the Go benchmarks of the plugin and the annotator (heap per endpoint, cold load, ServeDNS allocations, a settled namespace's reconcile)")
	flag.IntVar(&c.InstrRuns, "instr-runs", 3, "counted runs of each contender and query type under callgrind (instructions per answer)")
	flag.IntVar(&c.InstrQueries, "instr-queries", 10000, "queries in one counted callgrind run (rounded up to whole passes through the query file)")
	flag.IntVar(&c.ProbeRepeats, "probe-repeats", 5, "failovers measured with the probe defaults")
	flag.IntVar(&c.ProbeEndpoints, "probe-endpoints", 10000, "asked endpoints probed (10 per service, each a TCP listener on 127.201.0.0/16) in the probe cost stage")
	flag.DurationVar(&c.ProbeWindow, "probe-window", 30*time.Second, "how long the probing CoreDNS's CPU time is read")
	flag.StringVar(&c.CompareCoreDNS, "compare-coredns", "", "an older build of bin/coredns, compared side by side in the same run: the cold stage (heap per endpoint, cold start) and the live stage (propagation, resync) run in turns on each build, and the dns stage runs it as one more contender (QPS beside hosts); its commit is read from its folder's git tree")
	flag.StringVar(&c.SoakReport, "soak", "", "include this soak.md (written by make soak, test/soak) in the report as it is")
	flag.IntVar(&c.CompareTurns, "compare-turns", 3, "turns of each build in the cold and live stages with -compare-coredns")
	flag.StringVar(&c.Stages, "stages", "", "run only these parts, comma-separated: gobench, cold, probe (failover, probe cost, QPS with probing), dns (throughput, latency, memory), instr (instructions per answer, under callgrind), live (propagation, resync), mcs (the MCS controller over 3 clusters); default all")
	flag.StringVar(&c.Out, "out", "", "report file (default BENCHMARKS.md at the repository root; bench/raw/smoke/BENCHMARKS.md with -smoke)")
	flag.StringVar(&c.Raw, "raw", "", "folder for raw output (default bench/raw/<UTC time>, bench/raw/smoke with -smoke)")
	flag.StringVar(&c.Render, "render", "", "render the report from this results.json of an earlier run instead of running (to -out, default the report that run wrote)")
	flag.StringVar(&c.RelayReport, "relay-report", "", "include this relay.md (written by make bench-relay) in the report as it is")
	relayFlags(&c.Relay)
	flag.Parse()
	applyRelaySmoke(&c.Relay)
	if c.Smoke {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, v := range smokeDefaults {
			if !set[name] {
				_ = flag.Set(name, v)
			}
		}
	}
	wd, _ := os.Getwd()
	c.Command = commandLine(wd, os.Args[1:])
	if c.CompareCoreDNS != "" {
		if abs, err := filepath.Abs(c.CompareCoreDNS); err == nil {
			c.CompareCoreDNS = abs
		}
	}
	return c
}

func main() {
	cfg := parseFlags()
	root, err := harness.RepoRoot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "mcs-bench: %v (run it from the repository)\n", err)
		os.Exit(2)
	}
	if cfg.Render != "" {
		if err := rerender(cfg.Render, cfg.Out); err != nil {
			fmt.Fprintf(os.Stderr, "mcs-bench: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if cfg.Relay.On {
		os.Exit(relayMain(cfg, root))
	}
	if cfg.Raw == "" {
		cfg.Raw = filepath.Join(root, "bench", "raw", time.Now().UTC().Format("20060102T150405Z"))
		if cfg.Smoke {
			cfg.Raw = filepath.Join(root, "bench", "raw", "smoke")
			_ = os.RemoveAll(cfg.Raw)
		}
	}
	if cfg.Out == "" {
		cfg.Out = filepath.Join(root, "BENCHMARKS.md")
		if cfg.Smoke {
			cfg.Out = filepath.Join(cfg.Raw, "BENCHMARKS.md")
		}
	}
	if err := os.MkdirAll(cfg.Raw, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "mcs-bench: %v\n", err)
		os.Exit(2)
	}

	start := time.Now()
	b := harness.NewProgram("mcs-bench", func(msg string) {
		fmt.Printf("   [%6.1fs] %s\n", time.Since(start).Seconds(), msg)
	})
	// Cancelled by SIGINT or SIGTERM too, which end the dnsperf or go test
	// running then.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res := &results{Cfg: cfg, Root: root, Started: start}
	code := b.Main(func() { run(ctx, b, res) })
	if code == 0 && len(res.Failures) > 0 {
		code = 1
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "mcs-bench: FAILED: %s\n", strings.Join(res.Failures, "; "))
		os.Exit(code)
	}
	fmt.Printf("mcs-bench: done in %s; report %s, raw output %s\n", time.Since(res.Started).Round(time.Second), cfg.Out, cfg.Raw)
}

// stage is one part of the benchmark: its function fills its results
// struct, its targets function turns that into rows of the report's table
// of targets, and its block of report.md.tmpl renders it.
type stage struct {
	part    string // its name for -stages, and in the report
	world   bool   // needs the clusters and the data
	run     func(ctx context.Context, b *harness.Program, res *results, w *world)
	targets func(r *results) []target
}

// stages run in this order; the clusters start before the first that
// needs them.
var stages = []stage{
	{"gobench", false, goBenchmarks, goBenchTargets},
	{"cold", false, coldStart, coldTargets},
	{"probe", false, probeStage, probeTargets},
	{"dns", true, dnsStage, dnsTargets},
	{"instr", true, instructions, instrTargets},
	{"live", true, liveStage, liveTargets},
	{"mcs", false, mcsStage, mcsTargets},
}

// run does every stage wanted; one that fails is recorded and the others
// go on where they can. The results and the report are written at the end in
// any case.
func run(ctx context.Context, b *harness.Program, res *results) {
	cfg := res.Cfg
	defer func() {
		res.Took = time.Since(res.Started)
		res.Machine.LoadEnd = loadavg()
		path, err := saveResults(res)
		if err != nil {
			b.Errorf("results: %v", err)
			return
		}
		if err := writeReport(res, cfg.Out); err != nil {
			b.Errorf("report: %v", err)
			return
		}
		fmt.Printf("== results in %s, report written to %s\n", path, cfg.Out)
	}()
	if cfg.SoakReport != "" {
		if err := readSoak(res, cfg.SoakReport); err != nil {
			b.Errorf("soak report: %v", err)
		}
	}
	if cfg.RelayReport != "" {
		var err error
		if res.Relay, err = readSummary(cfg.RelayReport, "relay summary"); err != nil {
			b.Errorf("relay report: %v", err)
		}
	}
	timed(b, res, "preflight", func() { preflight(b, res) })
	if len(res.Failures) > 0 {
		return
	}
	var env *world
	for _, s := range stages {
		if !cfg.wants(s.part) || (s.part == "gobench" && !cfg.GoBench) {
			continue
		}
		if s.world && env == nil {
			timed(b, res, "clusters and data", func() { env = setup(b, res) })
			if env == nil {
				return
			}
		}
		timed(b, res, s.part, func() { s.run(ctx, b, res, env) })
	}
	if cfg.Stages == "" {
		checkSane(res)
	}
}

// rerender writes the report of a results file again, to out or, when out
// is empty, to the report its run wrote.
func rerender(path, out string) error {
	r, err := loadResults(path)
	if err != nil {
		return err
	}
	if out == "" {
		out = r.Cfg.Out
	}
	if err := writeReport(r, out); err != nil {
		return err
	}
	fmt.Printf("mcs-bench: report of %s written to %s\n", path, out)
	return nil
}

// wants tells whether a part is to run.
func (c config) wants(part string) bool {
	if c.Stages == "" {
		return true
	}
	for _, s := range strings.Split(c.Stages, ",") {
		if strings.TrimSpace(s) == part {
			return true
		}
	}
	return false
}

// timed runs one part, timing it and recording a failure.
func timed(b *harness.Program, res *results, name string, f func()) {
	fmt.Printf("== %s\n", name)
	start, failedBefore := time.Now(), b.Failed()
	ok := b.Run(f) && (failedBefore || !b.Failed()) // an Errorf alone fails the stage too
	took := time.Since(start)
	res.Stages = append(res.Stages, stageTime{name, took, ok})
	if !ok {
		res.Failures = append(res.Failures, name+" failed")
		fmt.Printf("== %s FAILED after %s\n", name, took.Round(100*time.Millisecond))
		return
	}
	fmt.Printf("== %s: %s\n", name, took.Round(100*time.Millisecond))
}

// preflight checks the tools and records the machine.
func preflight(b *harness.Program, res *results) {
	harness.RequireTools(b)
	tools := []string{"dnsperf", "taskset", "go"}
	if res.Cfg.wants("instr") {
		tools = append(tools, "valgrind", "callgrind_control", "callgrind_annotate")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			b.Fatalf("%s not found (`make tools` installs dnsperf and valgrind)", tool)
		}
	}
	res.Machine = machine(res.Root)
	if old := res.Cfg.CompareCoreDNS; old != "" {
		if st, err := os.Stat(old); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			b.Fatalf("-compare-coredns %s: not an executable file (%v)", old, err)
		}
		res.OldBuild = &oldBuild{Path: old, Commit: commitOf(filepath.Dir(old))}
		b.Logf("old build: %s (commit %s)", old, res.OldBuild.Commit)
	}
	m := res.Machine
	b.Logf("machine: %d CPUs (%s), load %s, commit %s, %d other test processes", m.CPUs, m.CPUModel, m.LoadStart, m.Commit, len(m.OtherHeavy))
}

// soakReport is the summary of a separate make soak run (test/soak writes
// it), included in the report with where and when it was written.
type soakReport struct {
	Path     string
	Modified time.Time
	Markdown string
}

func readSoak(res *results, path string) error {
	s, err := readSummary(path, "soak summary")
	if err == nil {
		res.Soak = s
	}
	return err
}

// readSummary reads the markdown summary of a separate run (make soak, make
// bench-relay) to include in the report as it is.
func readSummary(path, what string) (*soakReport, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Size() > 64<<10 {
		return nil, fmt.Errorf("%s: %d bytes, more than a %s", path, st.Size(), what)
	}
	md, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	return &soakReport{Path: abs, Modified: st.ModTime().UTC(), Markdown: strings.TrimSpace(string(md))}, nil
}

// commandLine is the command line as a report prints it: each path inside
// wd (the checkout, where make runs it), alone or as a flag's value after
// "=", relative to it, so that a report names no machine's folders.
func commandLine(wd string, args []string) string {
	out := []string{"go run ./test/bench"}
	for _, a := range args {
		prefix, v := "", a
		if name, val, ok := strings.Cut(a, "="); ok && strings.HasPrefix(a, "-") {
			prefix, v = name+"=", val
		}
		if rel, err := filepath.Rel(wd, v); wd != "" && filepath.IsAbs(v) && err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			v = rel
		}
		out = append(out, prefix+v)
	}
	return strings.Join(out, " ")
}
