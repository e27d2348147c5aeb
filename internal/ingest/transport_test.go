package ingest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// What the transport lets through of each kind of reply: a reply read whole
// up to MaxReply; a JSON watch up to MaxEvent bytes per event (line), however
// long in all; a protobuf list of ListPods (podproto bounds each Pod), a JSON
// list of ListEach (it bounds each item) and a protobuf watch (client-go
// bounds each frame) unbounded in all. Each cut is
// reported once.
func TestTransportBounds(t *testing.T) {
	oldReply, oldEvent := MaxReply, MaxEvent
	MaxReply, MaxEvent = 1000, 100
	t.Cleanup(func() { MaxReply, MaxEvent = oldReply, oldEvent })
	const protobuf = "application/vnd.kubernetes.protobuf"
	cases := []struct {
		name, contentType, query string
		streamed                 bool // a ListPods list (podproto's mark)
		each                     bool // a ListEach list
		body                     string
		cut                      bool
	}{
		{"reply over MaxReply", "application/json", "", false, false, strings.Repeat("x", 1001), true},
		{"reply at MaxReply", "application/json", "", false, false, strings.Repeat("x", 1000), false},
		{"streamed list in JSON", "application/json", "", true, false, strings.Repeat("x", 1001), true},
		{"streamed list in protobuf", protobuf, "", true, false, strings.Repeat("x", 5000), false},
		{"protobuf list not streamed", protobuf, "", false, false, strings.Repeat("x", 1001), true},
		{"ListEach's list in JSON", "application/json", "", false, true, strings.Repeat("x", 5000), false},
		{"ListEach's list in protobuf", protobuf, "", false, true, strings.Repeat("x", 1001), true},
		{"JSON watch, short events", "application/json", "?watch=true", false, false, strings.Repeat(strings.Repeat("x", 99)+"\n", 100), false},
		{"JSON watch, one long event", "application/json", "?watch=1", false, false, strings.Repeat("x", 50) + "\n" + strings.Repeat("x", 101), true},
		{"protobuf watch", protobuf + ";stream=watch", "?watch=true", false, false, strings.Repeat("x", 5000), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			var cuts []error
			client := &http.Client{Transport: Transport(http.DefaultTransport, func(err error) { cuts = append(cuts, err) })}
			ctx := context.Background()
			if tc.streamed {
				ctx = podproto.WithStreamed(ctx)
			}
			if tc.each {
				ctx = withStreamed(ctx)
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/v1/pods"+tc.query, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			// One sentinel for every bound: a cut reply is podproto's too.
			if tc.cut != errors.Is(err, ErrTooLarge) || tc.cut != errors.Is(err, podproto.ErrTooLarge) || tc.cut != (len(cuts) == 1) {
				t.Fatalf("read %d bytes, error %v, reported %v; want cut %v", len(got), err, cuts, tc.cut)
			}
			if !tc.cut && string(got) != tc.body {
				t.Errorf("read %d bytes, want the %d sent", len(got), len(tc.body))
			}
			if _, err := resp.Body.Read(make([]byte, 1)); tc.cut && !errors.Is(err, ErrTooLarge) {
				t.Errorf("a read after the cut: %v", err)
			}
		})
	}
}
