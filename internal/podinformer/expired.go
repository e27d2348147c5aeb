package podinformer

import (
	"context"
	"reflect"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// When a watch's resource version has expired (410 Gone: the API server
// restarted, or the watch fell too far behind), client-go's reflector lists
// every Pod again, from the version it had, but only after its backoff: 0.8
// to 1.6 s after a quiet spell, and more after repeated failures. A
// SharedIndexInformer does not let that backoff be set. So the streamed
// ListerWatcher starts that same list as soon as it sees the expiry, and hands
// it over when the reflector asks for it: the backoff overlaps the list
// instead of coming before it. The reflector still waits its backoff between
// its attempts, so the API server gets no more lists than before, each only
// earlier, except that an early list that failed on its own is dropped and
// the list made afresh, as the reflector asks for it. An early list for other
// options than the reflector's is dropped too (it lists from the resource
// version of the last event it took; an object of an unexpected type would
// leave the two apart). A reflector whose first list came in pages (an API
// server without a watch cache) asks for its relists in pages: then no list
// starts early.

// early is a list started when a watch expired.
type early struct {
	opts   metav1.ListOptions // as the request went, after tweak
	start  time.Time          // at the expiry
	ctx    context.Context    // the reflector's: ends when the informer stops
	cancel context.CancelFunc
	done   chan struct{} // closed when list and err are set
	list   runtime.Object
	err    error
}

// expired reports that a watch from resourceVersion expired, and starts the
// list the reflector will ask for, in place of one started before. ctx is
// the reflector's (the one it watches with).
func (s *streamed) expired(ctx context.Context, resourceVersion string) {
	if s.ev.Expired != nil {
		s.ev.Expired()
	}
	if resourceVersion == "" || resourceVersion == "0" {
		return // the reflector's next list then differs (and a fresh start is rare)
	}
	opts := metav1.ListOptions{ResourceVersion: resourceVersion}
	s.tweak(&opts)
	ctx, cancel := context.WithCancel(ctx)
	e := &early{opts: opts, start: time.Now(), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	s.mu.Lock()
	if s.paged {
		s.mu.Unlock()
		cancel()
		return
	}
	old := s.early
	s.early = e
	s.mu.Unlock()
	if old != nil {
		old.cancel()
	}
	go func() {
		defer close(e.done)
		e.list, e.err = s.list(ctx, opts)
	}()
}

// takeEarly returns the early list for opts (after tweak), when it started
// and its error, if one was started for them, and whether one was; an early
// list for other options is dropped. It waits for the early list as long as
// ctx (the list's) lasts.
func (s *streamed) takeEarly(ctx context.Context, opts metav1.ListOptions) (list runtime.Object, start time.Time, ok bool, err error) {
	s.mu.Lock()
	e := s.early
	s.early = nil
	s.mu.Unlock()
	if e == nil {
		return nil, start, false, nil
	}
	defer e.cancel()
	if !reflect.DeepEqual(e.opts, opts) {
		return nil, start, false, nil
	}
	select {
	case <-e.done:
	case <-e.ctx.Done(): // the informer stops
		return nil, e.start, true, e.ctx.Err()
	case <-ctx.Done():
		return nil, e.start, true, ctx.Err()
	}
	if e.err != nil && e.ctx.Err() == nil {
		return nil, start, false, nil // failed on its own: list afresh, as the reflector asks now
	}
	return e.list, e.start, true, e.err
}

// isExpired is client-go's reflector's test for an expired resource version.
func isExpired(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// expiryWatch passes a watch's events on, and starts the early list when one
// of them says that the watch expired. It follows the resource version of the
// events, as the reflector does, to list from where the reflector will.
type expiryWatch struct {
	in   watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func (s *streamed) watchExpiry(ctx context.Context, in watch.Interface, resourceVersion string) watch.Interface {
	if resourceVersion == "" || resourceVersion == "0" {
		return in // the reflector then takes no version from the first events
	}
	w := &expiryWatch{in: in, out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(w.out)
		events := in.ResultChan()
		for {
			var ev watch.Event
			var ok bool
			select {
			case ev, ok = <-events:
				if !ok {
					return
				}
			case <-w.stop:
				return
			}
			if ev.Type == watch.Error {
				if isExpired(apierrors.FromObject(ev.Object)) {
					s.expired(ctx, resourceVersion)
				}
			} else if m, ok := ev.Object.(metav1.Object); ok && m.GetResourceVersion() != "" {
				resourceVersion = m.GetResourceVersion()
			}
			select {
			case w.out <- ev:
			case <-w.stop:
				return
			}
		}
	}()
	return w
}

func (w *expiryWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *expiryWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.in.Stop()
	})
}
