package harness

import (
	"fmt"
	"slices"
	"time"

	"github.com/miekg/dns"
)

// ProbeFailover stops l (an endpoint of the service name, its IP one of the
// service's addresses) and asks d for name's A records every 20 ms until no
// answer has held l's IP for settle (at most limit). It returns the time from
// the stop to the last answer that held the IP: how long clients were sent
// to a dead endpoint. The caller keeps the service asked before (probing
// follows demand) and probing started (its source cut, in disconnected mode).
func ProbeFailover(t T, d *CoreDNS, name string, l *Listener, settle, limit time.Duration) (time.Duration, error) {
	t.Helper()
	q := Query{Name: name, Type: dns.TypeA, Timeout: time.Second}
	start := time.Now()
	l.Stop(t)
	last := time.Duration(0) // since start, of the last answer with the IP
	for {
		now := time.Since(start)
		if now > limit {
			return last, fmt.Errorf("%s still answered %s after %s", name, l.IP(), limit)
		}
		m, err := d.Exchange(q)
		if err == nil && slices.Contains(Addrs(m), l.IP()) {
			last = time.Since(start)
		}
		if now-last > settle {
			return last, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// probeCorefile is a CoreDNS of edge-a with peer edge-b, probing with the
// probe word's defaults.
const probeCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        peer edge-b {PEERB}
        locality any
        probe {PROBE}
    }
}
`

// MeasureProbeFailover is the failover benchmark of issue 24, for a program
// to call: MeasureProbeFailovers with one repeat.
func MeasureProbeFailover(t T) (time.Duration, error) {
	t.Helper()
	ds, err := MeasureProbeFailovers(t, 1)
	if err != nil {
		return 0, err
	}
	return ds[0], nil
}

// MeasureProbeFailovers starts clusters edge-a and edge-b (edge-b behind a
// proxy), a CoreDNS with `probe disconnected` (defaults: tcp, interval 2s,
// timeout 1s, fails 2, passes 2; `allow 127.77.0.0/16`, since loopback
// endpoints are otherwise never probed) and two edge-b endpoints of a
// service on listeners at 127.77.0.1 and 127.77.0.2, cuts edge-b off, waits
// until both are probed, and returns n of ProbeFailover's figures for the
// first (the target is at most 5 s): between two, its listener starts again
// and the next begins once it is back in the answers.
func MeasureProbeFailovers(t T, n int) ([]time.Duration, error) {
	t.Helper()
	cs := StartClusters(t, "edge-a", "edge-b")
	a, b := cs[0], cs[1]
	pb := StartProxy(t, b.APIServerAddr())
	l1 := StartListener(t, "127.77.0.1", 0)
	l2 := StartListener(t, "127.77.0.2", l1.Port())
	ns := a.NewNamespace(t)
	b.CreateNamespace(t, ns)
	svc := ExportService{Name: "backend", Ports: []ExportPort{{Name: "http", Port: 80, TargetPort: int32(l1.Port()), Protocol: "TCP"}}}
	b.CreateReadyPods(t, ns,
		ReadyPod{Pod: ExporterPod("web-1", "", svc), IPs: []string{l1.IP()}},
		ReadyPod{Pod: ExporterPod("web-2", "", svc), IPs: []string{l2.IP()}})
	d := StartCoreDNS(t, probeCorefile, map[string]string{"KUBECONFIG": a.Kubeconfig, "PEERB": b.KubeconfigVia(t, pb), "PROBE": "disconnected allow 127.77.0.0/16"})
	name := "backend." + ns + ".svc.clusterset.local."
	want := []string{l1.IP(), l2.IP()}
	ask := func() []string {
		m, err := d.Exchange(Query{Name: name, Type: dns.TypeA})
		if err != nil {
			return nil
		}
		got := Addrs(m)
		slices.Sort(got)
		return got
	}
	both := func() error {
		if got := ask(); !slices.Equal(got, want) {
			return fmt.Errorf("%s answers %v, want %v", name, got, want)
		}
		return nil
	}
	Eventually(t, 60*time.Second, both)
	pb.Cut(t)
	Eventually(t, 30*time.Second, func() error {
		ask() // keeps the service asked
		if l1.Accepted() == 0 || l2.Accepted() == 0 {
			return fmt.Errorf("not probed yet (%d and %d connections)", l1.Accepted(), l2.Accepted())
		}
		return nil
	})
	var out []time.Duration
	for k := 0; k < n; k++ {
		if k > 0 {
			l1.Start(t)
			Eventually(t, 30*time.Second, both)
		}
		took, err := ProbeFailover(t, d, name, l1, 3*time.Second, 30*time.Second)
		if err != nil {
			return out, err
		}
		out = append(out, took)
	}
	return out, nil
}
