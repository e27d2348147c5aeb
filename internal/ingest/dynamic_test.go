package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
	"github.com/mcsannotations/mcsannotations/internal/replytest"
)

// What eachJSONItem makes of each shape of reply: a list's items one by
// one, and an error wrapping ErrStream, never an empty list, for anything
// that is not a whole list.
func TestEachJSONItem(t *testing.T) {
	cases := []struct {
		name   string
		body   string
		items  []string
		rv     string
		broken bool
	}{
		{"a list", `{"kind":"XList","apiVersion":"x/v1","metadata":{"resourceVersion":"7","continue":"c"},"items":[{"a":1},{"b":[2,3]},{}]}`,
			[]string{`{"a":1}`, `{"b":[2,3]}`, `{}`}, "7", false},
		{"items before metadata", `{"items":[{"a":1}],"metadata":{"resourceVersion":"8"}}`, []string{`{"a":1}`}, "8", false},
		{"no items", `{"kind":"XList","metadata":{"resourceVersion":"9"},"items":[]}`, nil, "9", false},
		{"items null", `{"kind":"XList","metadata":{},"items":null}`, nil, "", false},
		{"a Status", `{"kind":"Status","apiVersion":"v1","status":"Failure","code":500}`, nil, "", true},
		{"cut inside an item", `{"kind":"XList","items":[{"a":1},{"b":`, []string{`{"a":1}`}, "", true},
		{"cut between items", `{"kind":"XList","items":[{"a":1},`, []string{`{"a":1}`}, "", true},
		{"cut after the items", `{"kind":"XList","items":[{"a":1}]`, []string{`{"a":1}`}, "", true},
		{"empty", ``, nil, "", true},
		{"not JSON", `<html>`, nil, "", true},
		{"items an object", `{"items":{"a":1}}`, nil, "", true},
		{"items a string", `{"items":"x"}`, nil, "", true},
		{"metadata a string", `{"metadata":"x","items":[]}`, nil, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			var tm metav1.TypeMeta
			meta, err := eachJSONItem(strings.NewReader(tc.body), 1<<20, &tm, func(raw []byte) error {
				got = append(got, string(raw))
				return nil
			})
			if tc.broken != (err != nil) || err != nil && !errors.Is(err, ErrStream) {
				t.Fatalf("error %v, want broken %v (wrapping ErrStream)", err, tc.broken)
			}
			if !slices.Equal(got, tc.items) {
				t.Errorf("items %q, want %q", got, tc.items)
			}
			if !tc.broken && meta.ResourceVersion != tc.rv {
				t.Errorf("resource version %q, want %q", meta.ResourceVersion, tc.rv)
			}
			if tc.name == "a list" && (tm.Kind != "XList" || tm.APIVersion != "x/v1") {
				t.Errorf("the list's type %+v, want XList x/v1", tm)
			}
		})
	}
}

// Each item is bounded, the list is not: a list of many small items reads
// whole, an item over the bound is refused with ErrTooLarge after the items
// before it were handed over, and so is metadata over MaxListMeta.
func TestEachJSONItemBound(t *testing.T) {
	item := `{"pad":"` + strings.Repeat("x", 80) + `"}`
	many := `{"items":[` + strings.Repeat(item+",", 999) + item + `]}`
	n := 0
	if _, err := eachJSONItem(strings.NewReader(many), 200, &metav1.TypeMeta{}, func([]byte) error { n++; return nil }); err != nil || n != 1000 {
		t.Fatalf("a list of 1,000 small items (%d bytes) under a bound of 200 per item: %d items, %v", len(many), n, err)
	}
	big := `{"pad":"` + strings.Repeat("x", 5000) + `"}`
	for name, body := range map[string]string{
		"item":     `{"items":[` + item + "," + big + `]}`,
		"metadata": `{"metadata":{"continue":"` + strings.Repeat("x", 2*podproto.MaxListMeta) + `"},"items":[]}`,
	} {
		t.Run(name, func(t *testing.T) {
			var got int
			_, err := eachJSONItem(strings.NewReader(body), 200, &metav1.TypeMeta{}, func([]byte) error { got++; return nil })
			if !errors.Is(err, ErrStream) || !errors.Is(err, ErrTooLarge) {
				t.Fatalf("an oversized %s: %v, want ErrStream and ErrTooLarge", name, err)
			}
			if name == "item" && got != 1 {
				t.Errorf("%d items handed over before the oversized one, want 1", got)
			}
		})
	}
}

// An error of each ends the list and comes back as it is, not as a broken
// stream (the reflector reports only the latter as malformed).
func TestEachJSONItemEachError(t *testing.T) {
	mine := errors.New("mine")
	_, err := eachJSONItem(strings.NewReader(`{"items":[{},{},{}]}`), 1<<20, &metav1.TypeMeta{}, func([]byte) error { return mine })
	if err != mine {
		t.Fatalf("got %v, want each's own error", err)
	}
}

var gvrX = schema.GroupVersionResource{Group: "x.example", Version: "v1", Resource: "things"}

// thing is the JSON of one item of a list of things.
func thing(i int) string {
	return fmt.Sprintf(`{"apiVersion":"x.example/v1","kind":"Thing","metadata":{"namespace":"ns","name":"t%d","resourceVersion":"%d"},"spec":{"port":%d}}`, i, i, 1000+i)
}

// ListEach hands over each item while the API server is still sending the
// list: the reply is never held whole. The server sends the first item,
// then waits for the test to have it before it sends the rest.
func TestListEachStreams(t *testing.T) {
	t.Setenv("KUBE_FEATURE_ClientsAllowCBOR", "true") // the list is still asked for in JSON only
	got1 := make(chan struct{})
	var query, accept string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/x.example/v1/things" {
			http.NotFound(w, r)
			return
		}
		query, accept = r.URL.RawQuery, r.Header.Get("Accept")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"kind":"ThingList","apiVersion":"x.example/v1","metadata":{"resourceVersion":"42"},"items":[`+thing(1))
		w.(http.Flusher).Flush()
		select {
		case <-got1:
		case <-time.After(5 * time.Second): // the test fails: the item was not handed over
		}
		for i := 2; i <= 3; i++ {
			io.WriteString(w, ","+thing(i))
		}
		io.WriteString(w, `]}`)
	}))
	defer srv.Close()
	rc := &rest.Config{Host: srv.URL}
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return Transport(rt, nil) })
	d, err := NewDynamic(rc)
	if err != nil {
		t.Fatal(err)
	}
	var (
		names []string
		first = time.Now()
		once  sync.Once
	)
	meta, err := d.ListEach(context.Background(), gvrX, metav1.ListOptions{ResourceVersion: "40"}, func(u *unstructured.Unstructured) error {
		names = append(names, u.GetName())
		if port, _, _ := unstructured.NestedInt64(u.Object, "spec", "port"); port < 1000 {
			t.Errorf("%s: spec.port %d, want it read as an integer", u.GetName(), port)
		}
		once.Do(func() { first = time.Now(); close(got1) })
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"t1", "t2", "t3"}) || meta.ResourceVersion != "42" {
		t.Fatalf("items %v at version %q, want t1-t3 at 42", names, meta.ResourceVersion)
	}
	if query != "resourceVersion=40" || accept != "application/json" {
		t.Errorf("query %q, Accept %q; want the list options, in JSON", query, accept)
	}
	if time.Since(first) > 4*time.Second {
		t.Errorf("the first item was handed over only once the list had ended")
	}
}

// The items of a built-in type's list carry no kind: ListEach gives each
// the list's, as the dynamic client does; an item that is no object breaks
// the list.
func TestListEachBuiltIn(t *testing.T) {
	body := `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"3"},"items":[{"metadata":{"name":"p","namespace":"ns"},"spec":{"priority":7}}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/pods" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, body)
	}))
	defer srv.Close()
	d, err := NewDynamic(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	pods := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	var got []*unstructured.Unstructured
	if _, err := d.ListEach(context.Background(), pods, metav1.ListOptions{}, func(u *unstructured.Unstructured) error {
		got = append(got, u)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].GetKind() != "Pod" || got[0].GetAPIVersion() != "v1" || got[0].GetName() != "p" {
		t.Fatalf("items %v, want the Pod p of kind Pod, v1", got)
	}
	if prio, ok, err := unstructured.NestedInt64(got[0].Object, "spec", "priority"); !ok || err != nil || prio != 7 {
		t.Errorf("spec.priority %d (%v, %v), want 7 as an integer", prio, ok, err)
	}
	body = `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"name":"p"}},null]}`
	if _, err := d.ListEach(context.Background(), pods, metav1.ListOptions{}, func(*unstructured.Unstructured) error { return nil }); !errors.Is(err, ErrStream) {
		t.Errorf("a null item: %v, want ErrStream", err)
	}
}

// Resource lists through a *Dynamic one item at a time, and through any
// other dynamic client (a fake here) with its List; either way the store
// gets the transformed items and the list's version.
func TestResource(t *testing.T) {
	transform := func(u *unstructured.Unstructured) (runtime.Object, error) {
		return &slim{Meta: MetaOf(u)}, nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"kind":"ThingList","metadata":{"resourceVersion":"5"},"items":[`+thing(1)+","+thing(2)+`]}`)
	}))
	defer srv.Close()
	d, err := NewDynamic(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	obj := func(i int) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON([]byte(thing(i))); err != nil {
			t.Fatal(err)
		}
		return u
	}
	fake := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvrX: "ThingList"}, obj(1), obj(2))
	for _, tc := range []struct {
		name string
		lw   *ListerWatcher
		rv   string
	}{{"streamed", Resource(d, gvrX, transform), "5"}, {"fake", Resource(fake, gvrX, transform), ""}} {
		t.Run(tc.name, func(t *testing.T) {
			obj, err := tc.lw.ListWithContext(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			list, ok := obj.(*List)
			if !ok {
				t.Fatalf("a %T, want a *List", obj)
			}
			var keys []string
			for _, it := range list.Items {
				keys = append(keys, it.(*slim).Key())
			}
			slices.Sort(keys)
			if !slices.Equal(keys, []string{"ns/t1", "ns/t2"}) || tc.rv != "" && list.ResourceVersion != tc.rv {
				t.Errorf("items %v at %q, want ns/t1 and ns/t2 at %q", keys, list.ResourceVersion, tc.rv)
			}
		})
	}
}

// A list ListEach cannot read whole (cut off) is reported as malformed,
// wrapping ErrStream; the store keeps what it holds until a whole list
// comes.
func TestMalformedJSONList(t *testing.T) {
	item := func(name, rv string) string {
		return fmt.Sprintf(`{"metadata":{"namespace":"ns","name":%q,"resourceVersion":%q}}`, name, rv)
	}
	first := `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[` + item("a", "4") + `]}`
	whole := `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[` + item("a", "4") + "," + item("b", "8") + `]}`
	var mu sync.Mutex
	broken := true
	a := newAPIServer(t, func(n int, _ url.Values, w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		mu.Lock()
		defer mu.Unlock()
		switch {
		case n == 1:
			io.WriteString(w, first)
		case broken:
			io.WriteString(w, whole[:len(whole)-10])
		default:
			io.WriteString(w, whole)
		}
	}, func(n int, r *http.Request, w http.ResponseWriter) {
		writeJSON(w, http.StatusGone, expiredStatus())
	})
	d, err := NewDynamic(&rest.Config{Host: a.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	pods := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	rec := &recorder{}
	st := start(t, Resource(d, pods, func(u *unstructured.Unstructured) (runtime.Object, error) { return &slim{Meta: MetaOf(u)}, nil }), rec, nil)
	eventually(t, "malformed lists", func() bool { return rec.read(func(r *recorder) bool { return len(r.malformed) >= 2 }) })
	if got := keys(st); !slices.Equal(got, []string{"ns/a"}) {
		t.Errorf("store holds %v after malformed lists, want what it held (ns/a)", got)
	}
	rec.read(func(r *recorder) bool {
		for _, err := range r.malformed {
			if !errors.Is(err, ErrStream) {
				t.Errorf("malformed: %v, want ErrStream", err)
			}
		}
		return true
	})
	mu.Lock()
	broken = false
	mu.Unlock()
	eventually(t, "whole list", func() bool { return slices.Equal(keys(st), []string{"ns/a", "ns/b"}) })
}

// A list the API server refuses comes back as the API error it is, for the
// reflector to tell apart (403 is logged, 410 relists from scratch), not
// as a broken stream; so does a server that is gone.
func TestListEachRefused(t *testing.T) {
	cases := []struct {
		code int
		is   func(error) bool
	}{
		{http.StatusForbidden, apierrors.IsForbidden},
		{http.StatusGone, isExpired},
		{http.StatusInternalServerError, apierrors.IsInternalError},
	}
	for _, tc := range cases {
		t.Run(http.StatusText(tc.code), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, tc.code, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
					Status: metav1.StatusFailure, Code: int32(tc.code), Reason: metav1.StatusReason(http.StatusText(tc.code))})
			}))
			defer srv.Close()
			d, err := NewDynamic(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			_, err = d.ListEach(context.Background(), gvrX, metav1.ListOptions{}, func(*unstructured.Unstructured) error { return nil })
			if !tc.is(err) || errors.Is(err, ErrStream) {
				t.Errorf("got %v, want the API's %d and no ErrStream", err, tc.code)
			}
		})
	}
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	d, err := NewDynamic(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.ListEach(context.Background(), gvrX, metav1.ListOptions{}, func(*unstructured.Unstructured) error { return nil }); err == nil || errors.Is(err, ErrStream) {
		t.Errorf("a server that is gone: %v, want a connection error", err)
	}
}

// A list whose metadata (a continue token) or another field but its items
// is 256 MB is refused as malformed (ErrStream, ErrTooLarge) once
// MaxListMeta bytes of it are held: ListEach reads a few times MaxListMeta
// of the reply, never the field whole (nor MaxEvent of it).
func TestListEachMetadataBounded(t *testing.T) {
	const huge = 256 << 20
	head := `{"kind":"ThingList","apiVersion":"x.example/v1","metadata":{"resourceVersion":"5"`
	cases := map[string]struct{ before, after string }{
		"continue token":         {head + `,"continue":"`, `"},"items":[]}`},
		"remaining count digits": {head + `,"remainingItemCount":1`, `},"items":[]}`},
		"unknown string field":   {head + `},"padding":"`, `","items":[]}`},
		"unknown object field":   {head + `},"padding":{"a":"`, `"},"items":[]}`},
		"kind":                   {`{"kind":"`, `","items":[]}`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			pad := strings.Repeat("1", 64<<10)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/apis/x.example/v1/things" || r.URL.Query().Get("watch") != "" {
					http.NotFound(w, r)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				if _, err := io.WriteString(w, c.before); err != nil {
					return
				}
				for n := 0; n < huge; n += len(pad) {
					if _, err := io.WriteString(w, pad); err != nil {
						return // the client gave up
					}
				}
				io.WriteString(w, c.after)
			}))
			defer srv.Close()
			var over atomic.Bool
			limit := int64(4 * podproto.MaxListMeta)
			d, err := NewDynamic(&rest.Config{Host: srv.URL, WrapTransport: replytest.Counting(limit, &over)})
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{}
			start(t, Resource(d, gvrX, func(u *unstructured.Unstructured) (runtime.Object, error) { return &slim{Meta: MetaOf(u)}, nil }), rec, nil)
			eventually(t, "a malformed list", func() bool { return rec.read(func(r *recorder) bool { return len(r.malformed) >= 1 }) })
			if over.Load() {
				t.Errorf("a reply was read past %d bytes before it was refused", limit)
			}
			rec.read(func(r *recorder) bool {
				if err := r.malformed[0]; !errors.Is(err, ErrStream) || !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "the list's metadata") {
					t.Errorf("malformed: %v, want ErrStream and ErrTooLarge for the list's metadata", err)
				}
				return true
			})
		})
	}
}
