package source

import (
	"context"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/mcsannotations/mcsannotations/plugin/table"
)

// refused is the error a dial to a closed port gives.
var refused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// link is a fake API server's link: while down, /readyz checks fail and every
// list and watch is refused; cut also ends the open watches.
type link struct {
	down    atomic.Bool
	mu      sync.Mutex
	watches []watch.Interface
	// admit, when set before install, decides whether a list or watch gets
	// through even while the link is up (to refuse the old informer's own
	// retries).
	admit func() bool
}

func (l *link) check(context.Context) error {
	if l.down.Load() {
		return refused
	}
	return nil
}

// install puts the link in front of c's Pod lists and watches.
func (l *link) install(c *fake.Clientset) {
	pass := func() bool { return !l.down.Load() && (l.admit == nil || l.admit()) }
	c.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !pass() {
			return true, nil, refused
		}
		return false, nil, nil
	})
	c.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if !pass() {
			return true, nil, refused
		}
		w, err := c.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		l.mu.Lock()
		l.watches = append(l.watches, w)
		l.mu.Unlock()
		return true, w, nil
	})
}

func (l *link) cut() {
	l.down.Store(true)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range l.watches {
		w.Stop()
	}
	l.watches = nil
}

type restarts struct {
	mu   sync.Mutex
	down []time.Duration
	errs []error
}

func (r *restarts) events() Events {
	return Events{Restarted: func(_ string, down time.Duration, err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.down = append(r.down, down)
		if err != nil {
			r.errs = append(r.errs, err)
		}
	}}
}

// count returns the restarts so far and fails the test on a failed one.
func (r *restarts) count(t *testing.T) int {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, err := range r.errs {
		t.Errorf("restart failed: %v", err)
	}
	return len(r.down)
}

// After an outage the informer is restarted as soon as a check passes, and
// its list brings a change made meanwhile; the records stay until then. The
// fake API server refuses the old informer's own retries for good, so only
// a restart can bring the change.
func TestRestartAfterOutage(t *testing.T) {
	client := fake.NewClientset(newPod("a", "10.0.0.1", backend, true))
	// Once cut, only an informer started after the cut may list and watch.
	var (
		s     *Source
		cutAt atomic.Int64
	)
	l := &link{admit: func() bool {
		c := cutAt.Load()
		return c == 0 || s.Started().UnixNano() > c
	}}
	l.install(client)
	tb := table.New(table.Config{Zone: zone, TTL: 5, LocalCluster: "edge-a"})
	var r restarts
	s = New("edge-a", client, tb, r.events(), Options{
		ProbeInterval: 50 * time.Millisecond, ReconnectInterval: 20 * time.Millisecond, Check: l.check})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, "first sync", func() bool { return s.HasSynced() && s.State() == Connected })

	cutAt.Store(time.Now().UnixNano())
	l.cut()
	old := s.inf
	eventually(t, "disconnected", func() bool { return s.State() == Disconnected })
	// Changes the source cannot see while the link is down: a Pod replaced
	// by another.
	pods := client.CoreV1().Pods("default")
	if _, err := pods.Create(context.Background(), newPod("b", "10.0.0.2", backend, true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pods.Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // a few failed checks
	if got := answer(tb, "backend.default.svc."); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Fatalf("while down: %v, want the records from before", got)
	}
	if r.count(t) != 0 {
		t.Fatal("restarted while the API server is down")
	}

	// Every answer from the link's return on is the old state or the new
	// one, never both Pods (which the new informer's list, applied Pod by
	// Pod, would show for up to 100 ms before its swap).
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
	l.down.Store(false)
	eventually(t, "the change after the link is back", func() bool {
		return slices.Equal(answer(tb, "backend.default.svc."), []string{"10.0.0.2"})
	})
	close(done)
	watched.Wait()
	if mixed.Load() {
		t.Error("an answer held the deleted Pod beside the new one")
	}
	if r.count(t) != 1 {
		t.Fatalf("%d restarts, want 1", r.count(t))
	}
	if r.down[0] < 100*time.Millisecond {
		t.Errorf("outage reported as %s, it lasted longer than 100ms", r.down[0])
	}
	if n := len(old.store.List()); n != 0 {
		t.Errorf("the old informer's store still holds %d Pods", n)
	}
	eventually(t, "connected", func() bool { return s.State() == Connected })
	// Connected again: no further restart.
	time.Sleep(200 * time.Millisecond)
	if r.count(t) != 1 {
		t.Fatalf("%d restarts once connected, want 1", r.count(t))
	}
}

// A failed check while the watch keeps delivering events (a /readyz that
// timed out on a loaded API server) does not restart the informer: it had
// events since, so its watch works.
func TestNoRestartWhenWatchWorks(t *testing.T) {
	client := fake.NewClientset(newPod("a", "10.0.0.1", backend, true))
	l := &link{}
	l.install(client)
	tb := table.New(table.Config{Zone: zone, TTL: 5, LocalCluster: "edge-a"})
	var r restarts
	checkDown := atomic.Bool{}
	s := New("edge-a", client, tb, r.events(), Options{
		ProbeInterval: 50 * time.Millisecond, ReconnectInterval: 20 * time.Millisecond,
		Check: func(context.Context) error {
			if checkDown.Load() {
				return context.DeadlineExceeded
			}
			return nil
		}})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, "first sync", func() bool { return s.HasSynced() && s.State() == Connected })

	checkDown.Store(true)
	eventually(t, "disconnected", func() bool { return s.State() == Disconnected })
	if _, err := client.CoreV1().Pods("default").Create(context.Background(), newPod("b", "10.0.0.2", backend, true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the change through the working watch", func() bool {
		return slices.Equal(answer(tb, "backend.default.svc."), []string{"10.0.0.1", "10.0.0.2"})
	})
	checkDown.Store(false)
	eventually(t, "connected", func() bool { return s.State() == Connected })
	time.Sleep(100 * time.Millisecond)
	if r.count(t) != 0 {
		t.Fatalf("%d restarts, want none: the watch delivered events during the outage", r.count(t))
	}
}
