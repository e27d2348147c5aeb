package ingest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// A hostile API server answers a Pod list with an endless JSON reply: every
// reader built by Reader (CoreDNS's sources and the MCS controller's alike)
// refuses it after a bounded read, and hears of it through TooLarge.
func TestReaderBoundsHostileList(t *testing.T) {
	const limit = 512 << 20 // what the server would send at most
	var sent atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		head := `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"`
		n, _ := w.Write([]byte(head))
		sent.Add(int64(n))
		chunk := []byte(strings.Repeat("a", 64<<10))
		for sent.Load() < limit {
			n, err := w.Write(chunk)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	var tooLarge atomic.Int32
	r := Reader{UserAgent: "test", TooLarge: func(error) { tooLarge.Add(1) }}
	c, err := r.Pods(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("an endless list was accepted")
	}
	srv.CloseClientConnections()
	// The server's writes stop once the client stops reading: at most the
	// bound plus what the sockets buffer.
	if got := sent.Load(); got > MaxReply+(32<<20) {
		t.Errorf("the reader let the server send %d bytes, want at most about %d (MaxReply)", got, MaxReply)
	}
	if tooLarge.Load() == 0 {
		t.Error("TooLarge was not told of the refused reply")
	}
}
