package mcsannotations

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coretest "github.com/coredns/coredns/test"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// An API server that answers 429 to everything puts the reflectors into
// their retry backoff, which they sleep out watching their context (client-go's
// watch-list retry, which does not, is off): CoreDNS's shutdown (and a
// reload) ends within stopWait (500 ms here), with no reflector left behind,
// whether the client lists as a stream (podproto) or not.
func TestStopIsPrompt(t *testing.T) {
	clients := map[string]func(host string) (kubernetes.Interface, error){
		"podproto": func(host string) (kubernetes.Interface, error) {
			return podproto.NewClient(&rest.Config{Host: host, ContentConfig: rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf"}}, podproto.Plugin)
		},
		"client-go": func(host string) (kubernetes.Interface, error) {
			return kubernetes.NewForConfig(&rest.Config{Host: host})
		},
	}
	for name, newClient := range clients {
		t.Run(name, func(t *testing.T) { stopAfter429s(t, newClient, 500*time.Millisecond, 0) })
	}
}

// stopAfter429s starts CoreDNS with clients from newClient against an API
// server that answers 429 to everything, stops it while its informers back
// off, and requires slowStops to count want for each informer (within three
// tries when want is 1: a stop while a request is in flight ends at once).
func stopAfter429s(t *testing.T, newClient func(host string) (kubernetes.Interface, error), wait time.Duration, want float64) {
	var exporters, importers atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch sel := r.URL.Query().Get("labelSelector"); {
		case strings.Contains(sel, "exporter"):
			exporters.Add(1)
		case strings.Contains(sel, "importer"):
			importers.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429}`)
	}))
	defer srv.Close()
	withClient(t, func(string, string) (kubernetes.Interface, error) { return newClient(srv.URL) })
	path := filepath.Join(t.TempDir(), "table.db")
	old := stopWait
	stopWait = wait
	t.Cleanup(func() { stopWait = old })

	for try := 1; ; try++ {
		source0 := testutil.ToFloat64(slowStops.WithLabelValues("cluster/edge-a"))
		clients0 := testutil.ToFloat64(slowStops.WithLabelValues("clients"))
		e, i0 := exporters.Load(), importers.Load()
		i, _, _, err := coretest.CoreDNSServerAndPorts(snapshotCorefile(path))
		if err != nil {
			t.Fatal(err)
		}
		// Both informers have made their first request: each now sleeps
		// at least 0.8 s.
		for deadline := time.Now().Add(5 * time.Second); exporters.Load() == e || importers.Load() == i0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				stopServer(i)
				t.Fatal("the informers made no request")
			}
		}
		// Let the 429s arrive: a stop while a request is in flight cancels
		// it and ends at once, a try that tells nothing.
		time.Sleep(100 * time.Millisecond)
		asleep := time.Now()
		stopServer(i)
		took := time.Since(asleep)
		source := testutil.ToFloat64(slowStops.WithLabelValues("cluster/edge-a")) - source0
		clients := testutil.ToFloat64(slowStops.WithLabelValues("clients")) - clients0
		if source == want && clients == want {
			t.Logf("stopped in %s, slow stops: %v each", took.Round(time.Millisecond), want)
			return
		}
		if try == 3 || want == 0 {
			t.Fatalf("try %d: slow stops counted: cluster/edge-a %v, clients %v (want %v each); the stop took %s", try, source, clients, want, took)
		}
	}
}
