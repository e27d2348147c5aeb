package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

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

// procCPU is the CPU time (user + system, every thread) that process pid
// has used, from /proc/PID/stat, in clock ticks of 10 ms (Linux's USER_HZ
// is 100 on every architecture Go supports).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing parenthesis (state is field 3 of stat(5)).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// CPUPerAnswer is the CoreDNS process's CPU time per answered query.
func (p perf) CPUPerAnswer() time.Duration {
	if p.Completed == 0 {
		return 0
	}
	return p.CPU / time.Duration(p.Completed)
}

var (
	reQPS       = regexp.MustCompile(`Queries per second:\s+([0-9.]+)`)
	reCompleted = regexp.MustCompile(`Queries completed:\s+(\d+)`)
	reLost      = regexp.MustCompile(`Queries lost:\s+(\d+)`)
	reRcodes    = regexp.MustCompile(`Response codes:\s+(.*)`)
	// dnsperf -v prints one line per answered query:
	// "> NOERROR svc-00001.bench-001.svc.clusterset.local A 0.000123"
	reVerbose = regexp.MustCompile(`^> (\S+) (\S+) (\S+) ([0-9.]+)$`)
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
	s := out.String()
	m := reQPS.FindStringSubmatch(s)
	if m == nil {
		return p, fmt.Errorf("dnsperf printed no QPS (output in %s)", o.Raw)
	}
	p.QPS, _ = strconv.ParseFloat(m[1], 64)
	if m := reCompleted.FindStringSubmatch(s); m != nil {
		p.Completed, _ = strconv.Atoi(m[1])
	}
	if m := reLost.FindStringSubmatch(s); m != nil {
		p.Lost, _ = strconv.Atoi(m[1])
	}
	if m := reRcodes.FindStringSubmatch(s); m != nil {
		p.Rcodes = strings.TrimSpace(m[1])
	}
	if o.Verbose {
		sc := bufio.NewScanner(strings.NewReader(s))
		for sc.Scan() {
			if m := reVerbose.FindStringSubmatch(sc.Text()); m != nil {
				if v, err := strconv.ParseFloat(m[4], 64); err == nil {
					p.Latencies = append(p.Latencies, v)
				}
			}
		}
		if len(p.Latencies) == 0 {
			return p, fmt.Errorf("dnsperf -v printed no per-query lines (output in %s)", o.Raw)
		}
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

func durations(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = d.Seconds()
	}
	return out
}

// vmRSS is VmRSS of a process in bytes.
func vmRSS(pid int) (int64, error) { return procStatusBytes(pid, "VmRSS") }

// procStatusBytes reads a size (VmRSS, VmHWM, RssAnon) from /proc/PID/status,
// in bytes.
func procStatusBytes(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == key+":" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no %s for PID %d", key, pid)
}

// resetPeakRSS sets a process's VmHWM (its peak RSS) back to its RSS now, so
// that a later VmHWM is the peak since this call (Linux: clear_refs, 5).
func resetPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

var (
	reHeapAlloc  = regexp.MustCompile(`# HeapAlloc = (\d+)`)
	reTotalAlloc = regexp.MustCompile(`# TotalAlloc = (\d+)`)
	reMallocs    = regexp.MustCompile(`# Mallocs = (\d+)`)
)

// memStats asks CoreDNS's pprof listener for the bytes and the number of
// heap allocations made since the process started (no GC is forced).
func memStats(pprofAddr string) (totalAlloc, mallocs int64, err error) {
	b, err := getHeapDebug(pprofAddr, "")
	if err != nil {
		return 0, 0, err
	}
	m1, m2 := reTotalAlloc.FindSubmatch(b), reMallocs.FindSubmatch(b)
	if m1 == nil || m2 == nil {
		return 0, 0, fmt.Errorf("no TotalAlloc or Mallocs in the heap profile")
	}
	totalAlloc, _ = strconv.ParseInt(string(m1[1]), 10, 64)
	mallocs, _ = strconv.ParseInt(string(m2[1]), 10, 64)
	return totalAlloc, mallocs, nil
}

// getHeapDebug fetches /debug/pprof/heap?debug=1 (the text form, which ends
// with runtime.MemStats), with extra query parameters.
func getHeapDebug(pprofAddr, extra string) ([]byte, error) {
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Get("http://" + pprofAddr + "/debug/pprof/heap?debug=1" + extra)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("heap profile: %s", resp.Status)
	}
	return b, nil
}

// heapAlloc asks CoreDNS's pprof listener for the heap in use after a GC.
func heapAlloc(pprofAddr string) (int64, error) {
	b, err := getHeapDebug(pprofAddr, "&gc=1")
	if err != nil {
		return 0, err
	}
	m := reHeapAlloc.FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("no HeapAlloc in the heap profile")
	}
	return strconv.ParseInt(string(m[1]), 10, 64)
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
	hc := &http.Client{Timeout: d + 30*time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return saveProfile(ctx, b, bin, path, pprofArgs)
}

// apiServerProfile saves a CPU profile of c's kube-apiserver over d (its
// /debug/pprof, as the cluster's admin) into path and returns `go tool
// pprof -top` of it.
func apiServerProfile(ctx context.Context, c *harness.Cluster, path string, d time.Duration) (string, error) {
	cx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	// The cluster's client gives up on a request after 15 s, the profile's
	// length: this one has only the context's deadline.
	rc := rest.CopyConfig(c.Config)
	rc.Timeout = 0
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return "", err
	}
	b, err := client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
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
