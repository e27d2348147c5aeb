package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sample is a results value with every scenario's figures filled in.
func sample(t *testing.T) *results {
	raw := t.TempDir()
	r := &results{
		Cfg:     config{Services: 10, Endpoints: 2, Namespaces: 2, Runs: 1, ColdRuns: 3, Duration: time.Second, Clients: 4, Rate: 1000, LatDur: time.Second, InstrRuns: 1, InstrQueries: 600, Raw: raw, Out: filepath.Join(raw, "BENCHMARKS.md"), Command: "go run ./test/bench -smoke"},
		Root:    filepath.Dir(raw),
		Took:    90 * time.Second,
		Machine: machineInfo{CPUs: 2, CPUModel: "Test CPU", LoadStart: "1 1 1", LoadEnd: "2 2 2", Date: time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC), Commit: "abc123", GoVersion: "go1.26", DNSPerf: "2.10.0"},
		Stages:  []stageTime{{"Go benchmarks", time.Second, true}, {"cold start from a snapshot", 2 * time.Second, false}},
		Data:    &dataResult{Pods: 20, Imports: 10, Slices: 10, PodsTook: time.Second, MCSTook: time.Second},
		DNS: &dnsResult{
			Sync: []syncPoint{{"pinned", ours, 1200 * time.Millisecond}},
			Mems: []memPoint{
				{Contender: ours, When: "loaded", Heap: 3_000_000, RSS: 80_000_000},
				{Contender: ours + " (empty)", When: "loaded", Heap: 2_000_000, RSS: 70_000_000},
				{Contender: intree, When: "loaded", Heap: 4_000_000, RSS: 90_000_000},
			},
			ProfileTop: "cpu-top-listing",
			NewStack:   []newStackShare{{ours, 16.5}},
		},
		GoBench: []string{"--- PASS: TestLookupDoesNotAllocate (0.00s)", "BenchmarkServeDNS/A-2 100 244.3 ns/op 320 B/op 5 allocs/op"},
		Cold: &coldResult{Endpoints: 100000, Services: 10000, FileBytes: 41_400_000, WriteTook: 300 * time.Millisecond,
			coldRun: coldRun{HeapEmpty: 3_700_000, HeapLoaded: 21_600_000, HeapRendered: 56_300_000,
				Runs: []time.Duration{80 * time.Millisecond, 90 * time.Millisecond, 85 * time.Millisecond}, EmptyRuns: []time.Duration{20 * time.Millisecond, 21 * time.Millisecond, 19 * time.Millisecond}},
			Mems: []memPoint{{Contender: ours + " (cold)", When: "no API server, every service asked once", Heap: 9_000_000, RSS: 100_000_000, Top: "heap-top-listing"}},
			Perf: "perf-listing"},
		Live: &liveResult{liveRun: liveRun{
			Prop:   []propResult{{Source: "local", Lat: []time.Duration{3 * time.Millisecond, 30 * time.Millisecond}, API: []time.Duration{2 * time.Millisecond}}},
			Resync: resyncResult{Endpoints: 30001, CutFor: 10 * time.Second, Took: 41 * time.Millisecond, Received: 12700, Probes: 5261},
			Relist: resyncResult{Endpoints: 30002, Restart: true, CutFor: 10 * time.Second, Took: 1580 * time.Millisecond, WarmUp: 2300 * time.Millisecond, Received: 3_700_000, Probes: 11713, ProbeWrong: 1, FirstWrong: "svc-00001 A: empty"},
		}},
		Probe: &probeResult{Failover: []time.Duration{4 * time.Second, 5500 * time.Millisecond, 4200 * time.Millisecond},
			Endpoints: 10000, Services: 1000, Net: "127.201.0.0/16", Port: 8080, Window: 30 * time.Second,
			CPUOn: 1500 * time.Millisecond, CPUOff: 100 * time.Millisecond, Accepted: 140000},
		MCS: &mcsResult{Services: 10, Pods: 20, Lat: []time.Duration{300 * time.Millisecond}, Writes: map[string]float64{"endpointslice": 1}, SliceEvents: 1,
			GoBench: []string{"BenchmarkControllerMemory 3 1234567 ns/op 321 heap-B/endpoint"}, HeapPerEndpoint: 321, Reconcile: 1234567},
	}
	r.OldBuild = &oldBuild{Path: "/x/old/bin/coredns", Commit: "ae347de"}
	r.Live.Compare = &compareResult{Old: "/x/old/bin/coredns", OldCommit: "ae347de", Runs: []liveRun{
		{Build: "new", Turn: 1, Resync: resyncResult{Took: 60 * time.Millisecond, Probes: 10}, Relist: resyncResult{Took: 5 * time.Second, Probes: 10, ProbeWrong: 2, Heap: 30_000_000}},
		{Build: "old", Turn: 1, Resync: resyncResult{Took: 40 * time.Millisecond, Probes: 10}, Relist: resyncResult{Took: 6 * time.Second, Probes: 10, Heap: 33_000_000}},
		{Build: "new", Turn: 2, Resync: resyncResult{Took: 80 * time.Millisecond, Probes: 10}, Relist: resyncResult{Took: 5 * time.Second, Probes: 10}},
		{Build: "old", Turn: 2, Resync: resyncResult{Took: 50 * time.Millisecond, Probes: 10}, Relist: resyncResult{Took: 6 * time.Second, Probes: 10}},
	}}
	ms := func(xs ...int) []time.Duration {
		var ds []time.Duration
		for _, x := range xs {
			ds = append(ds, time.Duration(x)*time.Millisecond)
		}
		return ds
	}
	r.Cold.Compare = &coldCompare{Runs: []coldRun{
		{Build: "new", Turn: 1, HeapEmpty: 3_700_000, HeapLoaded: 21_600_000, HeapRendered: 56_300_000, Runs: ms(80, 90, 85), EmptyRuns: ms(20, 21, 19)},
		{Build: "old", Turn: 1, HeapEmpty: 3_600_000, HeapLoaded: 23_600_000, HeapRendered: 58_300_000, Runs: ms(100, 110, 105), EmptyRuns: ms(20, 20, 20)},
		{Build: "new", Turn: 2, HeapEmpty: 3_700_000, HeapLoaded: 21_700_000, HeapRendered: 56_400_000, Runs: ms(82, 88, 86), EmptyRuns: ms(21, 20, 22)},
		{Build: "old", Turn: 2, HeapEmpty: 3_600_000, HeapLoaded: 23_800_000, HeapRendered: 58_500_000, Runs: ms(96, 120, 104), EmptyRuns: ms(19, 21, 20)},
	}}
	r.DNS.Mems = append(r.DNS.Mems,
		memPoint{Contender: oursOld, When: "loaded", Heap: 3_200_000, RSS: 81_000_000},
		memPoint{Contender: oursOld + " (empty)", When: "loaded", Heap: 2_100_000, RSS: 71_000_000})
	for i, qps := range []float64{50000, 49000, 52000, 51000} {
		p := perf{QPS: qps, Completed: 1000, CPU: 20 * time.Millisecond, Took: time.Second}
		if i%2 == 0 {
			r.Probe.Off = append(r.Probe.Off, p)
		} else {
			r.Probe.On = append(r.Probe.On, p)
		}
	}
	r.Probe.Latency = map[string][]latencyRun{
		"off": {{P50: 70 * time.Microsecond, P99: 900 * time.Microsecond, CPU: 200 * time.Millisecond}},
		"on":  {{P50: 140 * time.Microsecond, P99: 1600 * time.Microsecond, Lost: 1, CPU: 600 * time.Millisecond}},
	}
	r.DNS.Latency = map[string]perf{}
	for _, mode := range []string{"pinned", "unpinned"} {
		for _, q := range []string{"A", "SRV"} {
			for i, c := range []string{ours, hosts, intree} {
				if q == "SRV" && c == hosts {
					continue
				}
				r.DNS.add(mode, q, c, perf{QPS: float64(78000 - 10000*i), Completed: 1000, Rcodes: "NOERROR 1000 (100.00%)", CPU: 10 * time.Millisecond, Took: time.Second})
				if c == ours {
					r.DNS.add(mode, q, oursOld, perf{QPS: 74100, Completed: 1000, Rcodes: "NOERROR 1000 (100.00%)", CPU: 10 * time.Millisecond, Took: time.Second})
				}
				r.DNS.Latency[q+"/"+c] = perf{Latencies: []float64{50e-6, 60e-6, 250e-6}}
				if mode == "pinned" {
					r.Instr = append(r.Instr, instrPoint{Contender: c, QType: q, Run: 1, Instr: int64(84000+40000*i) * 600, Answers: 600, StackGrowth: 48000 * 600, AllocBytes: 1900 * 600, Allocs: 31 * 600, Top: "callgrind-top-" + c, Dump: "/x/callgrind-ours.out.1"})
				}
			}
		}
	}
	return r
}

// Every scenario's block renders its figures, and a results file read back
// renders the same report: -render reproduces a run's report.
func TestRender(t *testing.T) {
	r := sample(t)
	soak := filepath.Join(r.Root, "soak.md")
	if err := os.WriteFile(soak, []byte("### Soak (1m16s)\n\n| answers checked | wrong |\n|---|---|\n| 6370 | 0 |\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readSoak(r, soak); err != nil {
		t.Fatal(err)
	}
	if err := writeReport(r, r.Cfg.Out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(r.Cfg.Out)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	if os.Getenv("DUMP") != "" {
		t.Log(got)
	}
	for _, want := range []string{
		"# Benchmarks\n", "- Commit: abc123", "load average (1/5/15 min) 1 1 1 at the start, 2 2 2 at the end",
		"  - cold start from a snapshot: 2s **FAILED**",
		"| ours/hosts >= 0.95 (A, pinned) | 1.15 | met |",
		"| ours/in-tree multicluster >= 2 (A, pinned) | 1.34 | **missed** |",
		"| zero allocations on the answer path beyond the response message | lookup: 0 (TestLookupDoesNotAllocate passes); see the Go benchmarks below; `BenchmarkServeDNS/A-2 100 244.3 ns/op 320 B/op 5 allocs/op` | met |",
		"| <= 200 B heap per endpoint (records, table and index in the running CoreDNS, 100000 endpoints;", "| 179 B | met |",
		"| cold start at 100k <= 300 ms | 85.0 ms median of 3 (the process's own start, timed in turns with it: 20.0 ms; the snapshot's share: 66.0 ms) | met |",
		"| propagation p99 <= 200ms (local) |",
		"(the watch resumes; here 30001 endpoints) | 41.0 ms", "| not measured |",
		"every Pod listed again; here 30002 endpoints): **missed** already at this size |",
		"| pinned | A | 78000 | 68000 | 58000 | 1.15 | 1.34 |",
		"| pinned | SRV | 78000 | n/a | 58000 | n/a | 1.34 |",
		"| pinned | A | 10.0 µs (busy 1%) |",
		"- unpinned SRV kubernetes multicluster: 58000 (NOERROR 1000 (100.00%))",
		"| A | mcsannotations | 84000 (84000-84000) | 48000 | 1900 B in 31.0 allocations |",
		"| A | 1.48 | 1.95 |", "callgrind-top-mcsannotations", "beside `callgrind-ours.out.1`",
		"| A | hosts | 3 | 60 µs | 250 µs | 250 µs |",
		"**50000 B per endpoint**", "The in-tree multicluster reference holds 4.0 MB",
		"**179 B/endpoint loaded, 526 B/endpoint rendered**", "heap-top-listing",
		"Runs: 80.0 ms, 90.0 ms, 85.0 ms; **median 85.0 ms**", "**66.0 ms**", "perf-listing",
		"| local | 2 | ", "| 11713 | **1** | 0 |", "First wrong answer (API server restarted while cut: every Pod listed again): `svc-00001 A: empty`",
		"cpu-top-listing", "mcsannotations 16.5%",
		"| failover <= 5 s with the probe defaults", "| p50 4200.0 ms, max 5500.0 ms over 3 | **missed** |",
		"| `probe all` | 140 µs | 1600 µs | 1 | 600.0 ms |",
		"| QPS with `probe all` / without >= 0.95 (A, pinned, 10000 asked endpoints probed) | 0.98 | met |",
		"| `probe all` | 1500.0 ms | **5.0%** | 140000 | 14.0 | 2142.9 ms | **100.0 ms** |",
		"without probing 50000, 52000; with `probe all` 49000, 51000; medians' ratio **0.98**. CoreDNS's CPU per answer (as in the throughput table): without probing 20.0 µs (busy 2%), with 20.0 µs (busy 2%).",
		"## In turns against the old build", "(old: commit ae347de)", "| resync, the watch resumes | **60.0 ms** (60.0 ms, 80.0 ms) | **40.0 ms** (40.0 ms, 50.0 ms) | 0.67 |",
		"| CoreDNS heap before the list's cut (live sources, the data cluster and the peer) | **30.0 MB** (30.0 MB) | **33.0 MB** (33.0 MB) | 1.10 |",
		"| heap per endpoint, snapshot loaded | **179 B** (179 B, 180 B) | **200 B** (200 B, 202 B) | 1.12 |",
		"| heap per endpoint, every service asked once | **526 B** (526 B, 527 B) | **547 B** (547 B, 549 B) | 1.04 |",
		"| cold start (median of the turn's starts) | **85.0 ms** (85.0 ms, 86.0 ms) | **104.0 ms** (105.0 ms, 104.0 ms) | 1.22 |",
		"| the snapshot's share (median of the pairs' differences) | **64.0 ms** (66.0 ms, 64.0 ms) | **84.0 ms** (85.0 ms, 84.0 ms) | 1.31 |",
		"| pinned | A | **78000** (78000) | **74100** (74100) | 68000 | 1.15 | 1.09 | 0.95 |",
		"| unpinned | SRV | **78000** (78000) | **74100** (74100) | n/a | n/a | n/a | 0.95 |",
		"new **50000 B**, old **55000 B**; old/new 1.10",
		"| mcsannotations, old build | loaded | 3.2 MB | 81.0 MB |",
		"| propagation p50, local | n/a | n/a | n/a |", "| wrong answers during the resyncs, of the prober's queries | 2 of 40 | 0 of 40 | |", "BenchmarkServeDNS/A-2", "- mcsannotations, pinned: 1.2s",
		"## MCS controller", "**321 B per endpoint**", "takes 1.2 ms (ns/op)", "| 1 | 300.0 ms | 300.0 ms | 300.0 ms |",
		"## Soak (`make soak`)", "its summary `soak.md` as written on", "| 6370 | 0 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(got, "<no value>") || strings.Contains(got, "\n\n\n") {
		t.Errorf("report has a missing value or a gap:\n%s", got)
	}

	path, err := saveResults(r)
	if err != nil {
		t.Fatal(err)
	}
	again := filepath.Join(t.TempDir(), "again.md")
	if err := rerender(path, again); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(again); err != nil || string(b) != got {
		t.Errorf("rendered from %s (%v):\n%s\nwant:\n%s", path, err, b, got)
	}
}

// A run that measured nothing (a failed preflight) still renders its run
// section and no empty one.
func TestRenderEmpty(t *testing.T) {
	r := &results{Cfg: config{Raw: t.TempDir()}, Failures: []string{"preflight failed"}}
	var w strings.Builder
	if err := render(&w, r); err != nil {
		t.Fatal(err)
	}
	got := w.String()
	if !strings.Contains(got, "- **Failures:** preflight failed") {
		t.Errorf("no failures line:\n%s", got)
	}
	for _, s := range []string{"## Throughput", "## Memory", "## Cold start", "## Resync", "## Endpoint probes", "in turns against", "<no value>"} {
		if strings.Contains(got, s) {
			t.Errorf("empty run renders %q:\n%s", s, got)
		}
	}
}

// The report names no folder of the machine that ran it: files in the
// checkout are relative to it, others are "…/" and their name, wherever a
// path comes from (the command line, the old build, the soak summary, the
// other processes, a failure's error).
func TestRenderNoAbsolutePath(t *testing.T) {
	r := sample(t)
	outside, err := os.MkdirTemp("", "elsewhere") // not under r.Root, as t.TempDir would be
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(outside) })
	soak := filepath.Join(outside, "soak-results", "soak.md")
	if err := os.MkdirAll(filepath.Dir(soak), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(soak, []byte("### Soak (1m16s)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readSoak(r, soak); err != nil {
		t.Fatal(err)
	}
	oldBin := filepath.Join(outside, "old", "bin", "coredns")
	r.Cfg.Command = "go run ./test/bench -compare-coredns " + oldBin + " -soak " + soak + " -out=" + filepath.Join(r.Root, "out", "BENCHMARKS.md")
	r.Live.Compare.Old = oldBin
	r.Machine.OtherHeavy = []string{"4242 " + filepath.Join(outside, "kube-apiserver")}
	r.Failures = []string{"cold start: open " + filepath.Join(r.Cfg.Raw, "table.db") + ": no such file"}
	var w strings.Builder
	if err := render(&w, r); err != nil {
		t.Fatal(err)
	}
	got := w.String()
	for _, want := range []string{
		"-compare-coredns …/coredns -soak …/soak.md -out=out/BENCHMARKS.md",
		"and `…/coredns` (old: commit", "its summary `…/soak.md`", "4242 …/kube-apiserver",
		"cold start: open " + filepath.Base(r.Cfg.Raw) + "/table.db: no such file",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, dir := range []string{r.Root, outside} {
		if strings.Contains(got, dir) {
			t.Errorf("report names %s", dir)
		}
	}
	// The report's own text names /proc files and a pprof URL path; any
	// other word starting with a slash is a path of the machine.
	for _, m := range absPath.FindAllStringSubmatch(got, -1) {
		if !strings.HasPrefix(m[1], "/proc/") && !strings.HasPrefix(m[1], "/debug/pprof/") {
			t.Errorf("report has an absolute path %q", m[1])
		}
	}
}

func TestShownIn(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"/repo/bin/coredns", "bin/coredns"},
		{"/repo", "."},
		{"/repository/x", "…/x"},
		{"/other/bin/coredns -x", "…/coredns -x"},
		{"-soak=/repo/soak-results/soak.md", "-soak=soak-results/soak.md"},
		{"open /tmp/a/b.db: no such file", "open …/b.db: no such file"},
		{"`/repo/a`, '/b/c'", "`a`, '…/c'"},
		{"127.201.0.0/16 and 1/5/15 min", "127.201.0.0/16 and 1/5/15 min"},
		{"./test/bench bench/raw/x", "./test/bench bench/raw/x"},
	} {
		if got := shownIn("/repo", c.text); got != c.want {
			t.Errorf("shownIn(%q) = %q, want %q", c.text, got, c.want)
		}
	}
}
