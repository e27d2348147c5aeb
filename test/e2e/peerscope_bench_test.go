package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// countingTransport counts the requests that list and that watch.
type countingTransport struct {
	rt             http.RoundTripper
	lists, watches *atomic.Int64
}

func (c countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodGet && req.URL.Query().Get("watch") == "true" {
		c.watches.Add(1)
	} else if req.Method == http.MethodGet && req.URL.Path != "/readyz" {
		c.lists.Add(1)
	}
	return c.rt.RoundTrip(req)
}

// BenchmarkPeerScopeStart measures what reading a peer costs at start, until
// the source has synced, against a real kube-apiserver holding 50 exporting
// namespaces of 2 exporter Pods each: one cluster-wide watch (the credential
// reads every Pod) against one watch per namespace (the scoped credential),
// through the plugin's client (protobuf, podproto) with client-go's default
// rate limit (QPS 5, burst 10) and with the plugin's (QPS 50, burst 200).
// It reports the lists and watches each start made.
func BenchmarkPeerScopeStart(b *testing.B) {
	harness.RequireTools(b, harness.ToolEtcd, harness.ToolAPIServer)
	c := harness.StartCluster(b, peerID)
	const namespaces, podsEach = 50, 2
	var names []string
	for i := range namespaces {
		ns := c.NewNamespace(b)
		names = append(names, ns)
		var pods []harness.ReadyPod
		for j := range podsEach {
			pods = append(pods, exporter(fmt.Sprintf("web-%d", j), "", ips(fmt.Sprintf("10.2.%d.%d", i, j+1)), backend))
		}
		c.CreateReadyPods(b, ns, pods...)
	}
	cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	harness.Eventually(b, 20*time.Second, func() error {
		_, err := c.Client.CoreV1().ConfigMaps(source.ExportingNamespacesNamespace).Create(cx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: source.ExportingNamespacesName, Namespace: source.ExportingNamespacesNamespace},
			Data:       map[string]string{source.ExportingNamespacesKey: source.FormatNamespaces(names)},
		}, metav1.CreateOptions{})
		return err
	})
	base, err := harness.RESTConfig(c.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name   string
		scoped bool
		qps    float32
		burst  int
	}{
		{"ClusterWide", false, 5, 10},
		{"PerNamespace", true, 5, 10},
		{"PerNamespacePluginLimit", true, 50, 200}, // the plugin's clientFor
	} {
		b.Run(bc.name, func(b *testing.B) {
			var lists, watches atomic.Int64
			for b.Loop() {
				rc := rest.CopyConfig(base)
				rc.QPS, rc.Burst = bc.qps, bc.burst
				rc.ContentType = "application/vnd.kubernetes.protobuf"
				rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
					return countingTransport{rt: rt, lists: &lists, watches: &watches}
				})
				client, err := podproto.NewClient(rc, podproto.Plugin)
				if err != nil {
					b.Fatal(err)
				}
				records := store.New()
				s := source.New(peerID, client, records, source.Events{}, source.Options{Scoped: bc.scoped})
				if err := s.Start(); err != nil {
					b.Fatal(err)
				}
				deadline := time.Now().Add(2 * time.Minute)
				for !s.HasSynced() {
					if time.Now().After(deadline) {
						b.Fatal("not synced within 2 minutes")
					}
					time.Sleep(time.Millisecond)
				}
				if n := records.Len()[peerID]; n != namespaces*podsEach {
					b.Fatalf("%d records, want %d", n, namespaces*podsEach)
				}
				_ = s.Stop()
			}
			b.ReportMetric(float64(lists.Load())/float64(b.N), "lists/op")
			b.ReportMetric(float64(watches.Load())/float64(b.N), "watches/op")
		})
	}
}
