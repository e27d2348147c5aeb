package watchread

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"golang.org/x/net/http2"
)

// fakeBody hands out at most chunk bytes a read and records what each read
// asked for.
type fakeBody struct {
	data   []byte
	chunk  int
	asked  []int
	closed bool
}

func (b *fakeBody) Read(p []byte) (int, error) {
	b.asked = append(b.asked, len(p))
	if len(b.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), b.chunk)], b.data)
	b.data = b.data[n:]
	return n, nil
}

func (b *fakeBody) Close() error { b.closed = true; return nil }

type fakeRT struct {
	status int
	body   *fakeBody
}

func (f fakeRT) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: f.status, Body: f.body}, nil
}

func request(t *testing.T, method, url string) *http.Request {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// A watch's body is read through the buffer: however little the consumer
// asks for, the stream is asked for a whole buffer at a time, and the bytes
// come out unchanged; closing closes the original body.
func TestWatchBodyReadInLargeChunks(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320 KB
	fb := &fakeBody{data: bytes.Clone(data), chunk: 30000}
	resp, err := Wrap(fakeRT{http.StatusOK, fb}).RoundTrip(request(t, http.MethodGet, "https://x/api/v1/pods?watch=true"))
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	p := make([]byte, 2300) // about one Pod event
	for {
		n, err := resp.Body.Read(p)
		got = append(got, p[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, not the %d sent", len(got), len(data))
	}
	for i, n := range fb.asked {
		if n < Size {
			t.Fatalf("read %d of the stream asked for %d bytes, want %d (all: %v)", i, n, Size, fb.asked)
		}
	}
	if err := resp.Body.Close(); err != nil || !fb.closed {
		t.Errorf("close: %v, original closed %v", err, fb.closed)
	}
}

// Anything but a successful watch keeps its own body.
func TestOtherResponsesUntouched(t *testing.T) {
	for _, c := range []struct {
		method, url string
		status      int
	}{
		{http.MethodGet, "https://x/api/v1/pods", http.StatusOK},
		{http.MethodGet, "https://x/api/v1/pods?watch=false", http.StatusOK},
		{http.MethodGet, "https://x/api/v1/pods?watch=true", http.StatusGone},
		{http.MethodPost, "https://x/api/v1/pods?watch=true", http.StatusOK},
	} {
		fb := &fakeBody{data: []byte("x"), chunk: 1}
		resp, err := Wrap(fakeRT{c.status, fb}).RoundTrip(request(t, c.method, c.url))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Body != io.ReadCloser(fb) {
			t.Errorf("%s %s (%d): body replaced", c.method, c.url, c.status)
		}
	}
}

// Over a real HTTP/2 connection (golang.org/x/net/http2, as client-go sets
// it up), a consumer reading a streamed response a few kilobytes at a time
// makes the client write flow-control updates every few kilobytes; through
// Wrap it writes far fewer.
func TestFewerFlowControlWritesOverHTTP2(t *testing.T) {
	const total = 8 << 20
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := bytes.Repeat([]byte{'p'}, 16<<10)
		for sent := 0; sent < total; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	writes := func(wrap bool) int64 {
		var n atomic.Int64
		tr := &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs},
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return countingConn{c, &n}, nil
			},
		}
		if _, err := http2.ConfigureTransports(tr); err != nil {
			t.Fatal(err)
		}
		defer tr.CloseIdleConnections()
		var rt http.RoundTripper = tr
		if wrap {
			rt = Wrap(tr)
		}
		resp, err := rt.RoundTrip(request(t, http.MethodGet, srv.URL+"/api/v1/pods?watch=true"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("protocol %s, want HTTP/2", resp.Proto)
		}
		before := n.Load() // the request itself
		got, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{resp.Body}, make([]byte, 2300))
		if err != nil || got != total {
			t.Fatalf("read %d bytes (%v), want %d", got, err, total)
		}
		return n.Load() - before
	}
	plain, wrapped := writes(false), writes(true)
	t.Logf("writes to the server while reading %d MB: %d plain, %d through Wrap", total>>20, plain, wrapped)
	if plain < total/(8<<10) {
		t.Errorf("only %d writes without Wrap: the test no longer shows the updates every 4 KB", plain)
	}
	if wrapped*3 > plain {
		t.Errorf("%d writes through Wrap, against %d without: want at most a third", wrapped, plain)
	}
}

// countingConn counts the writes to the connection.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}
