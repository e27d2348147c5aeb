// Package informerstop stops a client-go informer factory without letting a
// dead API server hold the caller for long.
//
// After its context is cancelled, an informer normally ends at once. But the
// reflector's watch-list retry (client-go v0.37, tools/cache/reflector.go,
// watchList) sleeps out its backoff without looking at the context: with the
// API server unreachable for a while that backoff reaches 30 s, and
// SharedInformerFactory.Shutdown waits for it. CoreDNS's SIGTERM, a reload and
// an expiry would all wait with it. The sleeping reflector does nothing when it
// wakes but return, and the event handlers have stopped with the context, so
// it is safe to leave it to end on its own.
//
// The plugin's own informers list through podinformer's stream, not the
// watch-list, and stop at once (TestStopIsPromptWithStreamedLists in the
// plugin); this guard stays for any informer that does use the watch-list
// (client-go's own clients, a fake in a test).
package informerstop

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// Wait is how long Shutdown waits for the informers to end.
const Wait = 2 * time.Second

// ErrSlow is wrapped by the error Shutdown returns when it stopped waiting.
var ErrSlow = errors.New("informer still stopping")

// Shutdown waits up to within for the informers of f to end; their context
// must already be cancelled. It returns an error wrapping ErrSlow when they have
// not, and leaves them to end in the background.
func Shutdown(f informers.SharedInformerFactory, within time.Duration) error {
	if Bounded(f.Shutdown, within) {
		return nil
	}
	return fmt.Errorf("%w: gave up waiting after %s (client-go's watch-list retry sleeps out its backoff); it ends on its own", ErrSlow, within)
}

// Bounded runs wait and reports whether it returned within d; when it has
// not, it is left to return in the background.
func Bounded(wait func(), d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		wait()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// Handlers returns h with every call dropped once ctx is done, so that an
// informer left to end in the background never touches its owner's state
// again (a call already running when ctx ended finishes).
func Handlers(ctx context.Context, h cache.ResourceEventHandler) cache.ResourceEventHandler {
	return guarded{ctx, h}
}

type guarded struct {
	ctx context.Context
	h   cache.ResourceEventHandler
}

func (g guarded) OnAdd(obj any, isInInitialList bool) {
	if g.ctx.Err() == nil {
		g.h.OnAdd(obj, isInInitialList)
	}
}

func (g guarded) OnUpdate(oldObj, newObj any) {
	if g.ctx.Err() == nil {
		g.h.OnUpdate(oldObj, newObj)
	}
}

func (g guarded) OnDelete(obj any) {
	if g.ctx.Err() == nil {
		g.h.OnDelete(obj)
	}
}
