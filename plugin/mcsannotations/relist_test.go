package mcsannotations

import (
	"bytes"
	"io"
	golog "log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	protoser "k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// When an API server answers a watch with 410 (its watch cache begins after
// the version the plugin had: it restarted), each reflector logs and counts
// the expiry, lists every Pod again, and logs and observes the time until
// that list arrived; the Pod that only the second list has then answers.
func TestWatchExpiryRelists(t *testing.T) {
	logs := captureLog(t)
	enc := scheme.Codecs.EncoderForVersion(protoser.NewSerializer(scheme.Scheme, scheme.Scheme), v1.SchemeGroupVersion)
	var lists atomic.Int64
	var mu sync.Mutex
	listsBy := map[string]int{} // by label selector: by informer
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case r.URL.Path == "/readyz":
			w.Write([]byte("ok"))
		case r.URL.Path != "/api/v1/pods":
			http.NotFound(w, r)
		case q.Get("watch") == "":
			lists.Add(1)
			mu.Lock()
			listsBy[q.Get("labelSelector")]++
			n := listsBy[q.Get("labelSelector")]
			mu.Unlock()
			list := &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "5"}, Items: []v1.Pod{*exporter("a", "10.0.0.1", backendAnno)}}
			if n > 1 { // after the reflector's first
				list = &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "7"}, Items: []v1.Pod{*exporter("a", "10.0.0.1", backendAnno), *exporter("b", "10.0.0.2", backendAnno)}}
			}
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
			if err := enc.Encode(list, w); err != nil {
				t.Error(err)
			}
		case q.Get("resourceVersion") == "5":
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
			w.WriteHeader(http.StatusGone)
			_ = enc.Encode(&metav1.Status{Status: metav1.StatusFailure, Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version: 5 (6)"}, w)
		default: // a watch from the new list's version: nothing changes
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf+";stream=watch")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	}))
	defer func() { srv.CloseClientConnections(); srv.Close() }()
	withClient(t, func(string, string) (kubernetes.Interface, error) {
		return podproto.NewClient(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: runtime.ContentTypeProtobuf}}, podproto.Plugin)
	})
	informers := []string{"cluster/edge-a", "clients"}
	expired0, relisted0 := map[string]float64{}, map[string]uint64{}
	for _, inf := range informers {
		expired0[inf] = testutil.ToFloat64(watchExpirations.WithLabelValues(inf))
		relisted0[inf] = relists(t, inf)
	}
	i, udp, _ := serveSnapshot(t, filepath.Join(t.TempDir(), "table.db"))
	defer stopServer(i)

	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1", "10.0.0.2"})
	deadline := time.Now().Add(10 * time.Second)
	for _, inf := range informers {
		wants := []string{
			inf + ": the watch of Pods expired (the API server restarted, or the watch fell behind): listing every Pod again",
			inf + ": listed 2 Pods again in ",
		}
		// The relist is observed before it is logged: wait for both.
		for (relists(t, inf) == relisted0[inf] || !containsAll(logs(), wants)) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := testutil.ToFloat64(watchExpirations.WithLabelValues(inf)) - expired0[inf]; got != 1 {
			t.Errorf("%s: %v expirations counted, want 1", inf, got)
		}
		if got := relists(t, inf) - relisted0[inf]; got != 1 {
			t.Errorf("%s: %d relists observed, want 1 (after %d lists)", inf, got, lists.Load())
		}
		for _, want := range wants {
			if !strings.Contains(logs(), want) {
				t.Errorf("no log line %q in:\n%s", want, logs())
			}
		}
	}
}

// containsAll reports whether s contains each of subs.
func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// relists is the number of relists that relist_seconds observed for informer.
func relists(t *testing.T, informer string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := relistSeconds.WithLabelValues(informer).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// captureLog copies CoreDNS's log (the standard library's) into a buffer
// until the test ends, and returns a function that reads it.
func captureLog(t *testing.T) func() string {
	b := &lockedBuffer{}
	golog.SetOutput(io.MultiWriter(os.Stderr, b))
	t.Cleanup(func() { golog.SetOutput(os.Stderr) })
	return b.String
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
