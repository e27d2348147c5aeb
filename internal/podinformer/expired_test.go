package podinformer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	restclientwatch "k8s.io/client-go/rest/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// expiring is an API server whose Pods are a and b at version 10; a watch
// from 10 sees c added at 11 and then expires (410), as after an API server's
// restart. A list from any version but 0 (the informer's first) also has d,
// at version 20; a watch from any version but 10 waits for its end.
type expiring struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	listRVs  []string // the resourceVersion of each list, as asked
	failList int      // lists still to fail with 500
	goneCall bool     // a watch from 10 fails with 410 at once, not as an event
	paged    bool     // a list from 0 comes in pages (no watch cache)
	hold     chan struct{}
}

func newExpiring(t *testing.T) *expiring {
	e := &expiring{t: t}
	info, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	encoder := scheme.Codecs.EncoderForVersion(info.Serializer, v1.SchemeGroupVersion)
	pod := func(name, rv string) v1.Pod {
		return v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", UID: k8stypes.UID("uid-" + name), ResourceVersion: rv}}
	}
	gone := &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version: 10 (15)"}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if r.URL.Path != "/api/v1/pods" || q.Get("labelSelector") != "export=true" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
		if q.Get("watch") != "true" {
			e.mu.Lock()
			e.listRVs = append(e.listRVs, q.Get("resourceVersion"))
			first, fail, hold := q.Get("resourceVersion") == "0", e.failList > 0, e.hold
			if fail {
				e.failList--
			}
			e.mu.Unlock()
			if hold != nil {
				select {
				case <-hold:
				case <-r.Context().Done():
					return
				}
			}
			if fail {
				w.WriteHeader(http.StatusInternalServerError)
				_ = encoder.Encode(&metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Message: "etcd is down"}, w)
				return
			}
			list := &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "20"}, Items: []v1.Pod{pod("a", "8"), pod("b", "9"), pod("c", "11"), pod("d", "20")}}
			if first {
				list = &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "10"}, Items: []v1.Pod{pod("a", "8"), pod("b", "9")}}
				e.mu.Lock()
				if e.paged {
					list.Continue = "more"
				}
				e.mu.Unlock()
			}
			if err := encoder.Encode(list, w); err != nil {
				t.Error(err)
			}
			return
		}
		e.mu.Lock()
		goneCall := e.goneCall
		e.mu.Unlock()
		if q.Get("resourceVersion") != "10" {
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		if goneCall {
			w.WriteHeader(http.StatusGone)
			_ = encoder.Encode(gone, w)
			return
		}
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf+";stream=watch")
		enc := restclientwatch.NewEncoder(streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(w), info.StreamSerializer.Serializer), encoder)
		c := pod("c", "11")
		for _, ev := range []watch.Event{{Type: watch.Added, Object: &c}, {Type: watch.Error, Object: gone}} {
			if err := enc.Encode(&ev); err != nil {
				t.Error(err)
			}
		}
	}))
	t.Cleanup(func() { e.srv.CloseClientConnections(); e.srv.Close() })
	return e
}

func (e *expiring) lists() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.listRVs...)
}

// waitLists waits, at most 10 s, until the server has had n lists.
func (e *expiring) waitLists(n int) []string {
	e.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); len(e.lists()) < n && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	got := e.lists()
	if len(got) < n {
		e.t.Fatalf("%d lists, want %d", len(got), n)
	}
	return got
}

// streamed is the informer's ListerWatcher for the server, as New makes it.
func (e *expiring) streamed(transformed *atomic.Int32) *streamed {
	client, err := podproto.NewClient(&rest.Config{Host: e.srv.URL, ContentConfig: rest.ContentConfig{
		ContentType: runtime.ContentTypeProtobuf, AcceptContentTypes: runtime.ContentTypeProtobuf,
	}}, podproto.Keep{})
	if err != nil {
		e.t.Fatal(err)
	}
	return &streamed{client: client, lister: client.(Streamer), tweak: func(o *metav1.ListOptions) { o.LabelSelector = "export=true" }, transform: cutting(transformed)}
}

// watchToExpiry watches from 10 as the reflector does, and reads the events
// to the expiry, which it returns.
func watchToExpiry(t *testing.T, ctx context.Context, lw *streamed) error {
	t.Helper()
	w, err := lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: "10", AllowWatchBookmarks: true})
	if err != nil {
		return err
	}
	defer w.Stop()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch ended without its error event")
			}
			if ev.Type == watch.Error {
				return apierrors.FromObject(ev.Object)
			}
		case <-timeout:
			t.Fatal("no error event in 10 s")
		}
	}
}

func names(t *testing.T, obj runtime.Object) []string {
	t.Helper()
	l, ok := obj.(*slimList)
	if !ok {
		t.Fatalf("listed a %T", obj)
	}
	var n []string
	for _, o := range l.Items {
		n = append(n, o.(*cut).Name)
	}
	return n
}

// TestExpiredListsAtOnce: when the watch expires, the list the reflector
// will ask for (from the version of the last event) starts at once, and the
// reflector's list takes it without another request.
func TestExpiredListsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		goneCall bool
	}{{"error event", false}, {"watch call fails", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newExpiring(t)
			e.goneCall = tc.goneCall
			var transformed atomic.Int32
			lw := e.streamed(&transformed)
			heard := hear(lw)
			firstList(t, lw)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := watchToExpiry(t, ctx, lw); !isExpired(err) {
				t.Fatalf("watch ended with %v, want 410", err)
			}
			if got := heard(); !reflect.DeepEqual(got, []string{"expired"}) {
				t.Errorf("heard %q at the expiry, want it reported", got)
			}
			want := "11" // the version of the last event
			if tc.goneCall {
				want = "10" // the version the watch asked for
			}
			if got := e.waitLists(2); got[1] != want {
				t.Fatalf("listed from %q, want %q", got[1], want)
			}
			list, err := lw.ListWithContext(bounded(t), metav1.ListOptions{ResourceVersion: want})
			if err != nil {
				t.Fatal(err)
			}
			if got := names(t, list); !reflect.DeepEqual(got, []string{"a", "b", "c", "d"}) {
				t.Errorf("listed %v", got)
			}
			if got := e.lists(); len(got) != 2 {
				t.Errorf("lists from %v, want the first and the early one only", got)
			}
			if pending(lw) != nil {
				t.Error("the early list is kept after it was taken")
			}
			if got := heard(); !reflect.DeepEqual(got, []string{"expired", "relisted 4"}) {
				t.Errorf("heard %q, want the expiry and a relist of 4 Pods", got)
			}
			// A later list is a list of its own (and a relist too).
			if _, err := lw.ListWithContext(bounded(t), metav1.ListOptions{ResourceVersion: "20"}); err != nil {
				t.Fatal(err)
			}
			if got := e.lists(); !reflect.DeepEqual(got, []string{"0", want, "20"}) {
				t.Errorf("lists from %v, want %v", got, []string{"0", want, "20"})
			}
			if got := heard(); len(got) != 3 {
				t.Errorf("heard %q, want the later list as a relist too", got)
			}
		})
	}
}

// TestExpiredOtherOptions: a list asked with other options than the early
// list's is made afresh, and the early one cancelled.
func TestExpiredOtherOptions(t *testing.T) {
	e := newExpiring(t)
	e.hold = make(chan struct{}) // the early list waits: it must be cancelled, not read
	var transformed atomic.Int32
	lw := e.streamed(&transformed)
	if err := watchToExpiry(t, context.Background(), lw); !isExpired(err) {
		t.Fatalf("watch ended with %v, want 410", err)
	}
	e.waitLists(1)
	dropped := pending(lw)
	e.mu.Lock()
	e.hold = nil
	e.mu.Unlock()
	list, err := lw.ListWithContext(bounded(t), metav1.ListOptions{ResourceVersion: ""})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(t, list); len(got) != 4 {
		t.Errorf("listed %v", got)
	}
	if got := e.lists(); !reflect.DeepEqual(got, []string{"11", ""}) {
		t.Errorf("lists from %q, want the early one and a fresh one", got)
	}
	select {
	case <-dropped.done:
		if !errors.Is(dropped.err, context.Canceled) {
			t.Errorf("the dropped early list ended with %v, want it cancelled", dropped.err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the dropped early list still runs")
	}
}

// TestExpiredListFails: an early list that fails on its own is not handed
// over; the reflector's list is made afresh.
func TestExpiredListFails(t *testing.T) {
	e := newExpiring(t)
	var transformed atomic.Int32
	lw := e.streamed(&transformed)
	heard := hear(lw)
	firstList(t, lw)
	e.failList = 1
	if err := watchToExpiry(t, context.Background(), lw); !isExpired(err) {
		t.Fatalf("watch ended with %v, want 410", err)
	}
	e.waitLists(2)
	list, err := lw.ListWithContext(bounded(t), metav1.ListOptions{ResourceVersion: "11"})
	if err != nil {
		t.Fatalf("%v, want the fresh list's Pods", err)
	}
	if got := names(t, list); len(got) != 4 {
		t.Errorf("listed %v", got)
	}
	if got := e.lists(); !reflect.DeepEqual(got, []string{"0", "11", "11"}) {
		t.Errorf("lists from %q, want the first, the failed one and a fresh one", got)
	}
	if got := heard(); !reflect.DeepEqual(got, []string{"expired", "relisted 4"}) {
		t.Errorf("heard %q, want the expiry and the fresh list as the relist", got)
	}
}

// TestListedReportsRelist: each complete list after the first is reported
// as a relist, its pages added up and timed from the first page's start; a
// list that fails starts the count again.
func TestListedReportsRelist(t *testing.T) {
	lw := &streamed{tweak: func(*metav1.ListOptions) {}}
	var heard []string
	var took []time.Duration
	lw.ev.Relisted = func(pods int, d time.Duration) {
		heard = append(heard, fmt.Sprintf("relisted %d", pods))
		took = append(took, d)
	}
	page := func(n int, more bool) *slimList {
		l := &slimList{Items: make([]runtime.Object, n)}
		if more {
			l.Continue = "more"
		}
		return l
	}
	hourAgo, now := time.Now().Add(-time.Hour), time.Now()
	first, opts := metav1.ListOptions{ResourceVersion: "0", Limit: 500}, metav1.ListOptions{ResourceVersion: "11", Limit: 500}
	lw.listed(first, page(6, true), nil, now)
	lw.listed(first, page(1, false), nil, now) // the first list: not a relist
	lw.listed(opts, page(2, true), nil, now)
	lw.listed(opts, nil, errors.New("the next page failed"), now)
	lw.listed(opts, page(3, true), nil, hourAgo)
	lw.listed(opts, page(1, false), nil, now)
	lw.listed(opts, page(5, false), nil, now)
	if want := []string{"relisted 4", "relisted 5"}; !reflect.DeepEqual(heard, want) {
		t.Errorf("heard %q, want %q", heard, want)
	}
	if len(took) == 2 && (took[0] < time.Hour || took[1] >= time.Hour) {
		t.Errorf("relists took %v, want from the first page's start", took)
	}
	if !lw.paged {
		t.Error("a first list in pages was not noted")
	}
}

// TestExpiredPaged: when the informer's first list came in pages, its
// relists will too, and no list starts early.
func TestExpiredPaged(t *testing.T) {
	e := newExpiring(t)
	e.paged = true
	var transformed atomic.Int32
	lw := e.streamed(&transformed)
	if _, err := lw.ListWithContext(bounded(t), metav1.ListOptions{ResourceVersion: "0", Limit: 500}); err != nil {
		t.Fatal(err)
	}
	if err := watchToExpiry(t, context.Background(), lw); !isExpired(err) {
		t.Fatalf("watch ended with %v, want 410", err)
	}
	if p := pending(lw); p != nil {
		t.Errorf("a list from %q started early", p.opts.ResourceVersion)
	}
	if got := e.lists(); len(got) != 1 {
		t.Errorf("lists from %q, want the first only", got)
	}
}

// TestExpiredStops: when the informer stops, or the reflector's list ends,
// while the early list runs, the reflector's list returns at once, with no
// request of its own, and the early list is cancelled.
func TestExpiredStops(t *testing.T) {
	for _, informerStops := range []bool{true, false} {
		e := newExpiring(t)
		e.hold = make(chan struct{}) // never answered
		var transformed atomic.Int32
		lw := e.streamed(&transformed)
		informer, stop := context.WithCancel(context.Background())
		if err := watchToExpiry(t, informer, lw); !isExpired(err) {
			t.Fatalf("watch ended with %v, want 410", err)
		}
		e.waitLists(1)
		dropped := pending(lw)
		list, endList := context.WithCancel(bounded(t))
		if informerStops {
			stop()
		} else {
			endList()
		}
		if _, err := lw.ListWithContext(list, metav1.ListOptions{ResourceVersion: "11"}); !errors.Is(err, context.Canceled) {
			t.Errorf("informer stops %v: listed with %v, want the stop", informerStops, err)
		}
		select {
		case <-dropped.done:
		case <-time.After(10 * time.Second):
			t.Errorf("informer stops %v: the early list still runs", informerStops)
		}
		if got := e.lists(); len(got) != 1 {
			t.Errorf("informer stops %v: lists from %q, want the early one only", informerStops, got)
		}
		stop()
		endList()
	}
}

// TestExpiryWatchFromStart: a watch from no version is passed on as it is
// (the reflector takes no version from its first events), and an expiry
// then starts no list; the wrapper's Stop ends its goroutine even when no
// one reads.
func TestExpiryWatchFromStart(t *testing.T) {
	lw := &streamed{}
	in := watch.NewFake()
	if w := lw.watchExpiry(context.Background(), in, "0"); w != watch.Interface(in) {
		t.Errorf("watch from 0 wrapped as %T", w)
	}
	lw.expired(context.Background(), "")
	if pending(lw) != nil {
		t.Error("an expiry from no version started a list")
	}

	in = watch.NewFakeWithChanSize(1, false)
	in.Add(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", ResourceVersion: "6"}})
	w := lw.watchExpiry(context.Background(), in, "5") // and no one reads it
	w.Stop()
	w.Stop() // twice is fine
	select {
	case _, ok := <-w.ResultChan():
		for ok {
			_, ok = <-w.ResultChan()
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wrapper's channel is still open after Stop")
	}
	if !in.IsStopped() {
		t.Error("the wrapped watch was not stopped")
	}
}

// TestInformerRelistsEarly: an informer whose watch expires lists again
// once, from the last event's version, and the list it takes is the one
// started when the watch expired.
func TestInformerRelistsEarly(t *testing.T) {
	e := newExpiring(t)
	var transformed atomic.Int32
	lw := e.streamed(&transformed)
	heard := hear(lw)
	spy := &listSpy{streamed: lw}
	inf := cache.NewSharedIndexInformer(spy, &v1.Pod{}, 0, cache.Indexers{})
	if err := inf.SetTransform(cutting(&transformed)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); inf.RunWithContext(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(20 * time.Second) // the reflector backs off 0.8-1.6 s after the expiry
	for len(inf.GetStore().ListKeys()) < 4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	keys := inf.GetStore().ListKeys()
	sort.Strings(keys)
	if !reflect.DeepEqual(keys, []string{"shop/a", "shop/b", "shop/c", "shop/d"}) {
		t.Fatalf("stored %v, want the relisted Pods", keys)
	}
	if got := e.lists(); !reflect.DeepEqual(got, []string{"0", "11"}) {
		t.Errorf("lists from %q, want the first and one relist from the last event", got)
	}
	if got := heard(); !reflect.DeepEqual(got, []string{"expired", "relisted 4"}) {
		t.Errorf("heard %q, want the expiry and one relist of 4 Pods", got)
	}
	spy.mu.Lock()
	defer spy.mu.Unlock()
	if !reflect.DeepEqual(spy.pending, []bool{false, true}) {
		t.Errorf("early list pending at the reflector's lists: %v, want at its relist", spy.pending)
	}
}

// bounded is a context for a list that ends with the test, or after 10 s.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// firstList makes s's first list, as the reflector does when it starts.
func firstList(t *testing.T, s *streamed) {
	t.Helper()
	if _, err := s.ListWithContext(bounded(t), metav1.ListOptions{ResourceVersion: "0"}); err != nil {
		t.Fatal(err)
	}
}

// hear sets s's events to note what they hear, and returns what they
// heard so far.
func hear(s *streamed) func() []string {
	var mu sync.Mutex
	var heard []string
	note := func(what string) {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, what)
	}
	s.ev = Events{
		Malformed: func(err error) { note("malformed") },
		Expired:   func() { note("expired") },
		Relisted: func(pods int, took time.Duration) {
			if took <= 0 {
				note(fmt.Sprintf("relisted %d in %v", pods, took))
				return
			}
			note(fmt.Sprintf("relisted %d", pods))
		},
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), heard...)
	}
}

func pending(s *streamed) *early {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.early
}

// listSpy notes, at each of the reflector's lists, whether an early list
// was pending.
type listSpy struct {
	*streamed
	mu      sync.Mutex
	pending []bool
}

func (l *listSpy) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	p := pending(l.streamed) != nil
	l.mu.Lock()
	l.pending = append(l.pending, p)
	l.mu.Unlock()
	return l.streamed.ListWithContext(ctx, opts)
}
