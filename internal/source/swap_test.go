package source

import (
	"context"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// The first complete list replaces the records from a snapshot in one step:
// every answer is the snapshot's or the list's, never the deleted Pod beside
// its replacement (which the list, applied Pod by Pod, would show for up to
// 100 ms before the swap).
func TestFirstListAppliedAtOnce(t *testing.T) {
	tb := newTable()
	tb.Upsert(&store.Pod{Common: &store.Common{Cluster: "edge-a", Namespace: "default", Exports: []annotation.Export{{Name: "backend", Namespace: "default", Cluster: "edge-a"}}}, Name: "a", Ready: true,
		IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
	client := fake.NewClientset(newPod("b", "10.0.0.2", backend, true))
	s := New("edge-a", client, tb.Store, Events{}, Options{})

	var (
		mixed   atomic.Bool
		watched sync.WaitGroup
		done    = make(chan struct{})
	)
	watched.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if len(answer(tb, "backend.default.svc.")) > 1 {
				mixed.Store(true)
			}
			time.Sleep(100 * time.Microsecond)
		}
	})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, "the list's answer", func() bool {
		return slices.Equal(answer(tb, "backend.default.svc."), []string{"10.0.0.2"})
	})
	close(done)
	watched.Wait()
	if mixed.Load() {
		t.Error("an answer held the snapshot's deleted Pod beside the listed one")
	}
}

// While the check fails it runs every ReconnectInterval, then every
// ProbeInterval again; the state follows it.
func TestCheckCadence(t *testing.T) {
	var (
		down  atomic.Bool
		calls atomic.Int64
	)
	down.Store(true)
	tb := newTable()
	s := New("edge-a", fake.NewClientset(), tb.Store, Events{}, Options{
		ProbeInterval: time.Hour, ReconnectInterval: 10 * time.Millisecond,
		Check: func(ctx context.Context) error {
			calls.Add(1)
			if down.Load() {
				return refused
			}
			return nil
		}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, "first sync", s.HasSynced)
	from := calls.Load()
	eventually(t, "retries while down", func() bool { return calls.Load() >= from+5 && s.State() == Disconnected })
	down.Store(false)
	eventually(t, "connected once the check passes", func() bool { return s.State() == Connected })
	n := calls.Load()
	time.Sleep(100 * time.Millisecond)
	if got := calls.Load(); got != n {
		t.Errorf("%d checks after one passed, want none before ProbeInterval (1h)", got-n)
	}
}

// refused is the error a dial to a closed port gives.
var refused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
