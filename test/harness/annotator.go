package harness

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// annotatorReadyTimeout bounds the wait for a started annotator's /healthz.
const annotatorReadyTimeout = 30 * time.Second

// Annotator is bin/mcs-annotator running as a child process, its metrics and
// health endpoints on a free port of 127.0.0.1.
type Annotator struct {
	Port int    // of /metrics, /healthz and /readyz
	Dir  string // its own temporary folder (the log)

	proc *Process
}

// StartAnnotator runs the annotator against the cluster of kubeconfig with
// the extra flags args (say "--cluster", "edge-a"), with `--listen` on a free
// loopback port, waits until /healthz answers, and stops it by PID in
// t.Cleanup (printing the tail of its log when the test failed). Leader
// election is on unless args turn it off; pass short "--lease-duration",
// "--renew-deadline" and "--retry-period" to make hand-overs quick.
func StartAnnotator(t T, kubeconfig string, args ...string) *Annotator {
	t.Helper()
	tools := RequireTools(t, ToolAnnotator)
	a := &Annotator{Port: FreePort(t), Dir: TempDir(t)}
	all := append([]string{"--kubeconfig", kubeconfig, "--listen", net.JoinHostPort(Loopback, strconv.Itoa(a.Port))}, args...)
	a.proc = newProcess("mcs-annotator", filepath.Join(a.Dir, "annotator.log"), tools.Annotator, all...)
	startProcess(t, a.proc, 60)
	deadline := time.Now().Add(annotatorReadyTimeout)
	for {
		if _, err := a.Get("/healthz"); err == nil {
			break
		} else if time.Now().After(deadline) || !a.proc.Running() {
			t.Fatalf("harness: mcs-annotator did not answer /healthz within %v (running: %v): %v\n%s",
				annotatorReadyTimeout, a.proc.Running(), err, Tail(a.proc.LogPath, 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("harness: mcs-annotator PID %d serves on %s (log %s)", a.proc.PID(), a.Addr(), a.proc.LogPath)
	return a
}

// Addr is the host:port of the annotator's HTTP endpoints.
func (a *Annotator) Addr() string { return net.JoinHostPort(Loopback, strconv.Itoa(a.Port)) }

// Process is the annotator process.
func (a *Annotator) Process() *Process { return a.proc }

// Running tells whether the annotator is running.
func (a *Annotator) Running() bool { return a.proc.Running() }

// Log is the annotator's whole log so far.
func (a *Annotator) Log() string { return Tail(a.proc.LogPath, 1<<20) }

// Stop sends SIGTERM (SIGKILL after a grace period) and waits for the exit.
func (a *Annotator) Stop(t T) {
	t.Helper()
	if err := a.proc.Stop(termGrace); err != nil {
		t.Fatalf("harness: %v", err)
	}
}

// Kill sends sig and waits for the exit.
func (a *Annotator) Kill(t T, sig syscall.Signal) {
	t.Helper()
	if err := a.proc.Kill(sig, termGrace); err != nil {
		t.Fatalf("harness: %v", err)
	}
}

// Get fetches path (/metrics, /healthz, /readyz) from the annotator; a status
// other than 200 is an error.
func (a *Annotator) Get(path string) (string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + a.Addr() + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	return string(b), nil
}

// Metric returns the value of the first sample whose line starts with prefix
// (a metric name, with labels when given: `mcs_annotator_leader`,
// `mcs_annotator_pod_writes_total{result="ok"}`), and whether it was found.
func (a *Annotator) Metric(prefix string) (float64, bool, error) {
	body, err := a.Get("/metrics")
	if err != nil {
		return 0, false, err
	}
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		rest := line[len(prefix):]
		if !strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{") {
			continue // a longer name with the same prefix
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		return v, err == nil, err
	}
	return 0, false, nil
}

// Metrics fetches /metrics and parses it: the metric families by name.
func (a *Annotator) Metrics() (map[string]*dto.MetricFamily, error) {
	body, err := a.Get("/metrics")
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(strings.NewReader(body))
}
