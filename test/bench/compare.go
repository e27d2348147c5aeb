package main

import (
	"fmt"
	"strings"
	"time"
)

// With -compare-coredns, the cold, dns and live stages also run an older
// build of bin/coredns in the same run: the cold and live stages in turns
// (new, old, new, old, ...), the dns stage as one more contender of its
// rotated runs. The report shows each figure of both side by side.

// oldBuild is the build compared with bin/coredns.
type oldBuild struct {
	Path, Commit string
}

// turn is one build's turn of a stage run in turns.
type turn struct {
	Build string // "new" (bin/coredns) or "old" (-compare-coredns)
	N     int    // 1 to CompareTurns
	Bin   string // the coredns binary; "" for bin/coredns
	Tag   string // sets apart one turn's namespaces and files from another's; "" for the first new turn
}

// first tells whether the turn is the stage's own: the first new one, whose
// figures and files are named as without -compare-coredns.
func (t turn) first() bool { return t.Build == "new" && t.N == 1 }

// turns are a stage's turns: bin/coredns once without -compare-coredns,
// else CompareTurns of each build, new then old.
func turns(cfg config) []turn {
	if cfg.CompareCoreDNS == "" {
		return []turn{{Build: "new", N: 1}}
	}
	var ts []turn
	for n := 1; n <= cfg.CompareTurns; n++ {
		ts = append(ts, turn{"new", n, "", fmt.Sprintf("-%d-new", n)}, turn{"old", n, cfg.CompareCoreDNS, fmt.Sprintf("-%d-old", n)})
	}
	ts[0].Tag = ""
	return ts
}

// compareRow is one figure of a side-by-side table: every turn's value of
// each build, in Unit: "ms" (values in seconds), "MB" (bytes), "B" (bytes
// per endpoint) or "QPS".
type compareRow struct {
	Name     string
	Unit     string
	New, Old []float64
}

// Cell renders one build's values: the median, then every turn's.
func (c compareRow) Cell(xs []float64) string {
	if len(xs) == 0 {
		return "n/a"
	}
	show := func(x float64) string { return ms(time.Duration(x * float64(time.Second))) }
	switch c.Unit {
	case "MB":
		show = func(x float64) string { return mb(int64(x)) }
	case "B":
		show = func(x float64) string { return fmt.Sprintf("%.0f B", x) }
	case "QPS":
		show = func(x float64) string { return fmt.Sprintf("%.0f", x) }
	}
	var each []string
	for _, x := range xs {
		each = append(each, show(x))
	}
	return fmt.Sprintf("**%s** (%s)", show(percentile(xs, 50)), strings.Join(each, ", "))
}

// Ratio is the old build's median over the new one's.
func (c compareRow) Ratio() string {
	return ratio(percentile(c.Old, 50), percentile(c.New, 50))
}

// figure is one row of a comparison: its value in one turn's results, and
// whether that turn measured it.
type figure[R any] struct {
	name, unit string
	f          func(R) (float64, bool)
}

// durFigure is a figure measured as a duration.
func durFigure[R any](name string, f func(R) (time.Duration, bool)) figure[R] {
	return figure[R]{name, "ms", func(r R) (float64, bool) { d, ok := f(r); return d.Seconds(), ok }}
}

// compareRows are the figures' rows over the turns, each build's values in
// the turns' order; build names a turn's build.
func compareRows[R any](runs []R, build func(R) string, figures []figure[R]) []compareRow {
	var rows []compareRow
	for _, fg := range figures {
		row := compareRow{Name: fg.name, Unit: fg.unit}
		for _, r := range runs {
			x, ok := fg.f(r)
			switch {
			case !ok:
			case build(r) == "new":
				row.New = append(row.New, x)
			default:
				row.Old = append(row.Old, x)
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// Old is the build compared with bin/coredns, nil without one (a results
// file written before the cold and dns stages compared names it in the live
// stage only).
func (r *results) Old() *oldBuild {
	if r.OldBuild != nil {
		return r.OldBuild
	}
	if r.Live != nil && r.Live.Compare != nil {
		return &oldBuild{r.Live.Compare.Old, r.Live.Compare.OldCommit}
	}
	return nil
}

// Rows are the cold stage's figures of both builds.
func (c *coldResult) Rows() []compareRow {
	if c.Compare == nil {
		return nil
	}
	perEndpoint := func(name string, heap func(coldRun) int64) figure[coldRun] {
		return figure[coldRun]{name, "B", func(r coldRun) (float64, bool) {
			return float64(heap(r)-r.HeapEmpty) / float64(c.Endpoints), heap(r) > 0 && c.Endpoints > 0
		}}
	}
	return compareRows(c.Compare.Runs, func(r coldRun) string { return r.Build }, []figure[coldRun]{
		perEndpoint("heap per endpoint, snapshot loaded", func(r coldRun) int64 { return r.HeapLoaded }),
		perEndpoint("heap per endpoint, every service asked once", func(r coldRun) int64 { return r.HeapRendered }),
		{"heap, empty snapshot", "MB", func(r coldRun) (float64, bool) { return float64(r.HeapEmpty), r.HeapEmpty > 0 }},
		durFigure("cold start (median of the turn's starts)", func(r coldRun) (time.Duration, bool) { return pct(r.Runs, 50), len(r.Runs) > 0 }),
		durFigure("the same start with an empty snapshot", func(r coldRun) (time.Duration, bool) {
			return pct(r.EmptyRuns, 50), len(r.EmptyRuns) > 0
		}),
		durFigure("the snapshot's share (median of the pairs' differences)", coldRun.snapshotShare),
	})
}

// qpsRow is one dnsperf point of both builds beside hosts.
type qpsRow struct {
	Mode, QType     string
	New, Old, Hosts runs
}

// Row shows the point's runs of both builds.
func (q qpsRow) Row() compareRow {
	each := func(rs runs) []float64 {
		var xs []float64
		for _, p := range rs {
			xs = append(xs, p.QPS)
		}
		return xs
	}
	return compareRow{Unit: "QPS", New: each(q.New), Old: each(q.Old)}
}

// CompareQPS are the points the old build ran, each beside bin/coredns's
// and hosts'.
func (d *dnsResult) CompareQPS() []qpsRow {
	var qs []qpsRow
	for _, mode := range []string{"pinned", "unpinned"} {
		for _, q := range []string{"A", "SRV"} {
			if old := d.Runs(mode, q, oursOld); len(old) > 0 {
				qs = append(qs, qpsRow{mode, q, d.Runs(mode, q, ours), old, d.Runs(mode, q, hosts)})
			}
		}
	}
	return qs
}
