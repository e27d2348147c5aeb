package mcsannotations

import (
	"os"
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

// A snapshot written by the build before the typed buckets (schema 1, with
// the clients and the ClusterSetIP services as sources "~clients" and
// "~serviceimports"; testdata/schema1.db was written by commit ae347de's
// code, see testdata/genv1.go.txt) is migrated in place and served offline
// as it was: the cluster's Pods and the ClusterSetIP service.
func TestSnapshotSchema1Served(t *testing.T) {
	b, err := os.ReadFile("../../internal/snapshot/testdata/schema1.db")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "table.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	withClient(t, deadAPI)
	withDynamic(t, deadDynamic)
	i, udp, _ := serveSnapshot(t, path)
	defer stopServer(i)
	if got := addrsOf(exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 0)); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Errorf("backend from a schema 1 snapshot: %v", got)
	}
	if got := addrsOf(exchange(t, "udp", udp, "cart.default.svc.clusterset.local.", dns.TypeA, 0)); !slices.Equal(got, []string{"10.96.0.10"}) {
		t.Errorf("ClusterSetIP service from a schema 1 snapshot: %v", got)
	}
	if n := liveInstance(t).clients.Len(); n != 1 {
		t.Errorf("%d DNS clients from a schema 1 snapshot, want 1", n)
	}
	if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 0 {
		t.Errorf("a schema 1 file was moved aside: %v", aside)
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
	st.ReplaceClusterSetIPs([]table.ClusterSetIP{csip("default", "backend", []string{"10.96.0.10"})})
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	other, err := snapshot.EncodeClusterSetIP(csip("default", "other", []string{"10.96.0.11"}))
	if err != nil {
		t.Fatal(err)
	}
	rawPut(t, path, "clustersetips", "default/garbage", []byte("{not json"))
	rawPut(t, path, "clustersetips", "default/moved", other) // its key names another service
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
	list, bad, err := st.LoadClusterSetIPs()
	if err != nil || bad != 0 || len(list) != 1 || list[0].Name != "backend" {
		t.Errorf("the bucket holds %v and %d bad records after start-up, want the good record only (%v)", list, bad, err)
	}
	if n := rawLen(t, st, "clustersetips"); n != 1 {
		t.Errorf("%d records in the bucket, want 1", n)
	}
}
