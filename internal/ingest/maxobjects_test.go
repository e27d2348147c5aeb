package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// withMaxObjects sets MaxObjects for one test.
func withMaxObjects(t *testing.T, n int) {
	old := MaxObjects
	MaxObjects = n
	t.Cleanup(func() { MaxObjects = old })
}

func pods(n int) []v1.Pod {
	ps := make([]v1.Pod, n)
	for i := range ps {
		ps[i] = pod("p"+strconv.Itoa(i), "2")
	}
	return ps
}

// A list of more than MaxObjects objects is refused, however it comes: one
// streamed reply (refused as it arrives), one reply read whole, or pages
// that are each small; reported as malformed, and the store keeps what it
// held. A list of MaxObjects is taken.
func TestListOverMaxObjects(t *testing.T) {
	const max = 3
	for _, tc := range []struct {
		name     string
		streamed bool
		paged    bool
	}{
		{"streamed", true, false},
		{"whole", false, false},
		{"pages", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withMaxObjects(t, max)
			over := false
			var a *apiServer
			a = newAPIServer(t, func(n int, q url.Values, w http.ResponseWriter) {
				a.mu.Lock()
				all := pods(max)
				if over {
					all = pods(max + 1)
				}
				a.mu.Unlock()
				if !tc.paged {
					q = url.Values{}
				}
				writePages(w, q, all)
			}, func(n int, r *http.Request, w http.ResponseWriter) {
				writeJSON(w, http.StatusGone, expiredStatus())
			})
			client := a.client(t)
			if tc.streamed {
				var err error
				if client, err = (Reader{}).Pods(&rest.Config{Host: a.srv.URL}); err != nil {
					t.Fatal(err)
				}
			}
			rec := &recorder{}
			st := start(t, Pods(client, "", toSlim), rec, nil)
			eventually(t, "a list of MaxObjects taken", func() bool { return len(keys(st)) == max })
			a.mu.Lock()
			over = true
			a.mu.Unlock()
			eventually(t, "a list over MaxObjects refused", func() bool { return rec.read(func(r *recorder) bool { return len(r.malformed) >= 1 }) })
			if got := keys(st); len(got) != max {
				t.Errorf("store holds %v after a list over the bound, want the %d it held", got, max)
			}
			rec.read(func(r *recorder) bool {
				if err := r.malformed[0]; !errors.Is(err, ErrTooLarge) {
					t.Errorf("malformed: %v, want a size bound's error", err)
				}
				return true
			})
		})
	}
}

// A store holding MaxObjects drops every new object (an update of one it
// holds still goes through) and reports the first drop of each spell, once;
// a deletion makes room, and the next spell is reported again.
func TestStoreMaxObjects(t *testing.T) {
	withMaxObjects(t, 2)
	var refused []error
	st := &Store[*slim]{}
	st.refuseWith(func(err error) { refused = append(refused, err) })
	add := func(name, ip string) {
		if err := st.Add(&slim{Meta: Meta{Namespace: "ns", Name: name}, IP: ip}); err != nil {
			t.Fatal(err)
		}
	}
	add("a", "1")
	add("b", "1")
	add("c", "1")
	add("d", "1")
	add("a", "2") // held: updated
	if got := keys(st); !slices.Equal(got, []string{"ns/a", "ns/b"}) {
		t.Fatalf("store holds %v, want ns/a and ns/b", got)
	}
	if a, _ := st.Get("ns/a"); a.IP != "2" {
		t.Errorf("ns/a not updated while full: %+v", a)
	}
	if len(refused) != 1 || !errors.Is(refused[0], ErrTooLarge) {
		t.Fatalf("refusals reported: %v, want the first drop only", refused)
	}
	if err := st.Delete(&slim{Meta: Meta{Namespace: "ns", Name: "b"}}); err != nil {
		t.Fatal(err)
	}
	add("c", "1")
	add("d", "1")
	if got := keys(st); !slices.Equal(got, []string{"ns/a", "ns/c"}) {
		t.Errorf("store holds %v, want ns/a and ns/c", got)
	}
	if len(refused) != 2 {
		t.Errorf("%d refusals reported, want one per spell (2)", len(refused))
	}
	if err := st.Replace([]any{&slim{Meta: Meta{Name: "x"}}, &slim{Meta: Meta{Name: "y"}}, &slim{Meta: Meta{Name: "z"}}}, "1"); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Replace with more than MaxObjects: %v, want an error", err)
	}
}

// Lists the API server refuses (403 here) are tried again after a wait that
// doubles (RefusedBackoff), not at the reflector's quarter-second pace; once
// a list succeeds the next refusal starts from the first step again. A
// list over a bound counts as refused. The waits are counted, not timed.
func TestRefusedListsBackOff(t *testing.T) {
	var waits []time.Duration
	var a *apiServer
	forbid := true
	a = newAPIServer(t, func(n int, q url.Values, w http.ResponseWriter) {
		a.mu.Lock()
		f := forbid
		a.mu.Unlock()
		if f {
			writeJSON(w, http.StatusForbidden, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: "pods is forbidden"})
			return
		}
		writeJSON(w, http.StatusOK, podList("5", "", pod("a", "4")))
	}, nil)
	setForbid := func(f bool) {
		a.mu.Lock()
		forbid = f
		a.mu.Unlock()
	}
	lw := Pods(a.client(t), "", toSlim)
	lw.backoff = &wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Cap: 400 * time.Millisecond}
	lw.sleep = func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }
	list := func(wantOK bool) {
		t.Helper()
		_, err := lw.ListWithContext(context.Background(), metav1.ListOptions{})
		if (err == nil) != wantOK || (err != nil && !apierrors.IsForbidden(err)) {
			t.Fatalf("list: %v, want ok %v", err, wantOK)
		}
	}
	ms := func(xs ...int) []time.Duration {
		var ds []time.Duration
		for _, x := range xs {
			ds = append(ds, time.Duration(x)*time.Millisecond)
		}
		return ds
	}
	for range 6 {
		list(false)
	}
	// The first list waits for nothing; each after a refusal 100, 200, 400 ms, ...
	if want := ms(100, 200, 400, 400, 400); !slices.Equal(waits, want) {
		t.Errorf("waits before six refused lists: %v, want %v", waits, want)
	}
	setForbid(false)
	list(true)
	setForbid(true)
	list(false)
	list(false)
	if want := ms(100, 200, 400, 400, 400, 400, 100); !slices.Equal(waits, want) {
		t.Errorf("waits: %v, want %v (the list that succeeded waits 400 ms, the refusal after it none, the next 100 ms)", waits, want)
	}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("no")), true},
		{apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, ""), true},
		{fmt.Errorf("list: %w", ErrTooLarge), true},
		{apierrors.NewServiceUnavailable("down"), false},
		{apierrors.NewTooManyRequests("slow down", 1), false},
		{fmt.Errorf("%w: cut", podproto.ErrStream), false},
	} {
		if got := refused(tc.err); got != tc.want {
			t.Errorf("refused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// An object a full store dropped is not lost for good: the watch ends (at
// its next event, or the next watch is refused as expired) and the
// reflector lists again; once the server's objects fit (here a deletion
// made room) the list brings the dropped one.
func TestDroppedObjectComesBackWithRoom(t *testing.T) {
	withMaxObjects(t, 2)
	a := newAPIServer(t, func(n int, q url.Values, w http.ResponseWriter) {
		if n == 1 {
			writeJSON(w, http.StatusOK, podList("5", "", pod("a", "4"), pod("b", "5")))
			return
		}
		writeJSON(w, http.StatusOK, podList("7", "", pod("b", "5"), pod("c", "6")))
	}, func(n int, r *http.Request, w http.ResponseWriter) {
		if n == 1 { // c while a and b fill the store, then a goes
			c, del := pod("c", "6"), pod("a", "7")
			writeEvents(w, event(string(watch.Added), &c), event(string(watch.Deleted), &del))
			return
		}
		hang(w, r)
	})
	rec := &recorder{}
	st := start(t, Pods(a.client(t), "", toSlim), rec, nil)
	eventually(t, "the dropped Pod listed again (ns/b and ns/c)", func() bool { return slices.Equal(keys(st), []string{"ns/b", "ns/c"}) })
}
