package informerstop

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

// started returns a running factory of Pod informers over c, synced, and the
// cancel of its context.
func started(t *testing.T, c *fake.Clientset) (informers.SharedInformerFactory, context.CancelFunc) {
	t.Helper()
	f := informers.NewSharedInformerFactory(c, 0)
	inf := f.Core().V1().Pods().Informer()
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(waitCh(t, 5*time.Second), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	return f, cancel
}

// waitCh closes after d.
func waitCh(t *testing.T, d time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	tm := time.AfterFunc(d, func() { close(ch) })
	t.Cleanup(func() { tm.Stop() })
	return ch
}

func TestShutdownPrompt(t *testing.T) {
	f, cancel := started(t, fake.NewClientset())
	cancel()
	if err := Shutdown(f, 10*time.Second); err != nil {
		t.Fatalf("a cancelled informer with nothing in flight: %v", err)
	}
}

// The watch call blocks without looking at its context, like client-go's
// watch-list retry sleeping out its backoff: Shutdown gives up after its
// bound, and the informer still ends once the call returns.
func TestShutdownGivesUpOnStuckInformer(t *testing.T) {
	c := fake.NewClientset()
	release, watching := make(chan struct{}), make(chan struct{}, 1)
	c.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		select {
		case watching <- struct{}{}:
		default:
		}
		<-release
		return false, nil, nil
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	f, cancel := started(t, c)
	// The list synced the informer; cancel only once the watch that
	// follows it is stuck (a cancel before it would end the informer).
	select {
	case <-watching:
	case <-waitCh(t, 5*time.Second):
		t.Fatal("the informer never watched")
	}
	cancel()
	start := time.Now()
	err := Shutdown(f, 50*time.Millisecond)
	if !errors.Is(err, ErrSlow) {
		t.Fatalf("Shutdown of a stuck informer: %v, want ErrSlow", err)
	}
	t.Logf("%v (returned after %s)", err, time.Since(start).Round(time.Millisecond))

	close(release)
	if err := Shutdown(f, 10*time.Second); err != nil {
		t.Fatalf("the informer did not end once the call returned: %v", err)
	}
}

// Calls pass while the context lives and are dropped once it is done.
func TestHandlersDropCallsAfterStop(t *testing.T) {
	var adds, updates, deletes int
	ctx, cancel := context.WithCancel(context.Background())
	h := Handlers(ctx, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { adds++ },
		UpdateFunc: func(any, any) { updates++ },
		DeleteFunc: func(any) { deletes++ },
	})
	h.OnAdd(1, false)
	h.OnUpdate(1, 2)
	h.OnDelete(2)
	cancel()
	h.OnAdd(3, false)
	h.OnUpdate(3, 4)
	h.OnDelete(4)
	if adds != 1 || updates != 1 || deletes != 1 {
		t.Fatalf("adds %d, updates %d, deletes %d; want 1 each (none after the stop)", adds, updates, deletes)
	}
}
