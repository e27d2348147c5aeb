package main

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// The targets of issue 6, one function per stage: each reads what its
// stage measured and returns its rows of the report's table of targets.

func dnsTargets(r *results) []target {
	d := r.DNS
	if d == nil {
		return nil
	}
	var ts []target
	for _, mode := range []string{"pinned", "unpinned"} {
		o, h := d.Runs(mode, "A", ours).QPS(), d.Runs(mode, "A", hosts).QPS()
		ts = append(ts, target{fmt.Sprintf("ours/hosts >= 0.95 (A, %s)", mode), ratio(o, h), o/h >= 0.95, !math.IsNaN(o / h)})
	}
	for _, mode := range []string{"pinned", "unpinned"} {
		for _, q := range []string{"A", "SRV"} {
			o, k := d.Runs(mode, q, ours).QPS(), d.Runs(mode, q, intree).QPS()
			ts = append(ts, target{fmt.Sprintf("ours/in-tree multicluster >= 2 (%s, %s)", q, mode), ratio(o, k), o/k >= 2, !math.IsNaN(o / k)})
		}
	}
	for _, q := range []string{"A", "SRV"} {
		o, k := d.Runs("pinned", q, ours).CPU(), d.Runs("pinned", q, intree).CPU()
		ts = append(ts, target{fmt.Sprintf("ours/in-tree multicluster >= 2 (%s, pinned, by CoreDNS CPU per answer: in-tree's / ours)", q), ratio(k, o), k/o >= 2, !math.IsNaN(k / o)})
	}
	return ts
}

func instrTargets(r *results) []target {
	if len(r.Instr) == 0 {
		return nil
	}
	h, o := r.Instr.Figure("A", hosts, "all"), r.Instr.Figure("A", ours, "all")
	ts := []target{{"ours/hosts >= 0.95 (A, by instructions per answer under callgrind, GC off: hosts' / ours)", ratio(h, o), h/o >= 0.95, !math.IsNaN(h / o)}}
	for _, q := range []string{"A", "SRV"} {
		k, o := r.Instr.Figure(q, intree, "all"), r.Instr.Figure(q, ours, "all")
		ts = append(ts, target{fmt.Sprintf("ours/in-tree multicluster >= 2 (%s, by instructions per answer under callgrind, GC off: in-tree's / ours)", q), ratio(k, o), k/o >= 2, !math.IsNaN(k / o)})
	}
	return ts
}

func goBenchTargets(r *results) []target {
	allocs := "see the Go benchmarks below"
	passed := false
	for _, l := range r.GoBench {
		if strings.HasPrefix(l, "--- PASS: TestLookupDoesNotAllocate") {
			passed = true
		}
		if strings.HasPrefix(l, "BenchmarkServeDNS/") {
			allocs += "; `" + l + "`"
		}
	}
	state := map[bool]string{true: "passes", false: "not run"}[passed]
	return []target{{"zero allocations on the answer path beyond the response message", "lookup: 0 (TestLookupDoesNotAllocate " + state + "); " + allocs, passed, passed}}
}

func coldTargets(r *results) []target {
	c := r.Cold
	if c == nil || c.Endpoints == 0 {
		return nil
	}
	loaded, rendered := c.PerEndpoint(c.HeapLoaded), c.PerEndpoint(c.HeapRendered)
	ts := []target{
		{fmt.Sprintf("<= 200 B heap per endpoint (records, table and index in the running CoreDNS, %d endpoints; answers are rendered when a name is first asked)", c.Endpoints), fmt.Sprintf("%.0f B", loaded), loaded <= 200, true},
		{"the same, with every service asked once (every answer rendered and kept)", fmt.Sprintf("%.0f B", rendered), rendered <= 200, true},
	}
	med := pct(c.Runs, 50)
	at := ""
	if c.Endpoints < 100000 {
		at = fmt.Sprintf(" (only %d endpoints)", c.Endpoints)
	}
	share := ""
	if d, ok := c.snapshotShare(); ok {
		share = fmt.Sprintf(" (the process's own start, timed in turns with it: %s; the snapshot's share: %s)", ms(pct(c.EmptyRuns, 50)), ms(d))
	}
	return append(ts, target{fmt.Sprintf("cold start at 100k <= 300 ms%s", at), fmt.Sprintf("%s median of %d%s", ms(med), len(c.Runs), share),
		med <= 300*time.Millisecond, len(c.Runs) > 0 && c.Endpoints >= 100000})
}

func liveTargets(r *results) []target {
	if r.Live == nil {
		return nil
	}
	var ts []target
	for _, pr := range r.Live.Prop {
		limit := 200 * time.Millisecond
		if pr.Source == "peer" {
			limit = time.Second
		}
		ts = append(ts, target{fmt.Sprintf("propagation p99 <= %s (%s)", limit, pr.Source),
			fmt.Sprintf("p99 %s (p50 %s) over %d changes", ms(pct(pr.Lat, 99)), ms(pct(pr.Lat, 50)), len(pr.Lat)),
			pct(pr.Lat, 99) <= limit, len(pr.Lat) > 0})
	}
	for _, rs := range r.Live.ResyncRows() {
		t := target{Met: rs.Took <= 5*time.Second && rs.ProbeWrong == 0, Known: rs.Endpoints >= 100000}
		t.Name = fmt.Sprintf("resync 100k <= 5 s, no empty answers (%s; here %d endpoints)", rs.Kind(), rs.Endpoints)
		warm := ""
		if rs.Restart {
			warm = fmt.Sprintf("; restored after the API server's warm-up of %s", ms(rs.WarmUp))
		}
		reconnect := ms(rs.Reconnect) + " of it until the first new connection"
		if rs.Reconnect < 0 {
			reconnect = "no new connection"
		}
		t.Measured = fmt.Sprintf("%s (%s; %s from the API server%s); %d wrong answers of %d probes",
			ms(rs.Took), reconnect, kbmb(rs.Received), warm, rs.ProbeWrong, rs.Probes)
		if !t.Known && !t.Met {
			t.Known, t.Name = true, t.Name+": **missed** already at this size"
		}
		ts = append(ts, t)
	}
	return ts
}

func probeTargets(r *results) []target {
	p := r.Probe
	if p == nil {
		return nil
	}
	var ts []target
	if n := len(p.Failover); n > 0 {
		worst := pct(p.Failover, 100)
		ts = append(ts, target{"failover <= 5 s with the probe defaults (an endpoint's listener stopped, its peer cut off, to the last answer holding it)",
			fmt.Sprintf("p50 %s, max %s over %d", ms(pct(p.Failover, 50)), ms(worst), n), worst <= 5*time.Second, true})
	}
	if on, off := p.On.QPS(), p.Off.QPS(); !math.IsNaN(on / off) {
		ts = append(ts, target{fmt.Sprintf("QPS with `probe all` / without >= 0.95 (A, pinned, %d asked endpoints probed)", p.Endpoints),
			ratio(on, off), on/off >= 0.95, p.Endpoints >= 10000})
	}
	return ts
}
