package mcsannotations

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// An API server whose lists of Pods break off (here 10 bytes short, inside
// the list) costs nothing that was held: the records from the snapshot keep
// answering, and each reflector's malformed list is logged and counted in
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

// A hostile peer's list of Pods in JSON, far larger than any real one, is
// read only up to ingest.MaxReply (1 MiB here, 64 MiB by default), through
// the real client (clientFor): the reply is refused, logged and counted in
// oversized_replies_total, and the snapshot's records keep answering.
func TestOversizedListRefused(t *testing.T) {
	real := clientFor // seedSnapshot replaces it
	path := filepath.Join(t.TempDir(), "table.db")
	seedSnapshot(t, path, []string{"10.0.0.1"}, exporter("a", "10.0.0.1", backendAnno))
	old := ingest.MaxReply
	ingest.MaxReply = 1 << 20
	t.Cleanup(func() { ingest.MaxReply = old })
	const offered = 64 << 20
	var mu sync.Mutex
	var most int64 // the most bytes one list got through
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/readyz":
			w.Write([]byte("ok"))
		case r.URL.Path == "/api/v1/pods" && r.URL.Query().Get("watch") == "":
			w.Header().Set("Content-Type", "application/json")
			n, _ := io.Copy(w, io.MultiReader(strings.NewReader(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"`),
				io.LimitReader(zeros{}, offered)))
			mu.Lock()
			most = max(most, n)
			mu.Unlock()
		case r.URL.Path == "/api/v1/pods":
			<-r.Context().Done()
		default:
			http.NotFound(w, r)
		}
	}))
	defer func() { srv.CloseClientConnections(); srv.Close() }()
	kubeconfig := writeKubeconfig(t, srv.URL)
	withClient(t, func(string, string) (kubernetes.Interface, error) { return real(kubeconfig, "") })
	logs := captureLog(t)
	oversized0 := testutil.ToFloat64(oversizedReplies)
	i, udp, _ := serveSnapshot(t, path)
	defer stopServer(i)
	// The source's list and the clients watcher's list are refused.
	for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(oversizedReplies)-oversized0 < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("oversized replies counted: %v, want 2 or more", testutil.ToFloat64(oversizedReplies)-oversized0)
		}
	}
	if want := "refused a reply over its size bound"; !strings.Contains(logs(), want) {
		t.Errorf("no log line %q", want)
	}
	if got := addrsOf(exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 0)); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Errorf("after an oversized list: %v, want the snapshot's records", got)
	}
	stopServer(i)
	srv.CloseClientConnections()
	mu.Lock()
	defer mu.Unlock()
	// What the kernel's socket buffers take besides the bound.
	if most > ingest.MaxReply+8<<20 {
		t.Errorf("a list got %d bytes through, over the bound of %d", most, ingest.MaxReply)
	}
}

// zeros reads as an endless run of '0'.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = '0'
	}
	return len(p), nil
}
