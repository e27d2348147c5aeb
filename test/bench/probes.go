package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// probeResult is what the probe scenarios measured (issue 24).
type probeResult struct {
	Failover []time.Duration // listener stopped to the last answer holding its IP, probe defaults

	// Probe cost: two CoreDNS over the same snapshot, probing on (`probe
	// all`, defaults) and off, every service asked; CPU of each over Window.
	Endpoints, Services int
	Net                 string // the endpoints' addresses
	Port                int    // their listeners' port
	Window              time.Duration
	CPUOn, CPUOff       time.Duration
	Accepted            int64 // connections the listeners accepted in the window: the probes made
	WrongAfter          int   // services not answering every endpoint after the QPS turns
	On, Off             runs  // dnsperf runs with probing on and off, in turns
	// Answer latency at the fixed rate Cfg.Rate (not saturating), "on"/"off"
	// -> runs, in turns: what clients feel of the probing.
	Latency map[string][]latencyRun
}

// latencyRun is one fixed-rate run's answer latency.
type latencyRun struct {
	P50, P99 time.Duration
	Answers  int
	Lost     int
	CPU      time.Duration // CoreDNS's
}

// Rounds is the number of probe rounds in the window: probes made over endpoints.
func (p *probeResult) Rounds() float64 { return float64(p.Accepted) / float64(max(1, p.Endpoints)) }

// CPUPerSecond is a CPU time over the window, as a share of one core.
func (p *probeResult) CPUPerSecond(cpu time.Duration) float64 {
	return cpu.Seconds() / p.Window.Seconds()
}

// RoundEvery is the window over the rounds in it: how often an endpoint is probed.
func (p *probeResult) RoundEvery() time.Duration {
	return time.Duration(float64(p.Window) / math.Max(p.Rounds(), 1e-9))
}

// CPUPerRound is the CPU that probing added (on less off) per round.
func (p *probeResult) CPUPerRound() time.Duration {
	if p.Rounds() == 0 {
		return 0
	}
	return time.Duration(float64(p.CPUOn-p.CPUOff) / p.Rounds())
}

func (r *results) probe() *probeResult {
	if r.Probe == nil {
		r.Probe = &probeResult{}
	}
	return r.Probe
}

// probeFailover is harness.MeasureProbeFailovers: its own two clusters, a
// CoreDNS probing with the defaults, one endpoint's listener stopped
// ProbeRepeats times.
func probeFailover(b *harness.Program, res *results) {
	scoped(b, func(t *harness.Program) {
		ds, err := harness.MeasureProbeFailovers(t, res.Cfg.ProbeRepeats)
		res.probe().Failover = ds
		if err != nil {
			t.Fatalf("failover: %v", err)
		}
		b.Logf("failover with the probe defaults: %v", ds)
	})
}

// probeCost starts a TCP listener for each of ProbeEndpoints endpoints (on
// addresses of 127.201.0.0/16, one each), writes them into a snapshot, and
// starts two CoreDNS on it, on CPU 0, with an API server that is not there:
// one with `probe all`, one without. With every service asked and this
// program on CPU 1, it reads both processes' CPU time over ProbeWindow and
// counts the connections the listeners accept; then it runs dnsperf (on CPU
// 1) against each in turns, the other stopped (SIGSTOP) meanwhile so that
// neither's work falls into the other's runs; then, the same way, dnsperf at
// the fixed rate Rate, for the answers' latency.
func probeCost(ctx context.Context, b *harness.Program, res *results) {
	cfg := res.Cfg
	scoped(b, func(t *harness.Program) {
		ds := dataset{cluster: clusterA, services: max(1, cfg.ProbeEndpoints/10), endpoints: 10, namespaces: 50, loopback: true}
		p := res.probe()
		p.Endpoints, p.Services, p.Net, p.Port, p.Window = ds.total(), ds.services, "127.201.0.0/16", targetPort, cfg.ProbeWindow
		ls := make([]*harness.Listener, 0, ds.total())
		for i := 0; i < ds.services; i++ {
			for j := 0; j < ds.endpoints; j++ {
				ls = append(ls, harness.StartListener(t, ds.ip(i, j).String(), targetPort))
			}
		}
		accepted := func() (n int64) {
			for _, l := range ls {
				n += l.Accepted()
			}
			return n
		}
		dir := harness.TempDir(t)
		kc := unreachableKubeconfig(t, dir)
		queries := filepath.Join(cfg.Raw, "queries-probe-A.txt")
		if err := ds.writeQueryFile(queries, "A"); err != nil {
			t.Fatalf("%v", err)
		}
		cs := map[string]*contender{}
		for _, which := range []string{"off", "on"} {
			extra := ""
			if which == "on" {
				extra = "        probe all allow 127.201.0.0/16\n"
			}
			own := filepath.Join(dir, which+".db") // each its own: a store locks its file
			writeSnapshot(t, ds, own)
			c := &contender{Name: ours + " (probe " + which + ")", tmpl: oursCorefile, vars: map[string]string{
				"CLUSTER": clusterA, "KUBECONFIG": kc, "EXTRA": extra, "SNAPSHOT": own}}
			c.start(t, c.pinWrapper(t, dir), ds, sampleOf(ds, 25), startBound)
			defer c.keepLog(cfg.Raw, "probe-"+which)
			defer c.stop(t)
			for i := 0; i < ds.services; i++ { // every service asked: its endpoints are probed
				if bad := check(c, ds, i, dns.TypeA); bad != "" {
					t.Fatalf("%s: %s", c.Name, bad)
				}
			}
			cs[which] = c
		}
		harness.Eventually(t, time.Minute, func() error {
			n := 0
			for _, l := range ls {
				if l.Accepted() == 0 {
					n++
				}
			}
			if n > 0 {
				return fmt.Errorf("%d of %d endpoints not probed yet", n, len(ls))
			}
			return nil
		})
		// The endpoints' side (the listeners' accepts) kept off CoreDNS's CPU,
		// as remote endpoints would be.
		defer pinSelf(t, "1")()
		on, off := cs["on"].d.Process(), cs["off"].d.Process()
		a0, cpu0 := accepted(), cpuOf(t, on, off)
		ctxSleep(ctx, cfg.ProbeWindow)
		a1, cpu1 := accepted(), cpuOf(t, on, off)
		p.Accepted, p.CPUOn, p.CPUOff = a1-a0, cpu1[0]-cpu0[0], cpu1[1]-cpu0[1]
		b.Logf("probing %d endpoints for %s: %d probes (%.1f rounds); CPU: probing %s, not probing %s (%.1f ms per round)",
			p.Endpoints, cfg.ProbeWindow, p.Accepted, p.Rounds(), p.CPUOn, p.CPUOff, float64(p.CPUPerRound())/1e6)

		inTurns(t, cs, cfg.Runs, func(which string, run int, c *contender) {
			raw := filepath.Join(cfg.Raw, fmt.Sprintf("dnsperf-probe-%s-run%d.txt", which, run))
			cpu0, start := cpuOf(t, c.d.Process()), time.Now()
			x, err := runDNSPerf(ctx, dnsperfOpts{Port: c.d.Port, File: queries, Duration: cfg.Duration, Clients: cfg.Clients, Pin: "1", Raw: raw})
			x.Took, x.CPU = time.Since(start), cpuOf(t, c.d.Process())[0]-cpu0[0]
			if err != nil {
				t.Fatalf("probe %s: %v", which, err)
			}
			b.Logf("probe %-3s run %d: %8.0f QPS, %d lost, %s; CoreDNS CPU %s (%.1f µs per answer)", which, run, x.QPS, x.Lost, x.Rcodes, x.CPU, float64(x.CPUPerAnswer())/1e3)
			if which == "on" {
				p.On = append(p.On, x)
			} else {
				p.Off = append(p.Off, x)
			}
		})
		p.Latency = map[string][]latencyRun{}
		inTurns(t, cs, cfg.Runs, func(which string, run int, c *contender) {
			raw := filepath.Join(cfg.Raw, fmt.Sprintf("latency-probe-%s-%dqps-run%d.txt", which, cfg.Rate, run))
			cpu0 := cpuOf(t, c.d.Process())
			x, err := runDNSPerf(ctx, dnsperfOpts{Port: c.d.Port, File: queries, Duration: cfg.LatDur, Clients: cfg.Clients, Pin: "1", Rate: cfg.Rate, Verbose: true, Raw: raw})
			if err != nil {
				t.Fatalf("latency probe %s: %v", which, err)
			}
			l := latencyRun{P50: time.Duration(percentile(x.Latencies, 50) * 1e9), P99: time.Duration(percentile(x.Latencies, 99) * 1e9),
				Answers: len(x.Latencies), Lost: x.Lost, CPU: cpuOf(t, c.d.Process())[0] - cpu0[0]}
			p.Latency[which] = append(p.Latency[which], l)
			b.Logf("probe %-3s latency run %d at %d QPS: p50 %s, p99 %s (%d answers, %d lost); CoreDNS CPU %s", which, run, cfg.Rate, l.P50, l.P99, l.Answers, l.Lost, l.CPU)
		})
		for i := 0; i < ds.services; i++ {
			if check(cs["on"], ds, i, dns.TypeA) != "" {
				p.WrongAfter++
			}
		}
	})
}

// inTurns calls f runs times for each of cs's "off" and "on", their order
// swapped every run, the other stopped (SIGSTOP) meanwhile so that neither's
// work falls into the other's run; run counts from 1.
func inTurns(t harness.T, cs map[string]*contender, runs int, f func(which string, run int, c *contender)) {
	order := []string{"off", "on"}
	for run := 0; run < runs; run++ {
		for k := range order {
			which, other := order[(k+run)%2], cs[order[(k+run+1)%2]]
			if err := other.d.Process().Signal(syscall.SIGSTOP); err != nil {
				t.Fatalf("stop %s: %v", other.Name, err)
			}
			func() {
				defer other.d.Process().Signal(syscall.SIGCONT) // also when f fails
				f(which, run+1, cs[which])
			}()
		}
	}
}

// scoped runs f with a Program of its own whose cleanups run when f ends, so
// that the clusters, listeners and processes a stage starts do not outlive
// it; a failure in f fails b's stage.
func scoped(b *harness.Program, f func(t *harness.Program)) {
	if !b.Scoped(f) {
		b.Fatalf("see the errors above")
	}
}

// pinSelf moves every thread of this program to cpus (a taskset list) and
// returns a func that moves them back.
func pinSelf(t harness.T, cpus string) func() {
	pid := strconv.Itoa(os.Getpid())
	out, err := exec.Command("taskset", "-p", "-c", pid).Output()
	i := bytes.LastIndexByte(out, ':')
	if err != nil || i < 0 {
		t.Fatalf("taskset -p -c %s: %v: %s", pid, err, out)
	}
	was := string(bytes.TrimSpace(out[i+1:]))
	set := func(list string) {
		if out, err := exec.Command("taskset", "-a", "-p", "-c", list, pid).CombinedOutput(); err != nil {
			t.Fatalf("taskset -a -p -c %s %s: %v: %s", list, pid, err, out)
		}
	}
	set(cpus)
	return func() { set(was) }
}
