package ingest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// ListerWatcher lists and watches one resource with client-go's ListWatch,
// and cuts each object down with Transform before the store sees it.
type ListerWatcher struct {
	// ListWatch lists and watches. Its list may return a *List whose items
	// are transformed already (a list transformed as it streams in); the
	// items of any other list are transformed here.
	cache.ListWatch
	// Transform returns what the store keeps of an object: a runtime.Object
	// with object metadata (metav1.Object, or Meta embedded), since the
	// reflector reads the resource version of each watch event.
	Transform func(runtime.Object) (runtime.Object, error)

	ev        Events
	mu        sync.Mutex
	listedAll bool      // a complete list arrived: the next ones are relists
	pageStart time.Time // of the list whose pages are arriving
	pageObjs  int       // in those pages so far
	refusals  int       // lists refused in a row (see refused)

	// backoff and sleep replace RefusedBackoff and refusedSleep for this
	// ListerWatcher (tests, which count the waits without touching what
	// other tests' reflectors read); nil: those.
	backoff *wait.Backoff
	sleep   func(context.Context, time.Duration) error

	// relist is set when the store dropped an object for being full: the
	// watch then ends as expired at its next event (or the next watch is
	// refused as expired), so that the reflector lists again and the store
	// holds what the server holds, or, if that is still over MaxObjects,
	// keeps what it holds until a list fits.
	relist atomic.Bool
}

// errRelist ends a watch as expired, which makes the reflector list again.
var errRelist = apierrors.NewResourceExpired("the store dropped objects for holding MaxObjects: listing again")

// RefusedBackoff is the wait before a list that follows lists the API server
// refused (401, 403, 404, ...: a credential without its grant, a resource
// that is not served) or that were over a bound: 1 s, doubling up to 30 s,
// instead of the reflector's quarter second. Such an answer does not change
// by itself soon; retried four times a second it would cost a request and a
// log line each time, forever. A variable for tests.
var RefusedBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Cap: 30 * time.Second}

// refused reports whether a list's error is the API server's refusal, or a
// reply over a bound, rather than an outage or a cut stream.
func refused(err error) bool {
	switch {
	case errors.Is(err, ErrTooLarge):
		return true
	case apierrors.IsUnauthorized(err), apierrors.IsForbidden(err), apierrors.IsNotFound(err),
		apierrors.IsBadRequest(err), apierrors.IsMethodNotSupported(err), apierrors.IsNotAcceptable(err),
		apierrors.IsUnsupportedMediaType(err), apierrors.IsInvalid(err):
		return true
	}
	return false
}

// refusedWait is the wait before the next list after n refused ones.
func refusedWait(n int, b wait.Backoff) time.Duration {
	if n <= 0 {
		return 0
	}
	d := b.Duration
	for i := 1; i < n && d < b.Cap; i++ {
		d = time.Duration(float64(d) * b.Factor)
	}
	return min(d, b.Cap)
}

// refusedSleep waits d before a list that follows refused ones, or until
// ctx ends (its error).
func refusedSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// List is a list whose items are transformed.
type List struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []runtime.Object
}

// DeepCopyObject implements runtime.Object; the reflector never copies a
// list, and the items are never changed, so they are shared.
func (l *List) DeepCopyObject() runtime.Object {
	c := &List{TypeMeta: l.TypeMeta, Items: append([]runtime.Object(nil), l.Items...)}
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	return c
}

// observed returns a copy of l that reports to ev.
func (l *ListerWatcher) observed(ev Events) *ListerWatcher {
	return &ListerWatcher{ListWatch: l.ListWatch, Transform: l.Transform, ev: ev, backoff: l.backoff, sleep: l.sleep}
}

// ListWithContext lists, transforms the items and reports the list.
func (l *ListerWatcher) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	l.mu.Lock()
	b, sleep := RefusedBackoff, refusedSleep
	if l.backoff != nil {
		b = *l.backoff
	}
	if l.sleep != nil {
		sleep = l.sleep
	}
	d := refusedWait(l.refusals, b)
	l.mu.Unlock()
	if d > 0 && opts.Continue == "" {
		if err := sleep(ctx, d); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	obj, err := l.ListWatch.ListWithContext(ctx, opts)
	var list *List
	if err == nil {
		list, err = l.transformList(obj)
	}
	if err == nil && l.pagesOver(len(list.Items)) {
		list, err = nil, fmt.Errorf("%w: %w: a list of more than %d objects", ErrStream, ErrTooLarge, MaxObjects)
	}
	if err != nil && ctx.Err() == nil {
		// A list the Reader's TooLarge heard of is logged and counted there:
		// one refusal, one report.
		if (errors.Is(err, podproto.ErrStream) || errors.Is(err, ErrStream)) && !wasReported(err) && l.ev.Malformed != nil {
			l.ev.Malformed(err)
		}
		l.failed(err)
	}
	l.listed(list, start)
	l.mu.Lock()
	switch {
	case err == nil:
		l.refusals = 0
	case refused(err):
		l.refusals++
	}
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return list, nil
}

// transformList returns obj's items transformed, unless they are.
func (l *ListerWatcher) transformList(obj runtime.Object) (*List, error) {
	if list, ok := obj.(*List); ok {
		return list, nil
	}
	lm, err := meta.ListAccessor(obj)
	if err != nil {
		return nil, err
	}
	items, err := meta.ExtractList(obj)
	if err != nil {
		return nil, err
	}
	list := &List{Items: make([]runtime.Object, 0, len(items))}
	list.ResourceVersion, list.Continue, list.RemainingItemCount = lm.GetResourceVersion(), lm.GetContinue(), lm.GetRemainingItemCount()
	for _, it := range items {
		t, err := l.Transform(it)
		if err != nil {
			return nil, err
		}
		list.Items = append(list.Items, t)
	}
	return list, nil
}

// pagesOver reports whether n more objects take the list whose pages are
// arriving past MaxObjects (client-go's pager holds every page until the
// last one came).
func (l *ListerWatcher) pagesOver(n int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pageObjs+n > MaxObjects
}

// listed notes a list (or a page of one) started at start; nil: it failed.
// Each complete list after the first is reported as a relist.
func (l *ListerWatcher) listed(list *List, start time.Time) {
	l.mu.Lock()
	if list == nil {
		l.pageStart, l.pageObjs = time.Time{}, 0 // the reflector lists again from the start
		l.mu.Unlock()
		return
	}
	if l.pageStart.IsZero() {
		l.pageStart = start
	}
	l.pageObjs += len(list.Items)
	if list.Continue != "" {
		l.mu.Unlock()
		return
	}
	relist, n, took := l.listedAll, l.pageObjs, time.Since(l.pageStart)
	l.listedAll, l.pageStart, l.pageObjs = true, time.Time{}, 0
	l.mu.Unlock()
	if relist && l.ev.Relisted != nil {
		l.ev.Relisted(n, took)
	}
}

// WatchWithContext watches, transforms each object event and reports an
// expired watch.
func (l *ListerWatcher) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if l.relist.Swap(false) {
		return nil, errRelist
	}
	w, err := l.ListWatch.WatchWithContext(ctx, opts)
	if err != nil {
		if isExpired(err) {
			l.expired()
		} else if ctx.Err() == nil {
			l.failed(err)
		}
		return nil, err
	}
	sw := &stoppable{}
	sw.Interface = watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
		if l.relist.Swap(false) {
			return watch.Event{Type: watch.Error, Object: &errRelist.ErrStatus}, true
		}
		switch ev.Type {
		case watch.Error:
			if err := apierrors.FromObject(ev.Object); isExpired(err) {
				l.expired()
			} else if ctx.Err() == nil && !sw.stopped.Load() {
				// After the reflector stopped the watch (an expired one,
				// say), its decoder's "read on closed response body" is no
				// failure of the API server's.
				l.failed(err)
			}
		case watch.Added, watch.Modified, watch.Deleted:
			obj, err := l.Transform(ev.Object)
			if err != nil {
				return watch.Event{Type: watch.Error, Object: &apierrors.NewInternalError(fmt.Errorf("transform: %w", err)).ErrStatus}, true
			}
			ev.Object = obj
		}
		return ev, true
	})
	return sw, nil
}

// stoppable is a watch that knows it was stopped.
type stoppable struct {
	watch.Interface
	stopped atomic.Bool
}

func (s *stoppable) Stop() {
	s.stopped.Store(true)
	s.Interface.Stop()
}

func (l *ListerWatcher) failed(err error) {
	if l.ev.Failed != nil {
		l.ev.Failed(err)
	}
}

func (l *ListerWatcher) expired() {
	if l.ev.Expired != nil {
		l.ev.Expired()
	}
}

// List and Watch make a ListerWatcher a cache.ListerWatcher; the reflector
// calls the context forms.
func (l *ListerWatcher) List(opts metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), opts)
}

func (l *ListerWatcher) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), opts)
}

// IsWatchListSemanticsUnSupported turns client-go's watch-list off: its
// retry sleeps out its backoff without looking at its context.
func (l *ListerWatcher) IsWatchListSemanticsUnSupported() bool { return true }

// isExpired is client-go's reflector's test for an expired resource version.
func isExpired(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}
