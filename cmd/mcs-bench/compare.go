package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// liveRun is what one CoreDNS measured in the live stage.
type liveRun struct {
	Build          string `json:",omitempty"` // "new" (bin/coredns) or "old" (-compare-coredns), in turns
	Turn           int    `json:",omitempty"`
	Prop           []propResult
	Resync, Relist resyncResult
}

// compareResult is the live stage in turns against an older build (issue 27:
// "re-measure the resync figures against the code before, in turns").
type compareResult struct {
	Old, OldCommit string
	Runs           []liveRun
}

// liveChanges runs the live stage on bin/coredns or, with -compare-coredns,
// CompareTurns times on each build, new then old, and keeps the first new
// run as the stage's figures.
func liveChanges(b *harness.Program, res *results, w *world) {
	cfg := res.Cfg
	proxy := harness.StartProxy(b, w.a.APIServerAddr())
	keep := func(r liveRun) { res.Prop, res.Resync, res.Relist = r.Prop, r.Resync, r.Relist }
	if cfg.CompareCoreDNS == "" {
		keep(liveTurn(b, res, w, proxy, "", ""))
		return
	}
	old, err := filepath.Abs(cfg.CompareCoreDNS)
	if err != nil {
		b.Fatalf("%v", err)
	}
	res.Compare = &compareResult{Old: old, OldCommit: commitOf(filepath.Dir(old))}
	for turn := 1; turn <= cfg.CompareTurns; turn++ {
		for _, build := range []string{"new", "old"} {
			bin := map[string]string{"old": old}[build]
			b.Logf("turn %d of %d: %s build", turn, cfg.CompareTurns, build)
			tag := fmt.Sprintf("-%d-%s", turn, build)
			if turn == 1 && build == "new" {
				tag = "" // the stage's own figures, named as without -compare-coredns
			}
			r := liveTurn(b, res, w, proxy, bin, tag)
			r.Build, r.Turn = build, turn
			res.Compare.Runs = append(res.Compare.Runs, r)
			if turn == 1 && build == "new" {
				keep(r)
			}
		}
	}
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

// compareRow is one figure of the side-by-side table: every turn's value of
// each build and their medians.
type compareRow struct {
	Name     string
	New, Old []time.Duration
}

// Cell renders one build's values: the median, then every turn's.
func (c compareRow) Cell(xs []time.Duration) string {
	if len(xs) == 0 {
		return "n/a"
	}
	var each []string
	for _, x := range xs {
		each = append(each, ms(x))
	}
	return fmt.Sprintf("**%s** (%s)", ms(pct(xs, 50)), strings.Join(each, ", "))
}

// Ratio is the old build's median over the new one's.
func (c compareRow) Ratio() string {
	return ratio(pct(c.Old, 50).Seconds(), pct(c.New, 50).Seconds())
}

// Rows are the figures of the comparison.
func (c *compareResult) Rows() []compareRow {
	type figure struct {
		name string
		f    func(r liveRun) (time.Duration, bool)
	}
	figures := []figure{
		{"resync, the watch resumes", func(r liveRun) (time.Duration, bool) { return r.Resync.Took, r.Resync.Probes > 0 }},
		{"resync, every Pod listed again", func(r liveRun) (time.Duration, bool) { return r.Relist.Took, r.Relist.Probes > 0 }},
		{"of the list, until the first new connection", func(r liveRun) (time.Duration, bool) { return r.Relist.Reconnect, r.Relist.Probes > 0 }},
		{"CoreDNS CPU time through the list", func(r liveRun) (time.Duration, bool) { return r.Relist.CPUCoreDNS, r.Relist.Probes > 0 }},
	}
	for _, side := range []string{"local", "peer"} {
		for _, q := range []float64{50, 99} {
			figures = append(figures, figure{fmt.Sprintf("propagation p%.0f, %s", q, side), func(r liveRun) (time.Duration, bool) {
				for _, p := range r.Prop {
					if p.Source == side && len(p.Lat) > 0 {
						return pct(p.Lat, q), true
					}
				}
				return 0, false
			}})
		}
	}
	var rows []compareRow
	for _, fg := range figures {
		row := compareRow{Name: fg.name}
		for _, r := range c.Runs {
			if d, ok := fg.f(r); ok && r.Build == "new" {
				row.New = append(row.New, d)
			} else if ok {
				row.Old = append(row.Old, d)
			}
		}
		rows = append(rows, row)
	}
	return rows
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
