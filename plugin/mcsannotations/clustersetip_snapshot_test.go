package mcsannotations

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/table"
	"github.com/mcsannotations/mcsannotations/mcsapi"
)

func withDynamic(t *testing.T, f func(string, string) (dynamic.Interface, error)) {
	old := dynamicFor
	dynamicFor = f
	t.Cleanup(func() { dynamicFor = old })
}

func deadDynamic(string, string) (dynamic.Interface, error) {
	return dynamic.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second})
}

// clusterSetIPObject is a v1beta1 ServiceImport of type ClusterSetIP.
func clusterSetIPObject(ns, name string, ips []any, ports ...any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"type": "ClusterSetIP", "ips": ips, "ports": ports}}}
	u.SetAPIVersion(mcsapi.Group + "/v1beta1")
	u.SetKind("ServiceImport")
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetResourceVersion("1")
	return u
}

// liveAPIWithImports is a fake local API server with these Pods that serves
// ServiceImports (v1beta1) holding imports.
func liveAPIWithImports(t *testing.T, pods []runtime.Object, imports ...runtime.Object) {
	c := fake.NewClientset(pods...)
	c.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
		GroupVersion: mcsapi.Group + "/v1beta1",
		APIResources: []metav1.APIResource{{Name: mcsapi.ServiceImports, Namespaced: true, Kind: "ServiceImport"}},
	}}
	withClient(t, func(string, string) (kubernetes.Interface, error) { return c, nil })
	gvr := schema.GroupVersionResource{Group: mcsapi.Group, Version: "v1beta1", Resource: mcsapi.ServiceImports}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "ServiceImportList"}, imports...)
	withDynamic(t, func(string, string) (dynamic.Interface, error) { return dyn, nil })
}

// A ServiceImport's ClusterSetIP, learnt while the API server answered, is
// answered from the first query after a restart while it does not, and
// stays; the next complete list with the API back replaces it.
func TestSnapshotKeepsClusterSetIPsForOfflineRestart(t *testing.T) {
	const be = "backend.default.svc.clusterset.local."
	path := filepath.Join(t.TempDir(), "table.db")
	pods := []runtime.Object{exporter("b1", "10.0.0.1", backendAnno)}
	liveAPIWithImports(t, pods, clusterSetIPObject("default", "backend", []any{"10.96.0.10", "not-an-ip"},
		map[string]any{"name": "http", "port": int64(80), "protocol": "TCP"}))
	rejectedBefore := testutil.ToFloat64(rejectedImports.WithLabelValues("invalid_ip"))
	i, udp, _ := serveSnapshot(t, path)
	waitAnswer(t, udp, be, []string{"10.96.0.10"})
	if got := testutil.ToFloat64(serviceImports); got != 1 {
		t.Errorf("serviceimports gauge %v, want 1", got)
	}
	if got := testutil.ToFloat64(rejectedImports.WithLabelValues("invalid_ip")) - rejectedBefore; got != 1 {
		t.Errorf("rejected_serviceimports_total{reason=invalid_ip} rose by %v, want 1", got)
	}
	stopServer(i) // flushes the snapshot

	withClient(t, deadAPI)
	withDynamic(t, deadDynamic)
	i, udp, tcp := serveSnapshot(t, path)
	r := exchange(t, "udp", udp, be, dns.TypeA, 0)
	if got := addrsOf(r); !slices.Equal(got, []string{"10.96.0.10"}) {
		t.Fatalf("first answer after an offline restart: %v", r)
	}
	r = exchange(t, "tcp", tcp, "_http._tcp."+be, dns.TypeSRV, 0)
	if len(r.Answer) != 1 || r.Answer[0].(*dns.SRV).Port != 80 || r.Answer[0].(*dns.SRV).Target != be || len(r.Extra) != 1 {
		t.Fatalf("SRV after an offline restart: %v", r)
	}
	// Offline for a while (discovery fails): kept.
	time.Sleep(300 * time.Millisecond)
	if got := addrsOf(exchange(t, "udp", udp, be, dns.TypeA, 0)); !slices.Equal(got, []string{"10.96.0.10"}) {
		t.Fatalf("while offline: %v", got)
	}
	stopServer(i)

	// Back online with the ServiceImport gone: headless again.
	liveAPIWithImports(t, pods)
	i, udp, _ = serveSnapshot(t, path)
	defer stopServer(i)
	waitAnswer(t, udp, be, []string{"10.0.0.1"})
	if got := testutil.ToFloat64(serviceImports); got != 0 {
		t.Errorf("serviceimports gauge %v, want 0", got)
	}
}

// A snapshot written before ClusterSetIP services existed (no bucket for
// them) loads as it did; a snapshot with the new bucket opens as before with
// the store's reader (no schema change: a build without the bucket's
// support opens it, and drops the bucket as a source it does not know).
func TestSnapshotClusterSetIPCompatibility(t *testing.T) {
	const be = "backend.default.svc.clusterset.local."
	path := filepath.Join(t.TempDir(), "table.db")
	st, _, err := snapshot.Open(path, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tb := table.New(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a"})
	addPod(tb, "edge-a", "b1", "", true, []string{"10.0.0.1"}, annotation.Export{Name: "backend"})
	rec, err := table.EncodePod(tb.Pods("edge-a")[0])
	if err != nil {
		t.Fatal(err)
	}
	st.ReplaceSource("edge-a", map[string][]byte{"default/b1": rec}, snapshot.Meta{ClusterID: "edge-a", LastFullSync: time.Now()})
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// The old layout, read by this build.
	withClient(t, deadAPI)
	withDynamic(t, deadDynamic)
	i, udp, _ := serveSnapshot(t, path)
	if got := addrsOf(exchange(t, "udp", udp, be, dns.TypeA, 0)); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Fatalf("from the old layout: %v", got)
	}
	m := liveInstance(t)
	// Add a ClusterSetIP service: it lands in its own bucket.
	m.importEvents().Changed([]table.ClusterSetIP{csip("default", "backend", []string{"10.96.0.10"})})
	waitAnswer(t, udp, be, []string{"10.96.0.10"})
	stopServer(i)

	// The store reads the new layout as before: the cluster's records are
	// untouched, and the new bucket is one more source.
	st, res, err := snapshot.Open(path, snapshot.Options{})
	if err != nil || res.MovedAside != "" {
		t.Fatalf("open: %v, %+v", err, res)
	}
	all, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(all["edge-a"].Records) != 1 || len(all[importsSource].Records) != 1 {
		t.Fatalf("sources: %v", all)
	}
	// A reader that drops the bucket (as a build before it does) leaves
	// a file this build loads, without ClusterSetIP services.
	st.DropSource(importsSource)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	i, udp, _ = serveSnapshot(t, path)
	defer stopServer(i)
	if got := addrsOf(exchange(t, "udp", udp, be, dns.TypeA, 0)); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Fatalf("after the bucket was dropped: %v", got)
	}
}

// Bad records in the snapshot's ClusterSetIP bucket (garbage, or a record
// filed under another service's key) are dropped from the file and counted
// at start-up; the good one is answered, and nothing else is lost.
func TestSnapshotBadClusterSetIPRecords(t *testing.T) {
	const be = "backend.default.svc.clusterset.local."
	path := filepath.Join(t.TempDir(), "table.db")
	st, _, err := snapshot.Open(path, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	good, err := table.EncodeClusterSetIP(csip("default", "backend", []string{"10.96.0.10"}))
	if err != nil {
		t.Fatal(err)
	}
	other, err := table.EncodeClusterSetIP(csip("default", "other", []string{"10.96.0.11"}))
	if err != nil {
		t.Fatal(err)
	}
	st.ReplaceSource(importsSource, map[string][]byte{
		"default/backend": good,
		"default/garbage": []byte("{not json"),
		"default/moved":   other, // its key names another service
	}, snapshot.Meta{})
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	bad0 := testutil.ToFloat64(snapshotErrors.WithLabelValues("bad_record"))

	withClient(t, deadAPI)
	withDynamic(t, deadDynamic)
	i, udp, _ := serveSnapshot(t, path)
	if got := addrsOf(exchange(t, "udp", udp, be, dns.TypeA, 0)); !slices.Equal(got, []string{"10.96.0.10"}) {
		t.Fatalf("the good record: %v", got)
	}
	if got := exchange(t, "udp", udp, "moved.default.svc.clusterset.local.", dns.TypeA, 0); got.Rcode != dns.RcodeNameError {
		t.Errorf("a record under another key answered: %v", got)
	}
	if n := testutil.ToFloat64(snapshotErrors.WithLabelValues("bad_record")) - bad0; n != 2 {
		t.Errorf("bad_record counted %v times, want 2", n)
	}
	stopServer(i)

	st, _, err = snapshot.Open(path, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	all, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range all[importsSource].Records {
		keys = append(keys, string(k))
	}
	if !slices.Equal(keys, []string{"default/backend"}) {
		t.Errorf("the bucket holds %v after start-up, want the good record only", keys)
	}
}
