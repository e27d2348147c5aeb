package probe

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// roundTable is a table of n endpoints in services of 10, all asked, their
// IPs n addresses of 10.0.0.0/8 at port.
func roundTable(n int, port uint16) (testTable, []*store.Pod) {
	tbl := newTable()
	pods := make([]*store.Pod, n)
	for i := range pods {
		name := fmt.Sprintf("svc-%d", i/10)
		pods[i] = &store.Pod{Common: &store.Common{Cluster: "edge-b", Namespace: "default", Exports: []annotation.Export{{Name: name, Namespace: "default", Cluster: "edge-b",
			Ports: []annotation.Port{{Name: "http", Port: 80, TargetPort: int32(port), Protocol: "TCP"}}}}},
			Name: fmt.Sprintf("pod-%d", i), Ready: true, IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}}
	}
	tbl.ReplaceCluster("edge-b", pods)
	tbl.TrackDemand()
	ix := tbl.Rebuild()
	for i := 0; i < n/10; i++ {
		ix.Service("default", fmt.Sprintf("svc-%d", i))
	}
	return tbl, pods
}

// BenchmarkRound is the prober's CPU per round over 10,000 asked endpoints,
// all up, with a dialer that connects at once (net.Pipe): listing the
// targets, running the probes 128 at a time, applying the results. It
// reports the process's CPU time per round (cpu-ms/round, from getrusage, so
// that a loaded machine's waits do not count) and that time's share of one
// core at the default interval of 2 s (%core-at-2s); the kernel's work for
// real connections is not in it (see BenchmarkRoundLoopback).
func BenchmarkRound(b *testing.B) {
	tbl, _ := roundTable(10000, 8080)
	p := New(tbl, Defaults(All), Options{Dialer: upDialer{}})
	ctx := context.Background()
	p.Round(ctx) // takes the asked list
	b.ReportAllocs()
	b.ResetTimer()
	start := cpuTime(b)
	for b.Loop() {
		p.Round(ctx)
	}
	cpu := (cpuTime(b) - start) / time.Duration(b.N)
	b.StopTimer()
	if _, probed := p.Down(); probed != 10000 {
		b.Fatalf("%d probed, want 10000", probed)
	}
	b.ReportMetric(float64(cpu)/float64(time.Millisecond), "cpu-ms/round")
	b.ReportMetric(float64(cpu)/float64(2*time.Second)*100, "%core-at-2s")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// upDialer connects every address at once.
type upDialer struct{}

func (upDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	c, s := net.Pipe()
	s.Close()
	return c, nil
}

// BenchmarkRoundLoopback is one round over 1,000 asked endpoints with real
// TCP connections to listeners on 127.0.0.0/8 (allowed for it: loopback is
// refused by default), one listener per endpoint since a round probes each
// address and port once: the kernel's share of a probe, both ends of each
// connection in this process. connectAll is the default TCP probe; dialer
// is the net.Dialer's (HTTP probes use it). It reports this process's CPU
// time per probe (cpu-µs/probe, from getrusage). (Ten rounds: every
// connection leaves a socket in TIME_WAIT for a minute.)
func BenchmarkRoundLoopback(b *testing.B) {
	to := make([]netip.AddrPort, 1000)
	for i := range to {
		to[i] = acceptCloseOn(b, netip.AddrFrom4([4]byte{127, 1, byte(i >> 8), byte(i)}))
	}
	for _, bc := range []struct {
		name   string
		dialer Dialer
	}{{"connectAll", nil}, {"dialer", probeDialer()}} {
		b.Run(bc.name, func(b *testing.B) {
			tbl, pods := roundTable(len(to), 0)
			for i, pod := range pods {
				pod.IPs[0] = to[i].Addr()
				pod.Exports[0].Ports[0].TargetPort = int32(to[i].Port())
			}
			tbl.ReplaceCluster("edge-b", pods)
			p := New(tbl, onLoopback(Defaults(All)), Options{Dialer: bc.dialer})
			ctx := context.Background()
			b.ReportAllocs()
			start := cpuTime(b)
			rounds := 0
			for ; b.Loop(); rounds++ {
				if rounds >= 10 {
					b.Skip("ten rounds is what TIME_WAIT allows; run with -benchtime 10x")
				}
				p.Round(ctx)
			}
			cpu := cpuTime(b) - start
			if down, probed := p.Down(); len(down) != 0 || probed != len(to) {
				b.Fatalf("endpoints down: %v, %d probed", down, probed)
			}
			b.ReportMetric(float64(cpu.Microseconds())/float64(rounds*len(to)), "cpu-µs/probe")
		})
	}
}
