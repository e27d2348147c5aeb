package mcsannotations

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	protoser "k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// An API server whose lists of Pods break off (here 10 bytes short, inside
// the list) costs nothing that was held: the records from the snapshot keep
// answering, and each informer's malformed list is logged and counted in
// malformed_lists_total.
func TestMalformedListKeepsRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table.db")
	seedSnapshot(t, path, []string{"10.0.0.1", "10.0.0.2"}, exporter("a", "10.0.0.1", backendAnno), exporter("b", "10.0.0.2", backendAnno))

	var buf bytes.Buffer
	enc := scheme.Codecs.EncoderForVersion(protoser.NewSerializer(scheme.Scheme, scheme.Scheme), v1.SchemeGroupVersion)
	list := &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "5"}, Items: []v1.Pod{*exporter("c", "10.0.0.3", backendAnno)}}
	if err := enc.Encode(list, &buf); err != nil {
		t.Fatal(err)
	}
	cut := buf.Bytes()[:buf.Len()-10]
	var lists atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/readyz":
			w.Write([]byte("ok"))
		case r.URL.Path == "/api/v1/pods" && r.URL.Query().Get("watch") == "":
			lists.Add(1)
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
			w.Write(cut)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	withClient(t, func(string, string) (kubernetes.Interface, error) {
		return podproto.NewClient(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: runtime.ContentTypeProtobuf}}, podproto.Plugin)
	})
	source0 := testutil.ToFloat64(malformedLists.WithLabelValues("cluster/edge-a"))
	clients0 := testutil.ToFloat64(malformedLists.WithLabelValues("clients"))
	i, udp, _ := serveSnapshot(t, path)
	defer stopServer(i)
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(malformedLists.WithLabelValues("cluster/edge-a")) == source0 ||
		testutil.ToFloat64(malformedLists.WithLabelValues("clients")) == clients0 {
		if time.Now().After(deadline) {
			t.Fatalf("after %d lists, malformed lists counted: cluster/edge-a %v, clients %v", lists.Load(),
				testutil.ToFloat64(malformedLists.WithLabelValues("cluster/edge-a"))-source0,
				testutil.ToFloat64(malformedLists.WithLabelValues("clients"))-clients0)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := addrsOf(exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 0)); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Errorf("after a malformed list: %v, want the snapshot's records", got)
	}
}
