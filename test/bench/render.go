package main

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"
	"time"
)

// report.md.tmpl renders BENCHMARKS.md from a results file: one block per
// stage, in the order of the report.
//
//go:embed report.md.tmpl
var reportTemplate string

// saveResults writes what was measured to the run's raw folder as JSON, the
// input of the report (and of -render, which renders it again).
func saveResults(r *results) (string, error) {
	path := filepath.Join(r.Cfg.Raw, "results.json")
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, b, 0o644)
}

// loadResults reads a results file written by saveResults.
func loadResults(path string) (*results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

// writeReport renders r into path.
func writeReport(r *results, path string) error {
	var w strings.Builder
	if err := render(&w, r); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(w.String()), 0o644)
}

// blankLines are the template's gaps between blocks, one blank line in the
// report.
var blankLines = regexp.MustCompile(`\n{3,}`)

func render(w *strings.Builder, r *results) error {
	t, err := template.New("report").Funcs(reportFuncs(r)).Parse(reportTemplate)
	if err != nil {
		return err
	}
	var b strings.Builder
	if err := t.Execute(&b, r); err != nil {
		return err
	}
	w.WriteString(blankLines.ReplaceAllString(b.String(), "\n\n"))
	return nil
}

// reportFuncs are the template's formatting helpers.
func reportFuncs(r *results) template.FuncMap {
	return template.FuncMap{
		"ms":         ms,
		"us":         func(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/1e3) },
		"mb":         mb,
		"kbmb":       kbmb,
		"num":        num,
		"ratio":      ratio,
		"usBusy":     usBusy,
		"pct":        pct,
		"dur":        func(d time.Duration, unit time.Duration) time.Duration { return d.Round(unit) },
		"join":       strings.Join,
		"trim":       strings.TrimSpace,
		"list":       func(xs ...string) []string { return xs },
		"f1":         func(x float64) string { return fmt.Sprintf("%.1f", x) },
		"f0":         func(x float64) string { return fmt.Sprintf("%.0f", x) },
		"pctOf":      func(x float64) string { return fmt.Sprintf("%.1f%%", x*100) },
		"pctl":       func(xs []float64, q float64) string { return fmt.Sprintf("%.0f µs", percentile(xs, q)*1e6) },
		"rel":        func(path string) string { return shown(r.Root, path) },
		"raw":        func(name string) string { return shown(r.Root, filepath.Join(r.Cfg.Raw, name)) },
		"paths":      func(text string) string { return shownIn(r.Root, text) },
		"base":       filepath.Base,
		"contenders": func() []string { return []string{ours, hosts, intree} },
		"ours":       func() string { return ours },
		"hosts":      func() string { return hosts },
		"intree":     func() string { return intree },
		"clusterA":   func() string { return clusterA },
		"clusterB":   func() string { return clusterB },
	}
}

// target is one row of the report's table of targets.
type target struct {
	Name, Measured string
	Met, Known     bool // Known: measured at the size the target names
}

// Verdict is the row's last column.
func (t target) Verdict() string {
	switch {
	case !t.Known:
		return "not measured"
	case t.Met:
		return "met"
	default:
		return "**missed**"
	}
}

// Targets are every stage's rows, in the stages' order.
func (r *results) Targets() []target {
	var ts []target
	for _, s := range stages {
		if s.targets != nil {
			ts = append(ts, s.targets(r)...)
		}
	}
	return ts
}

// shown is how the report names a file: relative to the checkout when it is
// in it, else "…/" and its name. A report is committed and read elsewhere:
// the folders of the machine that ran it mean nothing there.
func shown(root, path string) string {
	if !filepath.IsAbs(path) {
		return path
	}
	if x, err := filepath.Rel(root, path); err == nil && root != "" && x != ".." && !strings.HasPrefix(x, "../") {
		return x
	}
	return "…/" + filepath.Base(path)
}

// absPath is an absolute path in free text (a command line, an error, a
// process list): a slash at the start of a word or after '=', up to a
// space, quote, colon or comma.
var absPath = regexp.MustCompile("(?:^|[\\s\"'=(`])(/[^\\s\"'`():,;]+)")

// shownIn rewrites every absolute path in text as shown does.
func shownIn(root, text string) string {
	var b strings.Builder
	last := 0
	for _, m := range absPath.FindAllStringSubmatchIndex(text, -1) {
		b.WriteString(text[last:m[2]])
		b.WriteString(shown(root, text[m[2]:m[3]]))
		last = m[3]
	}
	b.WriteString(text[last:])
	return b.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
func mb(b int64) string         { return fmt.Sprintf("%.1f MB", float64(b)/1e6) }

// kbmb shows a resumed watch's kilobytes beside a list's megabytes.
func kbmb(b int64) string {
	if b < 1e6 {
		return fmt.Sprintf("%.1f kB", float64(b)/1e3)
	}
	return mb(b)
}

func num(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", x)
}

// usBusy renders the runs' CPU time per answer and busy share.
func usBusy(rs runs) string {
	if math.IsNaN(rs.CPU()) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f µs (busy %.0f%%)", rs.CPU()*1e6, rs.Busy()*100)
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", a/b)
}
