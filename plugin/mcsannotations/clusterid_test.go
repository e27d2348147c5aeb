package mcsannotations

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/caddy"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/internal/ingest"
)

// propertyServer answers the ClusterProperty with the value in *value; every
// other path is 404 (the informers just retry).
func propertyServer(t *testing.T, value *atomic.Value) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != clusterPropertyPath {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"apiVersion":"about.k8s.io/v1alpha1","kind":"ClusterProperty","metadata":{"name":"cluster.clusterset.k8s.io"},"spec":{"value":"` + value.Load().(string) + `"}}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func parsed(t *testing.T, corefile string) config {
	t.Helper()
	cfg, err := parse(caddy.NewTestController("dns", corefile))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// withClusterProperty makes the plugin's clients read the ClusterProperty
// from a server that answers id, and returns the value it answers (to change).
func withClusterProperty(t *testing.T, id string) *atomic.Value {
	t.Helper()
	var value atomic.Value
	value.Store(id)
	url := propertyServer(t, &value)
	withClient(t, func(string, string) (kubernetes.Interface, error) {
		return kubernetes.NewForConfig(&rest.Config{Host: url})
	})
	return &value
}

func TestClusterIDDiscovery(t *testing.T) {
	oldTimeout := discoverTimeout
	discoverTimeout = 500 * time.Millisecond
	t.Cleanup(func() { discoverTimeout = oldTimeout })

	var value atomic.Value
	value.Store("edge-z")
	url := propertyServer(t, &value)
	withClient(t, func(string, string) (kubernetes.Interface, error) {
		return kubernetes.NewForConfig(&rest.Config{Host: url})
	})
	snap := filepath.Join(t.TempDir(), "table.db")
	corefile := "mcsannotations {\n snapshot " + snap + "\n peer edge-b /b\n}"

	// From the API; remembered beside the snapshot.
	m, err := newMCS(parsed(t, corefile))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.sources[0].Cluster(); got != "edge-z" || m.checkID != nil {
		t.Fatalf("cluster %q (check %v), want edge-z from the API", got, m.checkID != nil)
	}
	if b, err := os.ReadFile(snap + clusterIDSuffix); err != nil || strings.TrimSpace(string(b)) != "edge-z" {
		t.Fatalf("remembered: %q, %v", b, err)
	}

	// Offline: the remembered ID, at once, and a background check.
	withClient(t, deadAPI)
	start := time.Now()
	m, err = newMCS(parsed(t, corefile))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.sources[0].Cluster(); got != "edge-z" || m.checkID == nil {
		t.Fatalf("offline: cluster %q (check %v), want the remembered edge-z", got, m.checkID != nil)
	}
	if took := time.Since(start); took >= discoverTimeout {
		t.Errorf("the remembered ID must not wait for the API (took %v)", took)
	}

	// Nothing configured, nothing remembered, no API: a clear error.
	_, err = newMCS(parsed(t, "mcsannotations {\n}"))
	if err == nil || !strings.Contains(err.Error(), "the cluster ID is not configured (cluster NAME), not remembered beside a snapshot") {
		t.Fatalf("error %v", err)
	}
	// A peer with the discovered name.
	withClient(t, func(string, string) (kubernetes.Interface, error) {
		return kubernetes.NewForConfig(&rest.Config{Host: url})
	})
	_, err = newMCS(parsed(t, "mcsannotations {\n peer edge-z /z\n}"))
	if err == nil || !strings.Contains(err.Error(), `peer "edge-z" has the name of the local cluster`) {
		t.Fatalf("error %v", err)
	}
	// An invalid ClusterProperty value is refused.
	value.Store("Not_Valid")
	_, err = newMCS(parsed(t, "mcsannotations {\n}"))
	if err == nil || !strings.Contains(err.Error(), `ClusterProperty value "Not_Valid"`) {
		t.Fatalf("error %v", err)
	}
}

// A remembered ID that the API contradicts is replaced for the next start.
func TestCheckClusterIDRemembersChange(t *testing.T) {
	var value atomic.Value
	value.Store("edge-new")
	url := propertyServer(t, &value)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: url})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "table.db"+clusterIDSuffix)
	if err := writeClusterID(file, "edge-old"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	checkClusterID(ctx, client, "edge-old", file)
	if id, err := readClusterID(file); err != nil || id != "edge-new" {
		t.Fatalf("remembered %q, %v; want edge-new", id, err)
	}
}

func TestClusterIDGarbageRemembered(t *testing.T) {
	withClusterProperty(t, "edge-z")
	snap := filepath.Join(t.TempDir(), "table.db")
	if err := os.WriteFile(snap+clusterIDSuffix, []byte("!!! not an id\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := newMCS(parsed(t, "mcsannotations {\n snapshot "+snap+"\n}"))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.sources[0].Cluster(); got != "edge-z" {
		t.Fatalf("cluster %q, want edge-z from the API", got)
	}
	if id, err := readClusterID(snap + clusterIDSuffix); err != nil || id != "edge-z" {
		t.Fatalf("garbage not replaced: %q, %v", id, err)
	}
}

// The real clients ask for Pods in protobuf (cheaper to decode than JSON) and
// for the ClusterProperty, a custom resource with no protobuf form, in JSON.
func TestClientContentTypes(t *testing.T) {
	var podsAccept, propertyAccept atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case clusterPropertyPath:
			propertyAccept.Store(r.Header.Get("Accept"))
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"apiVersion":"about.k8s.io/v1alpha1","kind":"ClusterProperty","spec":{"value":"edge-p"}}`))
		case "/api/v1/pods":
			podsAccept.Store(r.Header.Get("Accept"))
			http.NotFound(w, r)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	client, err := clientFor(writeKubeconfig(t, srv.URL), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if id, err := discoverClusterID(ctx, client); err != nil || id != "edge-p" {
		t.Fatalf("discover: %q, %v", id, err)
	}
	client.CoreV1().Pods("").List(ctx, metav1.ListOptions{}) // 404: only the request matters
	if got, _ := propertyAccept.Load().(string); got != "application/json" {
		t.Errorf("ClusterProperty Accept %q, want application/json", got)
	}
	if got, _ := podsAccept.Load().(string); !strings.HasPrefix(got, ingest.Protobuf+",") || !strings.Contains(got, "application/json") {
		t.Errorf("Pods Accept %q, want protobuf first, JSON as fallback", got)
	}
}

// writeKubeconfig writes a kubeconfig for server and returns its path.
func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The ServiceImports' client lists one item at a time (ingest.Dynamic), so
// that a relist of many ServiceImports never holds the whole reply.
func TestServiceImportClientStreams(t *testing.T) {
	d, err := dynamicFor(writeKubeconfig(t, "https://127.0.0.1:1"), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.(*ingest.Dynamic); !ok {
		t.Fatalf("the ServiceImports' client is a %T, want an *ingest.Dynamic", d)
	}
}
