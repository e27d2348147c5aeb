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
		t.Run(name, func(t *testing.T) { stopAfter429s(t, newClient, 500*time.Millisecond) })
	}
}

// stopAfter429s starts CoreDNS with clients from newClient against an API
// server that answers 429 to everything, stops it once both reflectors have
// made a request (they then retry after their backoff), and requires no slow
// stop of either, each waited for at most wait.
func stopAfter429s(t *testing.T, newClient func(host string) (kubernetes.Interface, error), wait time.Duration) {
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

	source0 := testutil.ToFloat64(slowStops.WithLabelValues("cluster/edge-a"))
	clients0 := testutil.ToFloat64(slowStops.WithLabelValues("clients"))
	i, _, _, err := coretest.CoreDNSServerAndPorts(snapshotCorefile(path))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); exporters.Load() == 0 || importers.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			stopServer(i)
			t.Fatal("the reflectors made no request")
		}
	}
	time.Sleep(100 * time.Millisecond) // let the 429s arrive
	start := time.Now()
	stopServer(i)
	took := time.Since(start)
	source := testutil.ToFloat64(slowStops.WithLabelValues("cluster/edge-a")) - source0
	clients := testutil.ToFloat64(slowStops.WithLabelValues("clients")) - clients0
	if source != 0 || clients != 0 {
		t.Fatalf("slow stops counted: cluster/edge-a %v, clients %v (want none); the stop took %s", source, clients, took)
	}
	t.Logf("stopped in %s", took.Round(time.Millisecond))
}
