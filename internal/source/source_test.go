package source

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/miekg/dns"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/podproto"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

const zone = "clusterset.local."

func newPod(name, ip, anno string, ready bool) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "default", UID: types.UID("uid-" + name), ResourceVersion: "1",
			Labels:      map[string]string{annotation.ExporterLabel: "true"},
			Annotations: map[string]string{annotation.ExportAnnotation: anno},
		},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: ip, PodIPs: []v1.PodIP{{IP: ip}}},
	}
	status := v1.ConditionFalse
	if ready {
		status = v1.ConditionTrue
	}
	p.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: status}}
	return p
}

const backend = `{"services":[{"name":"backend","ports":[{"name":"http","port":80}]}]}`

type recorder struct {
	mu       sync.Mutex
	rejected map[string][]annotation.Reason
}

func (r *recorder) events() Events {
	return Events{Rejected: func(cluster, ns, name string, rej []annotation.Rejection) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, x := range rej {
			r.rejected[name] = append(r.rejected[name], x.Reason)
		}
	}}
}

func (r *recorder) get(name string) []annotation.Reason {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rejected[name])
}

// eventually polls cond until it holds, for at most 5 seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// testTable is a record store, which a source writes to, and the DNS table
// over it, which a test reads answers from.
type testTable struct {
	*store.Store
	*table.Table
}

func newTable() testTable {
	st := store.New()
	return testTable{st, table.New(table.Config{Zone: zone, TTL: 5, LocalCluster: "edge-a"}, st)}
}

func answer(tb testTable, q string) []string {
	a := tb.Rebuild().Lookup(q+zone, dns.TypeA)
	var out []string
	for _, r := range a.A {
		out = append(out, r.A.String())
	}
	slices.Sort(out)
	return out
}

func TestSourceLifecycle(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(newPod("a", "10.0.0.1", backend, true))
	tb := newTable()
	// A record of this cluster from an older snapshot: gone from the API.
	tb.Upsert(&store.Pod{Common: &store.Common{Cluster: "edge-a", Namespace: "default", Exports: []annotation.Export{{Name: "backend", Namespace: "default", Cluster: "edge-a"}}}, Name: "stale", Ready: true,
		IPs: []netip.Addr{netip.MustParseAddr("10.9.9.9")}})
	// A record of another cluster must survive this source's first list.
	tb.Upsert(&store.Pod{Common: &store.Common{Cluster: "edge-b", Namespace: "default", Exports: []annotation.Export{{Name: "peer", Namespace: "default", Cluster: "edge-b"}}}, Name: "peer", Ready: true,
		IPs: []netip.Addr{netip.MustParseAddr("10.1.0.1")}})
	rec := &recorder{rejected: map[string][]annotation.Reason{}}
	s := New("edge-a", client, tb.Store, rec.events(), Options{})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if err := s.Start(); err == nil {
		t.Error("second Start must fail")
	}

	eventually(t, "first sync", s.HasSynced)
	if got := answer(tb, "backend.default.svc."); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Fatalf("after sync: %v (the stale snapshot record must be gone)", got)
	}
	if got := answer(tb, "peer.default.svc."); !slices.Equal(got, []string{"10.1.0.1"}) {
		t.Fatalf("other cluster's record lost: %v", got)
	}
	if s.State() != Connected || s.LastContact().IsZero() {
		t.Errorf("state %v, last contact %v", s.State(), s.LastContact())
	}

	pods := client.CoreV1().Pods("default")
	// Add a second Pod.
	if _, err := pods.Create(ctx, newPod("b", "10.0.0.2", backend, true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "add", func() bool { return slices.Equal(answer(tb, "backend.default.svc."), []string{"10.0.0.1", "10.0.0.2"}) })

	// Pod b becomes not ready.
	b := newPod("b", "10.0.0.2", backend, false)
	b.ResourceVersion = "2"
	if _, err := pods.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "not ready", func() bool { return slices.Equal(answer(tb, "backend.default.svc."), []string{"10.0.0.1"}) })

	// Pod a changes IP.
	a := newPod("a", "10.0.0.7", backend, true)
	a.ResourceVersion = "3"
	if _, err := pods.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ip change", func() bool { return slices.Equal(answer(tb, "backend.default.svc."), []string{"10.0.0.7"}) })

	// Pod a's annotation becomes invalid: it leaves the service, a rejection is reported once.
	a = newPod("a", "10.0.0.7", `{"services":[{"name":"backend","namespace":"kube-system"}]}`, true)
	a.ResourceVersion = "4"
	if _, err := pods.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "invalid annotation", func() bool { return answer(tb, "backend.default.svc.") == nil })
	// A status-only update with the same bad annotation is not reported again.
	a = a.DeepCopy()
	a.ResourceVersion = "5"
	a.Status.PodIP, a.Status.PodIPs = "10.0.0.8", []v1.PodIP{{IP: "10.0.0.8"}}
	if _, err := pods.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := newPod("c", "10.0.0.3", backend, true)
	if _, err := pods.Create(ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pod c", func() bool { return slices.Equal(answer(tb, "backend.default.svc."), []string{"10.0.0.3"}) })
	if got := rec.get("a"); !slices.Equal(got, []annotation.Reason{annotation.ReasonNamespaceOutside}) {
		t.Errorf("rejections of a: %v, want one namespace_mismatch", got)
	}

	// Delete.
	if err := pods.Delete(ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "delete", func() bool { return answer(tb, "backend.default.svc.") == nil })
	if n := tb.Len()["edge-a"]; n != 2 { // a (no valid export) and b (not ready)
		t.Errorf("edge-a records: %d, want 2", n)
	}
}

func TestToSlim(t *testing.T) {
	p := newPod("a", "10.0.0.1", backend, true)
	p.Spec.Hostname = "web-0"
	p.Status.PodIPs = []v1.PodIP{{IP: "10.0.0.1"}, {IP: "fd00::1"}, {IP: "not-an-ip"}, {IP: "10.0.0.1"}}
	p.Spec.Containers = []v1.Container{{Name: "big", Image: "x"}}
	s := toSlim("edge-a", nil)(p)
	r := s.rec
	if r.Hostname != "web-0" || !r.Ready || len(r.IPs) != 2 || r.IPs[1] != netip.MustParseAddr("fd00::1") || len(r.Exports) != 1 || r.Exports[0].Cluster != "edge-a" {
		t.Errorf("record %+v", r)
	}
	if s.Name != "a" || s.ResourceVersion != "1" || s.UID != p.UID || s.GetObjectMeta().GetResourceVersion() != "1" {
		t.Errorf("slim metadata %+v", s.Meta)
	}
	if c := s.DeepCopyObject().(*slimPod); c.rec != s.rec || c.Name != "a" {
		t.Error("deep copy")
	}

	// Terminating, failed and condition-less Pods are not ready.
	for _, mut := range []func(*v1.Pod){
		func(p *v1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now },
		func(p *v1.Pod) { p.Status.Phase = v1.PodFailed },
		func(p *v1.Pod) { p.Status.Conditions = nil },
	} {
		q := newPod("a", "10.0.0.1", backend, true)
		mut(q)
		if toSlim("edge-a", nil)(q).rec.Ready {
			t.Errorf("%+v must not be ready", q.Status)
		}
	}
	// Only podIP set (old API servers).
	q := newPod("a", "10.0.0.1", backend, true)
	q.Status.PodIPs = nil
	if ips := toSlim("edge-a", nil)(q).rec.IPs; len(ips) != 1 {
		t.Errorf("podIP fallback: %v", ips)
	}
}

// startSynced starts a source of cluster edge-a over client, stopped at the
// end of the test, and waits for its first complete list.
func startSynced(t *testing.T, client kubernetes.Interface) (*Source, testTable) {
	t.Helper()
	tb := newTable()
	s := New("edge-a", client, tb.Store, Events{}, Options{})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	eventually(t, "first sync", s.HasSynced)
	return s, tb
}

// Expire drops the records, and the restarted reflector's first list brings
// them back as soon as the API server answers.
func TestExpireRestoresOnNextList(t *testing.T) {
	s, tb := startSynced(t, fake.NewClientset(newPod("a", "10.0.0.1", backend, true)))
	if err := s.Expire(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "restored", func() bool {
		return !s.Expired() && slices.Equal(answer(tb, "backend.default.svc."), []string{"10.0.0.1"})
	})
	s.SeedLastContact(time.Unix(1, 0))
	if s.LastContact().Unix() == 1 {
		t.Error("a seed must not replace a known contact time")
	}
	s.SeedLastFullSync(time.Unix(1, 0))
	if s.LastFullSync().Unix() == 1 {
		t.Error("a seed must not replace a known full sync time")
	}
}

// A relist (here after the watch ends with "too old resource version")
// brings every Pod again: the ones at the version the store holds keep
// their slim objects (the store's transform reuses them), and a changed one
// is applied.
func TestRelistKeepsUnchangedObjects(t *testing.T) {
	b := newPod("b", "10.0.0.2", backend, true)
	client := fake.NewClientset(newPod("a", "10.0.0.1", backend, true), b)
	watches := make(chan *watch.RaceFreeFakeWatcher, 10)
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		w := watch.NewRaceFreeFake()
		watches <- w
		return true, w, nil
	})
	s, tb := startSynced(t, client)
	stored := func(name string) *slimPod {
		s.mu.Lock()
		st := s.feed.parts[""].store
		s.mu.Unlock()
		p, ok := st.Get("default/" + name)
		if !ok {
			t.Fatalf("%s not in the store", name)
		}
		return p
	}
	a := stored("a")

	// b changes where the watch does not see it; then the watch fails as
	// after an API server restart, and the reflector lists again.
	b = b.DeepCopy()
	b.ResourceVersion = "2"
	b.Status.PodIPs = []v1.PodIP{{IP: "10.0.0.9"}}
	if err := client.Tracker().Update(v1.SchemeGroupVersion.WithResource("pods"), b, "default"); err != nil {
		t.Fatal(err)
	}
	w := <-watches
	w.Error(&metav1.Status{Status: metav1.StatusFailure, Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version"})
	eventually(t, "the relist's change", func() bool {
		return slices.Equal(answer(tb, "backend.default.svc."), []string{"10.0.0.1", "10.0.0.9"})
	})
	if stored("a") != a {
		t.Error("the relist made a new object for a Pod whose version did not change")
	}
	if stored("b").ResourceVersion != "2" {
		t.Error("the changed Pod kept its old object")
	}
}

// Against an API server that answers 429 to everything, the reflector sleeps
// out its backoff watching its context: Expire and Stop end at once, within
// StopWait, with nothing left behind (client-go's watch-list retry, which
// sleeps without looking at its context, is off).
func TestExpireAndStopArePrompt(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/pods") { // not the /readyz checks
			requests.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429}`)
	}))
	defer srv.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	tb := newTable()
	tb.Upsert(&store.Pod{Common: &store.Common{Cluster: "edge-a", Namespace: "default", Exports: []annotation.Export{{Name: "backend", Namespace: "default", Cluster: "edge-a"}}}, Name: "a", Ready: true,
		IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
	// A long backoff: the reflector sleeps through every stop below.
	s := New("edge-a", client, tb.Store, Events{}, Options{ProbeInterval: time.Hour,
		Ingest: ingest.Options{StopWait: 500 * time.Millisecond, Backoff: &wait.Backoff{Duration: time.Minute}}})

	// asleep waits until the reflector has made a request since the count
	// was since, and a little more, so that the 429 has arrived and the
	// reflector sleeps; then it stops it, and returns the count from just
	// before the stop (a stop that starts a new reflector: its request
	// comes after). A count taken after the reflector started would miss a
	// request made meanwhile and wait for one that never comes.
	asleep := func(since int64, stop func() error, what string) int64 {
		t.Helper()
		eventually(t, what+": the reflector's request", func() bool { return requests.Load() > since })
		time.Sleep(100 * time.Millisecond)
		before, start := requests.Load(), time.Now()
		if err := stop(); err != nil {
			t.Errorf("%s after %s: %v", what, time.Since(start), err)
		}
		return before
	}
	n := requests.Load()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	n = asleep(n, s.Expire, "Expire")
	if !s.Expired() || len(answer(tb, "backend.default.svc.")) != 0 {
		t.Fatalf("Expire kept the records: expired %v, %v", s.Expired(), answer(tb, "backend.default.svc."))
	}
	asleep(n, s.Stop, "Stop")
}

// Pods with the same export annotation in one namespace share one parse (one
// store.Common); another namespace gets its own (the namespace is part of the
// result), and the cache stays bounded.
func TestToSlimSharesParse(t *testing.T) {
	f := toSlim("edge-a", nil)
	ra, rb := f(newPod("a", "10.0.0.1", backend, true)).rec, f(newPod("b", "10.0.0.2", backend, true)).rec
	if len(ra.Exports) != 1 || ra.Common != rb.Common || ra.Cluster != "edge-a" || ra.Namespace != "default" {
		t.Fatalf("not shared: %+v %+v", ra.Common, rb.Common)
	}
	other := newPod("c", "10.0.0.3", backend, true)
	other.Namespace = "other"
	rc := mustSlim(t, f, other).rec
	if len(rc.Exports) != 1 || rc.Exports[0].Namespace != "other" || rc.Namespace != "other" {
		t.Fatalf("other namespace: %+v", rc.Exports)
	}

	c := newParseCache("edge-a")
	big := `{"services":[{"name":"s","ports":[{"port":80}]}],"pad":"` + strings.Repeat("x", 4096) + `"}`
	for i := range 1000 {
		c.parse(big, fmt.Sprintf("ns-%d", i))
	}
	if c.bytes > maxCachedBytes {
		t.Fatalf("cache holds %d bytes, over %d", c.bytes, maxCachedBytes)
	}
}

func mustSlim(t *testing.T, f func(*v1.Pod) *slimPod, p *v1.Pod) *slimPod {
	t.Helper()
	return f(p)
}

// TestToSlimThroughPodproto: the transform makes the same slim object of a
// Pod whole and of the Pod as the plugin's client decodes it (podproto with
// podproto.Plugin), so no field it reads is one the decoder drops.
func TestToSlimThroughPodproto(t *testing.T) {
	gone := metav1.Unix(1790000000, 0)
	cases := map[string]func(p *v1.Pod){
		"ready, hostname, two IPs": func(p *v1.Pod) {
			p.Spec.Hostname = "web-0"
			p.Status.PodIPs = []v1.PodIP{{IP: "10.0.0.1"}, {IP: "fd00::1"}}
		},
		"not ready":   func(p *v1.Pod) { p.Status.Conditions[0].Status = v1.ConditionFalse },
		"terminating": func(p *v1.Pod) { p.DeletionTimestamp = &gone },
		"succeeded":   func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded },
		"podIP only":  func(p *v1.Pod) { p.Status.PodIPs = nil },
		"bad annotation": func(p *v1.Pod) {
			p.Annotations[annotation.ExportAnnotation] = `{"services":[{"name":"Bad_Name"},{"name":"ok"}]}`
		},
		"unrelated fields": func(p *v1.Pod) {
			p.Labels["app"], p.Annotations["other"] = "web", "x"
			p.Spec.Containers = []v1.Container{{Name: "web", Image: "registry.example/web:1"}}
			p.Status.Conditions = append([]v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionTrue}}, p.Status.Conditions...)
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			whole := newPod("a", "10.0.0.1", backend, true)
			change(whole)
			trimmed, err := podproto.Trim(whole, podproto.Plugin)
			if err != nil {
				t.Fatal(err)
			}
			a, b := toSlim("edge-a", nil)(whole), toSlim("edge-a", nil)(trimmed)
			if !reflect.DeepEqual(a, b) {
				t.Errorf("whole Pod: %+v (record %+v)\ndecoded:    %+v (record %+v)", a, a.rec, b, b.rec)
			}
		})
	}
}

// With KeepProof, a record carries the origin Pod's own bytes as the
// plugin's decoder passes them (UID, raw export annotation, endpoint
// statement and signature), the Pods of a service sharing one export string;
// without, none.
func TestToSlimKeepsProof(t *testing.T) {
	const stmt, sig = `{"ips":["10.0.0.1"],"ready":true,"seq":7}`, "ed25519:c2ln"
	f := toSlimProof("edge-a", nil, true)
	var recs []*store.Pod
	for _, name := range []string{"a", "b"} {
		p := newPod(name, "10.0.0.1", backend, true)
		p.Annotations[annotation.EndpointAnnotation] = stmt
		p.Annotations[annotation.EndpointSignatureAnnotation] = sig
		p.Annotations["other"] = "dropped"
		// A Pod's annotation value of its own, as each decoded Pod has.
		p.Annotations[annotation.ExportAnnotation] = strings.Clone(backend)
		trimmed, err := podproto.Trim(p, podproto.Plugin)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, mustSlim(t, f, trimmed).rec)
	}
	for i, r := range recs {
		want := store.Proof{UID: "uid-" + r.Name, Export: backend, Endpoint: stmt, EndpointSignature: sig}
		if r.Proof == nil || *r.Proof != want {
			t.Fatalf("record %d: proof %+v, want %+v", i, r.Proof, want)
		}
	}
	if unsafe.StringData(recs[0].Proof.Export) != unsafe.StringData(recs[1].Proof.Export) {
		t.Error("the Pods of a service hold one export string each, not one shared")
	}
	// A Pod without statement: an empty one, which the hub fills from the record.
	p := newPod("c", "10.0.0.3", backend, false)
	if r := toSlimProof("edge-a", nil, true)(p).rec; r.Proof == nil || r.Proof.Endpoint != "" || r.Proof.UID != "uid-c" {
		t.Errorf("no statement: proof %+v", r.Proof)
	}
	if r := toSlim("edge-a", nil)(p).rec; r.Proof != nil {
		t.Errorf("without KeepProof: proof %+v, want none", r.Proof)
	}
}

// A statement or signature over its bound is not kept (the hub writes its
// own unsigned statement instead), reported as a size rejection.
func TestToSlimProofBounded(t *testing.T) {
	for _, tc := range []struct{ name, stmt, sig string }{
		{"statement", `{"seq":1,"hostname":"` + strings.Repeat("a", annotation.MaxEndpointBytes) + `"}`, "ed25519:c2ln"},
		{"signature", `{"seq":1}`, "ed25519:" + strings.Repeat("A", maxSignatureBytes)},
	} {
		p := newPod("a", "10.0.0.1", backend, true)
		p.Annotations[annotation.EndpointAnnotation] = tc.stmt
		p.Annotations[annotation.EndpointSignatureAnnotation] = tc.sig
		s := toSlimProof("edge-a", nil, true)(p)
		if s.rec.Proof == nil || s.rec.Proof.Endpoint != "" || s.rec.Proof.EndpointSignature != "" || s.rec.Proof.Export != backend {
			t.Errorf("%s: proof %+v, want the export without statement", tc.name, s.rec.Proof)
		}
		if len(s.rejected) != 1 || s.rejected[0].Reason != annotation.ReasonSize || len(s.rec.Exports) != 1 {
			t.Errorf("%s: rejected %v, exports %d: want one size rejection, the export kept", tc.name, s.rejected, len(s.rec.Exports))
		}
		if ok := toSlimProof("edge-a", nil, true)(newPod("a", "10.0.0.1", backend, true)); ok.annoHash == s.annoHash {
			t.Errorf("%s: the hash that reports a rejection once does not change with it", tc.name)
		}
	}
}
