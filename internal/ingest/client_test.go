package ingest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
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

// A streamed list of Pods (how the sources list) whose one Pod, or whose
// metadata, is over its bound is refused while it is decoded, in protobuf and
// in JSON, and the Reader's TooLarge hears of it as of a reply cut by the
// transport: the bound met while decoding is counted and logged the same way.
func TestReaderReportsStreamedBounds(t *testing.T) {
	// The JSON decoder's bound holds at most the bound and one read more,
	// and a read can be as large as what is held: three times the bound is
	// over it whatever the reads.
	big := strings.Repeat("a", 3*podproto.MaxField)
	protoList := func() []byte {
		// runtime.Unknown{TypeMeta v1/PodList, Raw: PodList{Items: [a Pod of
		// 3 MaxField bytes]}}; the Pod's bytes are never looked at.
		var pod []byte
		pod = protowire.AppendTag(pod, 2, protowire.BytesType)
		pod = protowire.AppendVarint(pod, uint64(len(big)))
		pod = append(pod, big...)
		var tm []byte
		tm = protowire.AppendTag(tm, 1, protowire.BytesType)
		tm = protowire.AppendString(tm, "v1")
		tm = protowire.AppendTag(tm, 2, protowire.BytesType)
		tm = protowire.AppendString(tm, "PodList")
		b := []byte("k8s\x00")
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, tm)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		return protowire.AppendBytes(b, pod)
	}
	for _, tc := range []struct {
		name, contentType string
		body              func() []byte
	}{
		{"protobuf pod", Protobuf, protoList},
		{"json pod", "application/json", func() []byte {
			return []byte(`{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"name":"` + big + `"}}]}`)
		}},
		{"json metadata", "application/json", func() []byte {
			return []byte(`{"kind":"PodList","apiVersion":"v1","metadata":{"continue":"` + big[:16*podproto.MaxListMeta] + `"},"items":[]}`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := tc.body()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				_, _ = w.Write(body)
			}))
			defer srv.Close()
			var tooLarge atomic.Int32
			r := Reader{UserAgent: "test", TooLarge: func(error) { tooLarge.Add(1) }}
			c, err := r.Pods(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			s, ok := c.(Streamer)
			if !ok {
				t.Fatalf("Reader.Pods gave a %T, which does not stream lists", c)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err = s.ListPodsIn(ctx, "", metav1.ListOptions{}, func(*v1.Pod) error { return nil })
			if !errors.Is(err, podproto.ErrTooLarge) || !errors.Is(err, ErrTooLarge) {
				t.Fatalf("got %v, want an error wrapping ErrTooLarge (podproto's and ingest's)", err)
			}
			if n := tooLarge.Load(); n != 1 {
				t.Errorf("TooLarge heard of %d refusals, want 1", n)
			}
			// Listed as a source lists, the refusal is reported once: by
			// TooLarge, not again as a malformed list.
			var malformed atomic.Int32
			lw := Pods(c, "", toSlim).observed(Events{Malformed: func(error) { malformed.Add(1) }})
			if _, err := lw.ListWithContext(ctx, metav1.ListOptions{}); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("the ListerWatcher's list: %v, want ErrTooLarge", err)
			}
			if n, m := tooLarge.Load(), malformed.Load(); n != 2 || m != 0 {
				t.Errorf("the ListerWatcher's list reported to TooLarge %d times and to Malformed %d times, want once in all (TooLarge)", n-1, m)
			}
		})
	}
}
