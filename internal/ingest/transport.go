package ingest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// Bounds on what a reply from an API server (a peer's is anyone's) may make
// the plugin read. Variables for tests.
var (
	// MaxReply bounds the body of every reply read whole: lists other than
	// ListPods' in protobuf and ListEach's, the contact check, discovery, a
	// list of Pods that came in JSON.
	MaxReply int64 = 64 << 20
	// MaxEvent bounds each event of a JSON watch (a line) and each item of
	// a list ListEach reads. client-go bounds the frames of a protobuf watch
	// itself (16 MiB), and podproto each Pod of a streamed protobuf list
	// (podproto.MaxField).
	MaxEvent int64 = podproto.MaxField
)

// ErrTooLarge is wrapped by the error of whatever an API server sent over
// a bound: a reply cut by Transport, a streamed list's object or metadata
// (it is podproto.ErrTooLarge, so errors.Is holds for either name), a list
// of more than MaxObjects objects, a new object a full Store dropped.
var ErrTooLarge = podproto.ErrTooLarge

// watchBuffer is what each watch reply is read through. Over HTTP/2
// (client-go's default over TLS) every read of a body that frees 4 KB or more
// returns flow-control credit with a write of its own; client-go's watch
// decoder reads one event at a time, a few kilobytes each. Read through a
// large buffer, a read takes whatever the stream holds, up to its size: one
// pair of updates per read.
const watchBuffer = 64 << 10

// Transport returns rt with every reply body bounded (see MaxReply and
// MaxEvent) and watch replies read through a large buffer. tooLarge, if set,
// hears of each reply cut at its bound, with the read error its reader got.
func Transport(rt http.RoundTripper, tooLarge func(error)) http.RoundTripper {
	return &transport{rt: rt, tooLarge: tooLarge}
}

type transport struct {
	rt       http.RoundTripper
	tooLarge func(error)
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err != nil || resp.Body == nil || resp.Body == http.NoBody {
		return resp, err
	}
	protobuf := strings.HasPrefix(resp.Header.Get("Content-Type"), "application/vnd.kubernetes.protobuf")
	b := &bounded{body: resp.Body, r: resp.Body, req: req, tooLarge: t.tooLarge}
	switch {
	case isWatch(req) && resp.StatusCode == http.StatusOK:
		b.r = bufio.NewReaderSize(resp.Body, watchBuffer)
		if protobuf {
			b.limit = -1
		} else {
			b.limit, b.perLine = MaxEvent, true
		}
	case podproto.Streamed(req.Context()) && protobuf, streamed(req.Context()) && !protobuf:
		b.limit = -1 // read one item at a time, each bounded
	default:
		b.limit = MaxReply
	}
	resp.Body = b
	return resp, nil
}

// bounded reads a body and fails once more than limit bytes came (since the
// last newline, with perLine); a negative limit bounds nothing.
type bounded struct {
	body     io.Closer
	r        io.Reader
	req      *http.Request
	tooLarge func(error)
	limit    int64
	perLine  bool
	n        int64 // read (since the last newline)
	err      error
}

func (b *bounded) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.r.Read(p)
	if b.limit < 0 {
		return n, err
	}
	if i := bytes.LastIndexByte(p[:n], '\n'); b.perLine && i >= 0 {
		b.n = int64(n - i - 1)
	} else {
		b.n += int64(n)
	}
	if b.n > b.limit {
		what := "reply"
		if b.perLine {
			what = "watch event"
		}
		b.err = fmt.Errorf("reply %w: %s %s%s: a %s over %d bytes", ErrTooLarge, b.req.Method, b.req.URL.Host, b.req.URL.Path, what, b.limit)
		if b.tooLarge != nil {
			b.tooLarge(b.err)
		}
		return 0, b.err
	}
	return n, err
}

func (b *bounded) Close() error { return b.body.Close() }

// isWatch reports whether req is a watch (GET with watch=true or =1).
func isWatch(req *http.Request) bool {
	if req.Method != http.MethodGet {
		return false
	}
	switch req.URL.Query().Get("watch") {
	case "true", "1":
		return true
	}
	return false
}
