package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	protoser "k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// slim is what the tests' stores keep of a Pod: its metadata and its IP.
type slim struct {
	Meta
	IP string
}

func (s *slim) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (s *slim) DeepCopyObject() runtime.Object   { c := *s; return &c }

func toSlim(p *v1.Pod) (runtime.Object, error) {
	return &slim{Meta: MetaOf(p), IP: p.Status.PodIP}, nil
}

func pod(name, rv string) v1.Pod {
	return v1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), ResourceVersion: rv},
		Status:     v1.PodStatus{PodIP: "10.0.0.1"},
	}
}

func podList(rv, cont string, pods ...v1.Pod) *v1.PodList {
	return &v1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: rv, Continue: cont}, Items: pods}
}

func expiredStatus() *metav1.Status {
	return &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version"}
}

// apiServer is a fake API server of Pods in JSON: list answers each list
// request, watch each watch (nil: a watch that sends nothing until the test
// ends). It records the query of every request.
type apiServer struct {
	srv   *httptest.Server
	mu    sync.Mutex
	lists []url.Values
	watch []url.Values
}

func newAPIServer(t *testing.T, list func(n int, q url.Values, w http.ResponseWriter), watch func(n int, r *http.Request, w http.ResponseWriter)) *apiServer {
	a := &apiServer{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/pods" {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		a.mu.Lock()
		if q.Get("watch") == "" {
			a.lists = append(a.lists, q)
			n := len(a.lists)
			a.mu.Unlock()
			list(n, q, w)
			return
		}
		a.watch = append(a.watch, q)
		n := len(a.watch)
		a.mu.Unlock()
		if watch != nil {
			watch(n, r, w)
			return
		}
		hang(w, r)
	}))
	t.Cleanup(func() { a.srv.CloseClientConnections(); a.srv.Close() })
	return a
}

func (a *apiServer) client(t *testing.T) kubernetes.Interface {
	c, err := kubernetes.NewForConfig(&rest.Config{Host: a.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// requests returns the queries of the lists and watches so far.
func (a *apiServer) requests() (lists, watches []url.Values) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.lists), slices.Clone(a.watch)
}

// writeJSON answers with obj. A write error means the client went (a
// stopped reflector), possibly after the test ended: not the test's failure.
func writeJSON(w http.ResponseWriter, code int, obj any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(obj)
}

// thenList answers the first list with Pod a at version 5, and every later
// one with a and added at version 9.
func thenList(added v1.Pod) func(n int, q url.Values, w http.ResponseWriter) {
	return func(n int, q url.Values, w http.ResponseWriter) {
		if n == 1 {
			writeJSON(w, http.StatusOK, podList("5", "", pod("a", "4")))
			return
		}
		writeJSON(w, http.StatusOK, podList("9", "", pod("a", "4"), added))
	}
}

// writePages answers a list of all at version 10: one Pod a page when the
// request asks for pages (limit), the continue token the next one's index.
func writePages(w http.ResponseWriter, q url.Values, all []v1.Pod) {
	if q.Get("limit") == "" {
		writeJSON(w, http.StatusOK, podList("10", "", all...))
		return
	}
	i, _ := strconv.Atoi(q.Get("continue"))
	cont := ""
	if i+1 < len(all) {
		cont = strconv.Itoa(i + 1)
	}
	writeJSON(w, http.StatusOK, podList("10", cont, all[i]))
}

// hang answers a watch with nothing until the client goes.
func hang(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

// writeEvents answers a watch with events, then ends it.
func writeEvents(w http.ResponseWriter, events ...metav1.WatchEvent) {
	w.Header().Set("Content-Type", "application/json")
	for _, ev := range events {
		_ = json.NewEncoder(w).Encode(ev) // as writeJSON
	}
}

func event(typ string, obj runtime.Object) metav1.WatchEvent {
	return metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Object: obj}}
}

// fast is a short backoff, so that the tests' retries come at once.
var fast = wait.Backoff{Duration: time.Millisecond, Factor: 2, Steps: 3, Cap: 5 * time.Millisecond}

// recorder keeps what a run reports.
type recorder struct {
	mu        sync.Mutex
	malformed []error
	failed    []error
	expired   int
	relisted  []int
}

func (r *recorder) events() Events {
	return Events{
		Malformed: func(err error) { r.mu.Lock(); r.malformed = append(r.malformed, err); r.mu.Unlock() },
		Failed:    func(err error) { r.mu.Lock(); r.failed = append(r.failed, err); r.mu.Unlock() },
		Expired:   func() { r.mu.Lock(); r.expired++; r.mu.Unlock() },
		Relisted:  func(n int, _ time.Duration) { r.mu.Lock(); r.relisted = append(r.relisted, n); r.mu.Unlock() },
	}
}

func (r *recorder) read(f func(r *recorder) bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return f(r)
}

// eventually waits (at most 10 s) until cond holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// start runs lw into st (a new store if nil) until the test ends.
func start(t *testing.T, lw *ListerWatcher, rec *recorder, st *Store[*slim]) *Store[*slim] {
	if st == nil {
		st = &Store[*slim]{}
	}
	b := fast
	run := Start(lw, st, Options{Name: t.Name(), Backoff: &b, Events: rec.events()})
	t.Cleanup(func() {
		st.Close()
		if err := run.Stop(); err != nil {
			t.Error(err)
		}
	})
	return st
}

func keys(st *Store[*slim]) []string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return slices.Sorted(func(yield func(string) bool) {
		for k := range st.items {
			if !yield(k) {
				return
			}
		}
	})
}

// A watch that expires (410, as an HTTP reply or as an error event of the
// stream: the API server restarted, or the watch fell behind) is reported,
// and every object is listed again from the version the reflector had, in
// one request (from the watch cache); that list replaces the store's
// objects and is reported as a relist.
func TestExpiredWatchRelists(t *testing.T) {
	for _, how := range []string{"reply", "event"} {
		t.Run(how, func(t *testing.T) {
			a := newAPIServer(t, thenList(pod("b", "8")), func(n int, r *http.Request, w http.ResponseWriter) {
				if r.URL.Query().Get("resourceVersion") != "5" {
					hang(w, r)
					return
				}
				if how == "reply" {
					writeJSON(w, http.StatusGone, expiredStatus())
					return
				}
				writeEvents(w, event(string(watch.Error), expiredStatus()))
			})
			rec := &recorder{}
			st := start(t, Pods(a.client(t), "app=x", toSlim), rec, nil)
			eventually(t, "relisted", func() bool { return rec.read(func(r *recorder) bool { return len(r.relisted) > 0 }) })
			// Relisted is heard before the store takes the list (the
			// reflector replaces the store's objects once the list returns).
			eventually(t, "the relist in the store (ns/a and ns/b)", func() bool { return slices.Equal(keys(st), []string{"ns/a", "ns/b"}) })
			rec.read(func(r *recorder) bool {
				if r.expired != 1 || !slices.Equal(r.relisted, []int{2}) || len(r.failed) != 0 {
					t.Errorf("reported %d expiries, relists %v, failures %v; want 1, [2], none", r.expired, r.relisted, r.failed)
				}
				return true
			})
			lists, _ := a.requests()
			if len(lists) < 2 {
				t.Fatalf("%d lists", len(lists))
			}
			for i, want := range []url.Values{
				{"resourceVersion": {"0"}, "limit": {"500"}, "labelSelector": {"app=x"}},
				{"resourceVersion": {"5"}, "labelSelector": {"app=x"}},
			} {
				got := url.Values{}
				for k, v := range lists[i] {
					if k != "timeout" {
						got[k] = v
					}
				}
				if !equalValues(got, want) {
					t.Errorf("list %d: %v, want %v", i+1, lists[i], want)
				}
			}
		})
	}
}

func equalValues(a, b url.Values) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// An API server that answers lists in pages (no watch cache) is listed in
// pages again after an expiry: the pages make one list, reported once as a
// relist of all their objects, and replace the store in one step.
func TestPagedRelist(t *testing.T) {
	all := []v1.Pod{pod("a", "2"), pod("b", "3"), pod("c", "4")}
	var replaced []int
	a := newAPIServer(t, func(n int, q url.Values, w http.ResponseWriter) {
		writePages(w, q, all)
	}, func(n int, r *http.Request, w http.ResponseWriter) {
		writeJSON(w, http.StatusGone, expiredStatus())
	})
	rec := &recorder{}
	st := &Store[*slim]{}
	var mu sync.Mutex
	st.Replaced = func(_, objs map[string]*slim) { mu.Lock(); replaced = append(replaced, len(objs)); mu.Unlock() }
	b := fast
	run := Start(Pods(a.client(t), "", toSlim), st, Options{Backoff: &b, Events: rec.events()})
	// The relist is reported before the store is replaced: wait for both.
	eventually(t, "relisted twice", func() bool {
		mu.Lock()
		n := len(replaced)
		mu.Unlock()
		return n >= 3 && rec.read(func(r *recorder) bool { return len(r.relisted) >= 2 })
	})
	st.Close()
	if err := run.Stop(); err != nil {
		t.Error(err)
	}
	rec.read(func(r *recorder) bool {
		if !slices.Equal(r.relisted[:2], []int{3, 3}) {
			t.Errorf("relists reported %v, want 3 objects each", r.relisted)
		}
		return true
	})
	mu.Lock()
	if len(replaced) < 3 || slices.ContainsFunc(replaced, func(n int) bool { return n != 3 }) {
		t.Errorf("store replaced with %v objects, want 3 each time", replaced)
	}
	mu.Unlock()
	lists, _ := a.requests()
	if len(lists) < 6 {
		t.Fatalf("%d list requests, want the first list's 3 pages and a relist's", len(lists))
	}
	for i, q := range lists[:6] {
		if q.Get("limit") == "" || q.Get("continue") != []string{"", "1", "2"}[i%3] {
			t.Errorf("list request %d: %v, want a page", i+1, q)
		}
	}
}

// A list that breaks off (here a protobuf list 10 bytes short) is reported
// as malformed and as a failure; the store keeps what it holds until a
// list comes whole.
func TestMalformedList(t *testing.T) {
	enc := scheme.Codecs.EncoderForVersion(protoser.NewSerializer(scheme.Scheme, scheme.Scheme), v1.SchemeGroupVersion)
	encode := func(l *v1.PodList) []byte {
		var b bytes.Buffer
		if err := enc.Encode(l, &b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	first := encode(podList("5", "", pod("a", "4")))
	whole := encode(podList("9", "", pod("a", "4"), pod("b", "8")))
	cut := whole[:len(whole)-10]
	var mu sync.Mutex
	broken := true
	a := newAPIServer(t, func(n int, q url.Values, w http.ResponseWriter) {
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case n == 1:
			w.Write(first)
		case broken:
			w.Write(cut)
		default:
			w.Write(whole)
		}
	}, func(n int, r *http.Request, w http.ResponseWriter) {
		writeJSON(w, http.StatusGone, expiredStatus())
	})
	client, err := podproto.NewClient(&rest.Config{Host: a.srv.URL, ContentConfig: rest.ContentConfig{ContentType: runtime.ContentTypeProtobuf}}, podproto.Plugin)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	st := start(t, Pods(client, "", toSlim), rec, nil)
	eventually(t, "malformed lists", func() bool { return rec.read(func(r *recorder) bool { return len(r.malformed) >= 2 }) })
	if got := keys(st); !slices.Equal(got, []string{"ns/a"}) {
		t.Errorf("store holds %v after malformed lists, want what it held (ns/a)", got)
	}
	rec.read(func(r *recorder) bool {
		for _, err := range r.malformed {
			if !errors.Is(err, podproto.ErrStream) {
				t.Errorf("malformed: %v, want podproto.ErrStream", err)
			}
		}
		if len(r.failed) < len(r.malformed) || len(r.relisted) != 0 {
			t.Errorf("failures %v, relists %v; want each malformed list failed, no relist", r.failed, r.relisted)
		}
		return true
	})
	mu.Lock()
	broken = false
	mu.Unlock()
	eventually(t, "whole list", func() bool { return slices.Equal(keys(st), []string{"ns/a", "ns/b"}) })
}

// A watch event that does not decode ends the watch: reported as a
// failure, and the reflector lists again from the version it had; the
// store keeps what it holds meanwhile.
func TestMalformedWatch(t *testing.T) {
	a := newAPIServer(t, thenList(pod("b", "8")), func(n int, r *http.Request, w http.ResponseWriter) {
		if n > 1 {
			hang(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"type":"BOGUS","object":{"kind":"Pod","apiVersion":"v1"}}` + "\n"))
	})
	rec := &recorder{}
	st := start(t, Pods(a.client(t), "", toSlim), rec, nil)
	eventually(t, "relisted", func() bool { return rec.read(func(r *recorder) bool { return len(r.relisted) > 0 }) })
	// Relisted is heard before the store takes the list.
	eventually(t, "the relist in the store (ns/a and ns/b)", func() bool { return slices.Equal(keys(st), []string{"ns/a", "ns/b"}) })
	rec.read(func(r *recorder) bool {
		if len(r.failed) != 1 || !strings.Contains(r.failed[0].Error(), "unable to decode an event from the watch stream") {
			t.Errorf("failures %v, want the watch's decode error", r.failed)
		}
		return true
	})
	if lists, _ := a.requests(); lists[1].Get("resourceVersion") != "5" {
		t.Errorf("relist %v, want from version 5", lists[1])
	}
}

// An object the Transform refuses fails the list that holds it (reported;
// the store keeps what it held) and ends the watch that brought it with an
// error, after which the reflector lists again from the version it had; the
// object never reaches the store.
func TestTransformError(t *testing.T) {
	refuse := errors.New("refused")
	transform := func(p *v1.Pod) (runtime.Object, error) {
		if p.Name == "bad" {
			return nil, refuse
		}
		return toSlim(p)
	}
	a := newAPIServer(t, thenList(pod("bad", "8")), func(n int, r *http.Request, w http.ResponseWriter) {
		b := pod("bad", "8")
		writeEvents(w, event(string(watch.Added), &b))
	})
	rec := &recorder{}
	var changed []string
	var mu sync.Mutex
	st := start(t, Pods(a.client(t), "", transform), rec, &Store[*slim]{
		Changed: func(_, s *slim) { mu.Lock(); changed = append(changed, s.Name); mu.Unlock() },
	})
	eventually(t, "a list failed", func() bool {
		return rec.read(func(r *recorder) bool {
			return slices.ContainsFunc(r.failed, func(err error) bool { return errors.Is(err, refuse) })
		})
	})
	if got := keys(st); !slices.Equal(got, []string{"ns/a"}) {
		t.Errorf("store holds %v, want what it held (ns/a)", got)
	}
	mu.Lock()
	if len(changed) != 0 {
		t.Errorf("the store took %v", changed)
	}
	mu.Unlock()
	lists, watches := a.requests()
	if len(watches) != 1 || lists[1].Get("resourceVersion") != "5" {
		t.Errorf("watches %v, then lists %v; want one watch, then lists from version 5", watches, lists[1:])
	}
}

// Once Close returns, the store calls none of the component's functions and
// changes nothing; Close waits for a call that is running.
func TestStoreClose(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var calls []string
	st := &Store[*slim]{}
	st.Changed = func(_, s *slim) {
		calls = append(calls, "changed "+s.Name)
		if s.Name == "slow" {
			close(entered)
			<-release
		}
	}
	st.Deleted = func(s *slim) { calls = append(calls, "deleted "+s.Name) }
	st.Replaced = func(_, objs map[string]*slim) { calls = append(calls, "replaced "+strconv.Itoa(len(objs))) }
	obj := func(name string) *slim { return &slim{Meta: Meta{Namespace: "ns", Name: name}} }

	if err := st.Replace([]any{obj("a")}, "1"); err != nil {
		t.Fatal(err)
	}
	go st.Add(obj("slow"))
	<-entered
	closed := make(chan struct{})
	go func() { st.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while the component's Changed was running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return once Changed did")
	}
	st.Add(obj("b"))
	st.Update(obj("a"))
	st.Delete(obj("a"))
	st.Replace([]any{obj("c")}, "2")
	if want := []string{"replaced 1", "changed slow"}; !slices.Equal(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	if got := keys(st); !slices.Equal(got, []string{"ns/a", "ns/slow"}) {
		t.Errorf("closed store holds %v, want what it held before Close", got)
	}
}

// Stop returns nil once the reflector ended; when it does not end within
// StopWait (a list that does not heed its context), Stop returns an error
// wrapping ErrSlow, and the reflector still ends in the background.
func TestRunStop(t *testing.T) {
	t.Run("ends", func(t *testing.T) {
		a := newAPIServer(t, func(n int, q url.Values, w http.ResponseWriter) {
			writeJSON(w, http.StatusOK, podList("5", "", pod("a", "4")))
		}, nil)
		st := &Store[*slim]{}
		run := Start(Pods(a.client(t), "", toSlim), st, Options{StopWait: 10 * time.Second})
		eventually(t, "listed", st.Listed)
		if err := run.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
		if run.Context().Err() == nil {
			t.Error("the run's context is not done after Stop")
		}
	})
	t.Run("slow", func(t *testing.T) {
		a := newAPIServer(t, func(n int, q url.Values, w http.ResponseWriter) {
			writeJSON(w, http.StatusOK, podList("5", "", pod("a", "4")))
		}, nil)
		replacing, release := make(chan struct{}), make(chan struct{})
		st := &Store[*slim]{Replaced: func(_, _ map[string]*slim) {
			close(replacing)
			<-release // a component that takes long
		}}
		run := Start(Pods(a.client(t), "", toSlim), st, Options{StopWait: 20 * time.Millisecond})
		<-replacing
		err := run.Stop()
		if !errors.Is(err, ErrSlow) {
			t.Errorf("Stop: %v, want ErrSlow", err)
		}
		close(release)
		select {
		case <-run.done:
		case <-time.After(10 * time.Second):
			t.Fatal("the reflector did not end once the store returned")
		}
	})
}
