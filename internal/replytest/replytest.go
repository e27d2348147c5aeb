// Package replytest is for tests of readers of API server replies: a
// transport that tells whether a reader read more of a reply than it should.
package replytest

import (
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
)

// Counting returns a WrapTransport function whose replies fail their reads
// once more than limit bytes were read from one, and set over when they do.
func Counting(limit int64, over *atomic.Bool) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper { return transport{rt: rt, limit: limit, over: over} }
}

type transport struct {
	rt    http.RoundTripper
	limit int64
	over  *atomic.Bool
}

func (c transport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(r)
	if err == nil {
		resp.Body = &body{ReadCloser: resp.Body, limit: c.limit, over: c.over}
	}
	return resp, err
}

type body struct {
	io.ReadCloser
	n, limit int64
	over     *atomic.Bool
}

func (c *body) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if c.n += int64(n); c.n > c.limit {
		c.over.Store(true)
		return n, fmt.Errorf("read %d bytes of the reply, over %d", c.n, c.limit)
	}
	return n, err
}
