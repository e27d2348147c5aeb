package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// writeReport writes BENCHMARKS.md from whatever was measured.
func writeReport(r *results) error {
	r.Machine.LoadEnd = loadavg()
	cfg := r.Cfg
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format+"\n", args...) }
	rel := func(path string) string {
		if x, err := filepath.Rel(r.Root, path); err == nil {
			return x
		}
		return path
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
	mb := func(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/1e6) }
	kbmb := func(b int64) string { // a resumed watch's kilobytes beside a list's megabytes
		if b < 1e6 {
			return fmt.Sprintf("%.1f kB", float64(b)/1e3)
		}
		return mb(b)
	}

	title := "Benchmarks"
	if cfg.Smoke {
		title = "Benchmarks (SMOKE RUN: tiny sizes, 1 s points; checks the program, not the product)"
	}
	p("# %s", title)
	p("")
	p("Written by `cmd/mcs-bench` (`make bench`); raw output of this run in `%s` (git-ignored).", rel(cfg.Raw))
	p("")
	p("## Run")
	p("")
	p("- Command: `%s` (via `make bench`: `env $(tools/install.sh env) MCS_E2E_COREDNS=bin/coredns go run ./cmd/mcs-bench $(BENCH_FLAGS)`)", strings.TrimSpace(cfg.Command))
	m := r.Machine
	p("- Date: %s UTC; took %s", m.Date.Format("2006-01-02 15:04"), r.Took.Round(time.Second))
	p("- Commit: %s", m.Commit)
	p("- Machine: %d CPUs (`nproc`), %s; load average (1/5/15 min) %s at the start, %s at the end", m.CPUs, m.CPUModel, m.LoadStart, m.LoadEnd)
	if len(m.OtherHeavy) > 0 {
		p("- **Not quiet:** %d other test processes (kube-apiserver / e2e) were running when this run started: %s. Figures are noisier than on an idle machine; ratios, taken from interleaved runs, suffer least.", len(m.OtherHeavy), strings.Join(m.OtherHeavy, ", "))
	} else {
		p("- No other kube-apiserver or e2e test process was running when this run started.")
	}
	if m.Busiest != "" {
		p("- Busiest processes at the start (`ps`, CPU %% over each one's life): %s", m.Busiest)
	}
	p("- Tools: %s, dnsperf %s, CoreDNS 1.15.0 (`bin/coredns`, every in-tree plugin plus ours), kube-apiserver v1.34.4, etcd v3.6.16", m.GoVersion, m.DNSPerf)
	mcs := "no ServiceImports (this run does not measure the in-tree plugin)"
	if r.Create.Imports > 0 {
		mcs = fmt.Sprintf("the same services as %d Headless ServiceImports + %d EndpointSlices in %s", r.Create.Imports, r.Create.Slices, r.Create.MCSTook.Round(time.Second))
	}
	p("- Data: %d services in %d namespaces, %d endpoints each (%d exporter Pods), created in a real kube-apiserver (cluster `%s`) in %s (%.0f Pods/s, %d concurrent requests; each Pod is a create and a status patch); %s, and as a hosts file",
		cfg.Services, cfg.Namespaces, cfg.Endpoints, r.Create.Pods, clusterA, r.Create.PodsTook.Round(time.Second),
		float64(r.Create.Pods)/math.Max(r.Create.PodsTook.Seconds(), 1e-9), cfg.Workers, mcs)
	p("- Stages:")
	for _, s := range r.Stages {
		state := ""
		if !s.OK {
			state = " **FAILED**"
		}
		p("  - %s: %s%s", s.Name, s.Took.Round(time.Second), state)
	}
	if len(r.Failures) > 0 {
		p("- **Failures:** %s", strings.Join(r.Failures, "; "))
	}
	p("")

	p("## Targets")
	p("")
	p("| target | measured | |")
	p("|---|---|---|")
	verdict := func(ok bool, measured bool) string {
		switch {
		case !measured:
			return "not measured"
		case ok:
			return "met"
		default:
			return "**missed**"
		}
	}
	for _, mode := range []string{"pinned", "unpinned"} {
		o, h := r.qps(mode, "A", ours), r.qps(mode, "A", hosts)
		p("| ours/hosts >= 0.95 (A, %s) | %s | %s |", mode, ratio(o, h), verdict(o/h >= 0.95, !math.IsNaN(o/h)))
	}
	for _, mode := range []string{"pinned", "unpinned"} {
		for _, q := range []string{"A", "SRV"} {
			o, k := r.qps(mode, q, ours), r.qps(mode, q, intree)
			p("| ours/in-tree multicluster >= 2 (%s, %s) | %s | %s |", q, mode, ratio(o, k), verdict(o/k >= 2, !math.IsNaN(o/k)))
		}
	}
	for _, q := range []string{"A", "SRV"} {
		o, _ := r.cpuPerAnswer("pinned", q, ours)
		k, _ := r.cpuPerAnswer("pinned", q, intree)
		ri := k / o
		p("| ours/in-tree multicluster >= 2 (%s, pinned, by CoreDNS CPU per answer: in-tree's / ours) | %s | %s |", q, ratio(k, o), verdict(ri >= 2, !math.IsNaN(ri)))
	}
	if len(r.Instr) > 0 {
		h, o := r.instrPerAnswer("A", hosts, instrPoint.PerAnswer), r.instrPerAnswer("A", ours, instrPoint.PerAnswer)
		p("| ours/hosts >= 0.95 (A, by instructions per answer under callgrind, GC off: hosts' / ours) | %s | %s |", ratio(h, o), verdict(h/o >= 0.95, !math.IsNaN(h/o)))
		for _, q := range []string{"A", "SRV"} {
			k, o := r.instrPerAnswer(q, intree, instrPoint.PerAnswer), r.instrPerAnswer(q, ours, instrPoint.PerAnswer)
			p("| ours/in-tree multicluster >= 2 (%s, by instructions per answer under callgrind, GC off: in-tree's / ours) | %s | %s |", q, ratio(k, o), verdict(k/o >= 2, !math.IsNaN(k/o)))
		}
	}
	allocs := "see the Go benchmarks below"
	allocOK, allocMeasured := false, false
	for _, l := range r.GoBench {
		if strings.HasPrefix(l, "--- PASS: TestLookupDoesNotAllocate") {
			allocOK, allocMeasured = true, true
		}
		if strings.HasPrefix(l, "BenchmarkServeDNS/") {
			allocs += "; `" + l + "`"
		}
	}
	p("| zero allocations on the answer path beyond the response message | lookup: 0 (TestLookupDoesNotAllocate %s); %s | %s |", map[bool]string{true: "passes", false: "not run"}[allocMeasured], allocs, verdict(allocOK, allocMeasured))
	if c := r.Cold; c != nil && c.Endpoints > 0 {
		loaded := float64(c.HeapLoaded-c.HeapEmpty) / float64(c.Endpoints)
		rendered := float64(c.HeapRendered-c.HeapEmpty) / float64(c.Endpoints)
		p("| <= 200 B heap per endpoint (records, table and index in the running CoreDNS, %d endpoints; answers are rendered when a name is first asked) | %.0f B | %s |", c.Endpoints, loaded, verdict(loaded <= 200, true))
		p("| the same, with every service asked once (every answer rendered and kept) | %.0f B | %s |", rendered, verdict(rendered <= 200, true))
		med := time.Duration(median(durations(c.Runs)) * float64(time.Second))
		at := ""
		if c.Endpoints < 100000 {
			at = fmt.Sprintf(" (only %d endpoints)", c.Endpoints)
		}
		share := ""
		if d, ok := c.snapshotShare(); ok {
			share = fmt.Sprintf(" (the process's own start, timed in turns with it: %s; the snapshot's share: %s)", ms(pct(c.EmptyRuns, 50)), ms(d))
		}
		p("| cold start at 100k <= 300 ms%s | %s median of %d%s | %s |", at, ms(med), len(c.Runs), share, verdict(med <= 300*time.Millisecond, len(c.Runs) > 0 && c.Endpoints >= 100000))
	}
	for _, pr := range r.Prop {
		limit := 200 * time.Millisecond
		if pr.Source == "peer" {
			limit = time.Second
		}
		p("| propagation p99 <= %s (%s) | p99 %s (p50 %s) over %d changes | %s |", limit, pr.Source, ms(pct(pr.Lat, 99)), ms(pct(pr.Lat, 50)), len(pr.Lat), verdict(pct(pr.Lat, 99) <= limit, len(pr.Lat) > 0))
	}
	for _, rs := range []resyncResult{r.Resync, r.Relist} {
		if rs.Probes == 0 {
			continue
		}
		v := verdict(rs.Took <= 5*time.Second && rs.ProbeWrong == 0, rs.Endpoints >= 100000)
		if rs.Endpoints < 100000 && (rs.Took > 5*time.Second || rs.ProbeWrong > 0) {
			v = "**missed** already at this size (100k not measured)"
		}
		warm := ""
		if rs.Restart {
			warm = fmt.Sprintf("; restored after the API server's warm-up of %s", ms(rs.WarmUp))
		}
		p("| resync 100k <= 5 s, no empty answers (%s; here %d endpoints) | %s (%s of it until the first new connection; %s from the API server%s); %d wrong answers of %d probes | %s |", rs.kind(), rs.Endpoints, ms(rs.Took), ms(rs.Reconnect), kbmb(rs.Received), warm, rs.ProbeWrong, rs.Probes, v)
	}
	p("")

	p("## Throughput (dnsperf, QPS, median of %d runs of %s, `-c %d`, contenders interleaved)", cfg.Runs, cfg.Duration, cfg.Clients)
	p("")
	p("Same binary, same server block (`bind`, `errors`, `pprof`; no `cache`), same shuffled query file (every service once, in a fixed random order, looped). Pinned: CoreDNS `taskset -c 0`, dnsperf `taskset -c 1`. `hosts` answers no SRV.")
	p("")
	p("| mode | query | %s | %s | %s | ours/hosts | ours/in-tree |", ours, hosts, intree)
	p("|---|---|---|---|---|---|---|")
	for _, mode := range []string{"pinned", "unpinned"} {
		for _, q := range []string{"A", "SRV"} {
			o, h, k := r.qps(mode, q, ours), r.qps(mode, q, hosts), r.qps(mode, q, intree)
			p("| %s | %s | %s | %s | %s | %s | %s |", mode, q, num(o), num(h), num(k), ratio(o, h), ratio(o, k))
		}
	}
	p("")
	p("CPU per answer: the CoreDNS process's CPU time (user + system, from `/proc/PID/stat`) during a run divided by the queries answered, median of the runs; busy is that CPU time over the run's wall time (100%% is one core). A server that is not busy all the time was waiting for dnsperf: its QPS then shows the load generator's limit, while its CPU per answer still shows its own cost.")
	p("")
	p("| mode | query | %s | %s | %s | hosts/ours | in-tree/ours |", ours, hosts, intree)
	p("|---|---|---|---|---|---|---|")
	for _, mode := range []string{"pinned", "unpinned"} {
		for _, q := range []string{"A", "SRV"} {
			o, ob := r.cpuPerAnswer(mode, q, ours)
			h, hb := r.cpuPerAnswer(mode, q, hosts)
			k, kb := r.cpuPerAnswer(mode, q, intree)
			p("| %s | %s | %s | %s | %s | %s | %s |", mode, q, usBusy(o, ob), usBusy(h, hb), usBusy(k, kb), ratio(h, o), ratio(k, o))
		}
	}
	p("")
	p("Every run (QPS):")
	p("")
	for _, mode := range []string{"pinned", "unpinned"} {
		for _, q := range []string{"A", "SRV"} {
			for _, c := range []string{ours, hosts, intree} {
				ps := r.QPS[mode+"/"+q+"/"+c]
				if len(ps) == 0 {
					continue
				}
				var xs []string
				for _, x := range ps {
					xs = append(xs, fmt.Sprintf("%.0f", x.QPS))
				}
				p("- %s %s %s: %s (%s)", mode, q, c, strings.Join(xs, ", "), ps[0].Rcodes)
			}
		}
	}
	p("")
	if len(r.Instr) > 0 {
		writeInstr(p, r)
	}
	p("## Latency at a fixed rate (%d QPS, %s, pinned; from dnsperf `-v` per-query times)", cfg.Rate, cfg.LatDur)
	p("")
	p("| query | contender | answers | p50 | p99 | max |")
	p("|---|---|---|---|---|---|")
	for _, q := range []string{"A", "SRV"} {
		for _, c := range []string{ours, hosts, intree} {
			l, ok := r.Latency[q+"/"+c]
			if !ok {
				continue
			}
			p("| %s | %s | %d | %.0f µs | %.0f µs | %.0f µs |", q, c, len(l.Latencies), percentile(l.Latencies, 50)*1e6, percentile(l.Latencies, 99)*1e6, percentile(l.Latencies, 100)*1e6)
		}
	}
	p("")

	p("## Memory")
	p("")
	p("Heap: `HeapAlloc` after a GC from the `pprof` listener (`/debug/pprof/heap?debug=1&gc=1`); RSS: `VmRSS` from `/proc/PID/status`.")
	p("")
	p("| contender | when | heap | RSS |")
	p("|---|---|---|---|")
	for _, x := range r.Mem {
		p("| %s | %s | %s | %s |", x.Contender, x.When, mb(x.Heap), mb(x.RSS))
	}
	if a, ok := r.mem(ours, "loaded"); ok {
		if e, ok := r.mem(ours+" (empty)", "loaded"); ok && r.Create.Pods > 0 {
			p("")
			p("Live, our plugin: (heap with the %d endpoints - heap watching an empty cluster) / endpoints = **%.0f B per endpoint**, the informer's cache of slim Pods included (before any query: answers are rendered on first use).",
				r.Create.Pods, float64(a.Heap-e.Heap)/float64(r.Create.Pods))
		}
		if k, ok := r.mem(intree, "loaded"); ok {
			p("The in-tree multicluster reference holds %s of heap for the same services (ServiceImports + EndpointSlices, plus its Service/Namespace informers).", mb(k.Heap))
		}
	}
	if c := r.Cold; c != nil {
		p("")
		p("From the snapshot, no API server (%d endpoints, %d services): heap %s empty, %s loaded, %s with every service asked once: **%.0f B/endpoint loaded, %.0f B/endpoint rendered** (table + index + snapshot store, no informer).",
			c.Endpoints, c.Services, mb(c.HeapEmpty), mb(c.HeapLoaded), mb(c.HeapRendered),
			float64(c.HeapLoaded-c.HeapEmpty)/float64(c.Endpoints), float64(c.HeapRendered-c.HeapEmpty)/float64(c.Endpoints))
		if m, ok := r.mem(ours+" (cold)", "no API server, every service asked once"); ok && m.Top != "" {
			p("")
			p("Where that heap is (in-use space, `go tool pprof -top`; profiles in the raw folder):")
			p("")
			p("```")
			p("%s", strings.TrimSpace(m.Top))
			p("```")
		}
	}
	p("")

	if c := r.Cold; c != nil {
		p("## Cold start from a snapshot")
		p("")
		p("A bbolt snapshot of %d endpoints (%d services x 10), written with `internal/snapshot` and the `internal/table` codec in %s (%s file); CoreDNS started with it and a kubeconfig whose API server does not exist (a closed port). Time from starting the process to the first correct A answer (polled every millisecond); the file is in the page cache (a warm-disk cold start).",
			c.Endpoints, c.Services, c.WriteTook.Round(time.Millisecond), mb(c.FileBytes))
		p("")
		var xs []string
		for _, d := range c.Runs {
			xs = append(xs, ms(d))
		}
		p("Runs: %s; **median %s**.", strings.Join(xs, ", "), ms(time.Duration(median(durations(c.Runs))*float64(time.Second))))
		if d, ok := c.snapshotShare(); ok {
			var es []string
			for _, d := range c.EmptyRuns {
				es = append(es, ms(d))
			}
			p("")
			p("Before each of them, the same start with an empty snapshot (the process itself: Go runtime, every in-tree plugin's init, the server): %s; median %s. The snapshot's share, the median of each pair's difference: **%s**. It is the part of a cold start that this project's code decides, and the one to compare between runs: this machine's speed moves both starts by tens of milliseconds from one quarter hour to the next.", strings.Join(es, ", "), ms(pct(c.EmptyRuns, 50)), ms(d))
		}
		if c.Perf != "" {
			p("")
			p("Where the CPU time of one more cold start goes (`perf record -g` from exec to the first correct answer; `perf report --children --sort symbol`, top lines):")
			p("")
			p("```")
			p("%s", c.Perf)
			p("```")
		}
		p("")
	}
	if len(r.Prop) > 0 {
		p("## Propagation (annotation PATCH to the changed answer)")
		p("")
		p("One CoreDNS with our plugin: `kubeconfig` to `%s` (through a pass-through TCP proxy, the one the resync test cuts; it holds the whole data set) and `peer %s` (a second cluster). Each change patches one Pod's export annotation to a new service name; the time runs from sending the PATCH until that name answers with the Pod's IP (polled every millisecond).", clusterA, clusterB)
		p("")
		p("| source | changes | p50 | p99 | max | PATCH round trip p50 |")
		p("|---|---|---|---|---|---|")
		for _, pr := range r.Prop {
			p("| %s | %d | %s | %s | %s | %s |", pr.Source, len(pr.Lat), ms(pct(pr.Lat, 50)), ms(pct(pr.Lat, 99)), ms(pct(pr.Lat, 100)), ms(pct(pr.API, 50)))
		}
		p("")
	}
	if r.Resync.Probes > 0 || r.Relist.Probes > 0 {
		p("## Resync after a cut link")
		p("")
		p("The link between CoreDNS and `%s`'s API server cut (harness proxy: connections closed, new ones refused); while cut, one Pod's annotation changed. The time runs from restoring the link to the changed answer. A prober asked A for %d existing services throughout (every 2 ms, cut and restore included, until 2 s after the change showed) and counted every answer that was empty, NXDOMAIN or other IPs as wrong. Two cases:", clusterA, 25)
		p("")
		p("- **the watch resumes**: the API server kept running, so its watch cache still holds the change, and CoreDNS's informer resumes its watch from the last version it saw and receives just that change;")
		p("- **every Pod listed again**: the API server was also killed (SIGKILL) and started again while cut, as after a crash, a reboot or an upgrade of the control plane (or a cut longer than the watch cache's window of changes). Its watch cache begins after the last version CoreDNS saw, the watch fails with \"too old resource version\", and the informer lists every Pod again; the records keep being served meanwhile, and the list's changes are applied to them one by one. The link is restored once the new API server's watch cache serves Pods (it first reads every object from etcd; until then it turns watches away): its warm-up is the API server's own and is listed apart, and the resync is what follows a link that comes back to a running API server.")
		p("")
		p("| case | endpoints | cut | API server warm-up | resync | of it, until the first new connection | bytes from the API server | CPU time meanwhile: CoreDNS, kube-apiserver | CoreDNS heap before the cut; RSS: before, peak (anonymous: before, after) | probes | wrong | timeouts or refusals |")
		p("|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, rs := range []resyncResult{r.Resync, r.Relist} {
			if rs.Probes == 0 {
				continue
			}
			warm := "-"
			if rs.Restart {
				warm = ms(rs.WarmUp)
			}
			p("| %s | %d | %s | %s | **%s** | %s | %s | %s, %s | %s; %s, %s (%s, %s) | %d | **%d** | %d |", rs.kind(), rs.Endpoints, rs.CutFor.Round(time.Millisecond), warm, ms(rs.Took), ms(rs.Reconnect), kbmb(rs.Received),
				ms(rs.CPUCoreDNS), ms(rs.CPUAPIServer), mb(rs.Heap), mb(rs.RSSBefore), mb(rs.RSSPeak), mb(rs.AnonBefore), mb(rs.AnonAfter), rs.Probes, rs.ProbeWrong, rs.ProbeErrors)
		}
		p("")
		for _, rs := range []resyncResult{r.Resync, r.Relist} {
			if rs.FirstWrong != "" {
				p("First wrong answer (%s): `%s`", rs.kind(), rs.FirstWrong)
				p("")
			}
		}
		p("The wait until the first new connection is the plugin's retry of refused watches (every 250 ms). After it, a resumed watch brings one event; a list brings every Pod, decoded, cut down to a record and compared with the one the table holds. The peak RSS is VmHWM, reset (`clear_refs`) at the restore and read 2 s after the change showed; the anonymous part (`RssAnon`: heap, stacks; not the binary's pages or the snapshot's memory map) has no peak counter. The heap is `HeapAlloc` after a GC, from the pprof listener, just before the cut. The manifests limit CoreDNS to 170 Mi. CoreDNS's CPU profile through the list (%s from the restore) is `%s`, and kube-apiserver's over the same time `%s`.", relistProfile, rel(filepath.Join(cfg.Raw, "cpu-ours-relist.pprof")), rel(filepath.Join(cfg.Raw, "cpu-apiserver-relist.pprof")))
		p("")
	}
	if r.ProfileTop != "" {
		p("## CPU profile of our CoreDNS under an unlimited A load (pinned)")
		p("")
		p("`go tool pprof -top` of `%s`:", rel(filepath.Join(cfg.Raw, "cpu-ours-A.pprof")))
		p("")
		p("```")
		p("%s", strings.TrimSpace(r.ProfileTop))
		p("```")
		p("")
	}
	if len(r.NewStack) > 0 {
		var xs []string
		for _, n := range r.NewStack {
			xs = append(xs, fmt.Sprintf("%s %.1f%%", n.Contender, n.Percent))
		}
		p("Share of each contender's CPU profile (same load, `-cum`) in `runtime.newstack`, growing the stack of the goroutine that serves each query: %s. `go tool pprof -peek runtime.newstack` on the raw profiles shows which frames trigger it.", strings.Join(xs, ", "))
		p("")
	}
	if len(r.GoBench) > 0 {
		p("## Go benchmarks of the plugin")
		p("")
		p("```")
		for _, l := range r.GoBench {
			p("%s", l)
		}
		p("```")
		p("")
	}
	p("## Start-up to correct answers (every sample service right, A and SRV)")
	p("")
	for _, s := range r.Sync {
		p("- %s, %s: %s", s.Contender, s.Mode, s.Took.Round(time.Millisecond))
	}
	p("")
	return os.WriteFile(cfg.Out, []byte(w.String()), 0o644)
}

// writeInstr writes the callgrind section.
func writeInstr(p func(string, ...any), r *results) {
	cfg := r.Cfg
	p("## Instructions per answer (callgrind)")
	p("")
	p("Each contender's CoreDNS under `valgrind --tool=callgrind` with `GOGC=off`, one after the other, counting only while dnsperf ran (`callgrind_control` switched counting on just before and off just after; `-c 1 -q 20`, whole passes through the same query file, about %d queries a run, %d runs, after one pass that is not counted). The count covers every thread in user space: the server, the plugin and the Go runtime; not the kernel's share of the UDP system calls. It does not change with what else the machine is doing; it is not time (a cache miss and an add count alike).", cfg.InstrQueries, cfg.InstrRuns)
	p("")
	p("Why the collector is off: with it on, the count of one process changed by up to a third from run to run, as a GC cycle fell into a run or not, and as the size new goroutines' stacks start at (the runtime adapts it at each cycle) moved the cost of growing them. With it off, each query's goroutine starts at the smallest stack and grows it the same way every time; the collector's share is given by the heap bytes and allocations per answer (`TotalAlloc` and `Mallocs` from the pprof listener around each run), which is what drives it. Stack growth is the instructions of the runtime's functions that grow a stack (`newstack`, `copystack`, the unwinder and PC-value tables they use).")
	p("")
	p("| query | contender | instructions per answer (min-max) | of them growing stacks | heap per answer |")
	p("|---|---|---|---|---|")
	for _, q := range []string{"A", "SRV"} {
		for _, c := range []string{ours, hosts, intree} {
			med := func(f func(instrPoint) float64) float64 { return r.instrPerAnswer(q, c, f) }
			if math.IsNaN(med(instrPoint.PerAnswer)) {
				continue
			}
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, x := range r.Instr {
				if x.QType == q && x.Contender == c {
					lo, hi = math.Min(lo, x.PerAnswer()), math.Max(hi, x.PerAnswer())
				}
			}
			p("| %s | %s | %s (%.0f-%.0f) | %s | %s B in %.1f allocations |", q, c, num(med(instrPoint.PerAnswer)), lo, hi,
				num(med(func(x instrPoint) float64 { return x.perAnswer(x.StackGrowth) })),
				num(med(func(x instrPoint) float64 { return x.perAnswer(x.AllocBytes) })),
				med(func(x instrPoint) float64 { return x.perAnswer(x.Allocs) }))
		}
	}
	p("")
	p("| query | hosts/ours, instructions | in-tree/ours, instructions | in-tree/ours, the same without stack growth | in-tree/ours, heap bytes per answer |")
	p("|---|---|---|---|---|")
	for _, q := range []string{"A", "SRV"} {
		rat := func(c string, f func(instrPoint) float64) string {
			return ratio(r.instrPerAnswer(q, c, f), r.instrPerAnswer(q, ours, f))
		}
		p("| %s | %s | %s | %s | %s |", q, rat(hosts, instrPoint.PerAnswer), rat(intree, instrPoint.PerAnswer),
			rat(intree, func(x instrPoint) float64 { return x.perAnswer(x.Instr - x.StackGrowth) }),
			rat(intree, func(x instrPoint) float64 { return x.perAnswer(x.AllocBytes) }))
	}
	p("")
	p("Every counted run:")
	p("")
	for _, x := range r.Instr {
		p("- %s %s run %d: %.0f instructions per answer, %.0f of them growing stacks (%d answers, %d lost; %.0f B in %.1f allocations per answer)", x.QType, x.Contender, x.Run,
			x.PerAnswer(), x.perAnswer(x.StackGrowth), x.Answers, x.Lost, x.perAnswer(x.AllocBytes), x.perAnswer(x.Allocs))
	}
	for _, x := range r.Instr {
		if x.Contender == ours && x.QType == "A" && x.Top != "" {
			p("")
			p("Where our CoreDNS's instructions go, A, run %d (`callgrind_annotate`, instructions in each function itself; the whole listing beside `%s` in the raw folder):", x.Run, filepath.Base(x.Dump))
			p("")
			p("```")
			p("%s", x.Top)
			p("```")
			break
		}
	}
	p("")
}

func num(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", x)
}

// usBusy renders a CPU time per answer (seconds) and a busy share.
func usBusy(perAnswer, busy float64) string {
	if math.IsNaN(perAnswer) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f µs (busy %.0f%%)", perAnswer*1e6, busy*100)
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", a/b)
}
