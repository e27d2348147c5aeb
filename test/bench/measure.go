package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
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

// perf is one dnsperf run.
type perf struct {
	QPS       float64
	Completed int
	Lost      int
	Rcodes    string // "NOERROR 1234 (100.00%)"
	Latencies []float64
	Raw       string        // path of the raw output
	CPU       time.Duration // the CoreDNS process's CPU time (user + system) during the run
	Took      time.Duration // the run's wall time
}

// CPUPerAnswer is the CoreDNS process's CPU time per answered query.
func (p perf) CPUPerAnswer() time.Duration {
	if p.Completed == 0 {
		return 0
	}
	return p.CPU / time.Duration(p.Completed)
}

// runs are the dnsperf runs of one point.
type runs []perf

// QPS is the median QPS of the runs, NaN when there are none.
func (rs runs) QPS() float64 { return rs.median(func(p perf) (float64, bool) { return p.QPS, true }) }

// CPU is the median CoreDNS CPU time per answered query, in seconds.
func (rs runs) CPU() float64 {
	return rs.median(func(p perf) (float64, bool) { return p.CPUPerAnswer().Seconds(), p.CPU > 0 && p.Completed > 0 })
}

// Busy is the median share of a run's wall time that CoreDNS was on a CPU.
func (rs runs) Busy() float64 {
	return rs.median(func(p perf) (float64, bool) { return p.CPU.Seconds() / p.Took.Seconds(), p.CPU > 0 && p.Took > 0 })
}

func (rs runs) median(f func(perf) (float64, bool)) float64 {
	var xs []float64
	for _, p := range rs {
		if x, ok := f(p); ok {
			xs = append(xs, x)
		}
	}
	if len(xs) == 0 {
		return math.NaN()
	}
	return median(xs)
}

var (
	// reSummary matches a line of dnsperf's summary ("  Queries lost: 0 (0.00%)").
	reSummary = regexp.MustCompile(`(?m)^\s*(Queries per second|Queries completed|Queries lost|Response codes):\s+(\S.*?)\s*$`)
	// dnsperf -v prints one line per answered query:
	// "> NOERROR svc-00001.bench-001.svc.clusterset.local A 0.000123"
	reVerbose = regexp.MustCompile(`(?m)^> \S+ \S+ \S+ ([0-9.]+)$`)
)

// dnsperfOpts is how to run dnsperf.
type dnsperfOpts struct {
	Port     int
	File     string
	Duration time.Duration
	Clients  int
	Pin      string // taskset CPU list for dnsperf, "" for none
	Rate     int    // -Q: queries per second, 0 for as fast as possible
	Passes   int    // -n: stop after this many passes through File (Duration still bounds the run); 0 for no limit
	Window   int    // -q: most queries outstanding at once; 0 for dnsperf's default (100)
	Verbose  bool   // -v: per-query output, for latency percentiles
	Raw      string // where to keep the output
}

// runDNSPerf runs dnsperf and parses its summary (and, with Verbose, the
// latency of every answered query).
func runDNSPerf(ctx context.Context, o dnsperfOpts) (perf, error) {
	args := []string{"-s", "127.0.0.1", "-p", strconv.Itoa(o.Port), "-d", o.File,
		"-l", strconv.Itoa(int(o.Duration.Seconds())), "-c", strconv.Itoa(o.Clients), "-t", "2"}
	if o.Rate > 0 {
		args = append(args, "-Q", strconv.Itoa(o.Rate))
	}
	if o.Passes > 0 {
		args = append(args, "-n", strconv.Itoa(o.Passes))
	}
	if o.Window > 0 {
		args = append(args, "-q", strconv.Itoa(o.Window))
	}
	if o.Verbose {
		args = append(args, "-v")
	}
	bin := "dnsperf"
	if o.Pin != "" {
		args = append([]string{"-c", o.Pin, bin}, args...)
		bin = "taskset"
	}
	cx, cancel := context.WithTimeout(ctx, o.Duration+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	p := perf{Raw: o.Raw}
	if werr := os.WriteFile(o.Raw, append([]byte("$ "+bin+" "+strings.Join(args, " ")+"\n"), out.Bytes()...), 0o644); werr != nil {
		return p, werr
	}
	if err != nil {
		return p, fmt.Errorf("%s: %v (output in %s)", bin, err, o.Raw)
	}
	return parseDNSPerf(p, out.String(), o.Verbose)
}

// parseDNSPerf reads dnsperf's summary, and with verbose (-v) the latency
// of every answered query, into p; p.Raw names the output in errors.
func parseDNSPerf(p perf, out string, verbose bool) (perf, error) {
	sum := map[string]string{}
	for _, m := range reSummary.FindAllStringSubmatch(out, -1) {
		sum[m[1]] = m[2]
	}
	if _, ok := sum["Queries per second"]; !ok {
		return p, fmt.Errorf("dnsperf printed no QPS (output in %s)", p.Raw)
	}
	p.QPS, _ = strconv.ParseFloat(sum["Queries per second"], 64)
	p.Completed, _ = strconv.Atoi(strings.Fields(sum["Queries completed"] + " 0")[0])
	p.Lost, _ = strconv.Atoi(strings.Fields(sum["Queries lost"] + " 0")[0])
	p.Rcodes = sum["Response codes"]
	for _, m := range reVerbose.FindAllStringSubmatch(out, -1) {
		if v, err := strconv.ParseFloat(m[1], 64); err == nil {
			p.Latencies = append(p.Latencies, v)
		}
	}
	if verbose && len(p.Latencies) == 0 {
		return p, fmt.Errorf("dnsperf -v printed no per-query lines (output in %s)", p.Raw)
	}
	return p, nil
}

// percentile is the nearest-rank percentile q (0..100) of xs.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	k := int(q/100*float64(len(s))+0.999999) - 1
	k = max(0, min(k, len(s)-1))
	return s[k]
}

func median(xs []float64) float64 { return percentile(xs, 50) }

// pct is the percentile q of durations, to 0.1 ms.
func pct(ds []time.Duration, q float64) time.Duration {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = d.Seconds()
	}
	return time.Duration(percentile(xs, q) * float64(time.Second)).Round(100 * time.Microsecond)
}

var reMemStat = regexp.MustCompile(`(?m)^# (\w+) = (\d+)$`)

// memStats asks CoreDNS's pprof listener for its runtime.MemStats (the end
// of /debug/pprof/heap?debug=1), after a GC when gc is true.
func memStats(pprofAddr string, gc bool) (map[string]int64, error) {
	url := "http://" + pprofAddr + "/debug/pprof/heap?debug=1"
	if gc {
		url += "&gc=1"
	}
	b, err := get(url, 30*time.Second)
	if err != nil {
		return nil, err
	}
	m := map[string]int64{}
	for _, kv := range reMemStat.FindAllSubmatch(b, -1) {
		m[string(kv[1])], _ = strconv.ParseInt(string(kv[2]), 10, 64)
	}
	if m["HeapAlloc"] == 0 || m["Mallocs"] == 0 {
		return nil, fmt.Errorf("no HeapAlloc or Mallocs in the heap profile")
	}
	return m, nil
}

// heapAlloc asks CoreDNS's pprof listener for the heap in use after a GC.
func heapAlloc(pprofAddr string) (int64, error) {
	m, err := memStats(pprofAddr, true)
	return m["HeapAlloc"], err
}

// get fetches url; a status other than 200 is an error.
func get(url string, timeout time.Duration) ([]byte, error) {
	hc := &http.Client{Timeout: timeout}
	resp, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", url, resp.Status)
	}
	return b, err
}

// cpuProfile takes a CPU profile of d seconds into path and returns
// `go tool pprof -top` of it (and keeps a -cum listing beside it).
func cpuProfile(ctx context.Context, pprofAddr, bin, path string, d time.Duration) (string, error) {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", pprofAddr, int(d.Seconds()))
	return profile(ctx, url, bin, path, d, nil)
}

// heapProfile saves the in-use heap profile (as of the last GC) into path and
// returns `go tool pprof -top` of its in-use space.
func heapProfile(ctx context.Context, pprofAddr, bin, path string) (string, error) {
	return profile(ctx, "http://"+pprofAddr+"/debug/pprof/heap", bin, path, 0, []string{"-sample_index=inuse_space"})
}

func profile(ctx context.Context, url, bin, path string, d time.Duration, pprofArgs []string) (string, error) {
	b, err := get(url, d+30*time.Second)
	if err != nil {
		return "", err
	}
	return saveProfile(ctx, b, bin, path, pprofArgs)
}

// apiServerProfile saves a CPU profile of c's kube-apiserver over d (its
// /debug/pprof, as the cluster's admin) into path and returns `go tool
// pprof -top` of it.
func apiServerProfile(ctx context.Context, c *harness.Cluster, path string, d time.Duration) (string, error) {
	cx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	b, err := c.WatchClient.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", strconv.Itoa(int(d.Seconds()))).MaxRetries(0).DoRaw(cx)
	if err != nil {
		return "", fmt.Errorf("kube-apiserver's profile: %w", err)
	}
	return saveProfile(ctx, b, harness.FindTools().APIServer, path, nil)
}

// saveProfile writes the profile b into path, with `go tool pprof -top`
// listings (by own and by cumulative time) beside it, and returns the first.
func saveProfile(ctx context.Context, b []byte, bin, path string, pprofArgs []string) (string, error) {
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "", err
	}
	cx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	top := func(extra ...string) ([]byte, error) {
		args := append([]string{"tool", "pprof", "-top"}, pprofArgs...)
		args = append(args, extra...)
		return exec.CommandContext(cx, "go", append(args, bin, path)...).CombinedOutput()
	}
	out, err := top("-nodecount=25")
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %v: %s", err, out)
	}
	base := filepath.Join(filepath.Dir(path), strings.TrimSuffix(filepath.Base(path), filepath.Ext(path)))
	_ = os.WriteFile(base+".top.txt", out, 0o644)
	if cum, err := top("-cum", "-nodecount=80"); err == nil {
		_ = os.WriteFile(base+".top-cum.txt", cum, 0o644)
	}
	return string(out), nil
}
