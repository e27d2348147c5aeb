// Package watchread makes a client read its watch streams in large chunks.
//
// Over HTTP/2 (client-go's default over TLS), golang.org/x/net/http2 returns
// flow-control credit to the server on every read of a response body that
// frees 4 KB or more: a WINDOW_UPDATE for the connection and one for the
// stream, flushed to the TLS connection with a write of its own. client-go's
// watch decoder reads one event at a time, and a Pod event is a few kilobytes,
// so a relist of 100,000 Pods (about 230 MB) made some 30,000 such writes in
// CoreDNS (the test here measures one per 8 KB read) and as many reads in the
// API server. Reading the body through a large buffer instead takes whatever
// the stream has received so far, up to Size, in one read: one pair of updates
// per read, and no event waits for more data than the stream already holds.
package watchread

import (
	"bufio"
	"io"
	"net/http"
)

// Size is the buffer each watch response is read through.
const Size = 64 << 10

// Wrap returns rt with the body of every successful watch response read
// through a Size buffer. Other requests and responses are left as they are:
// client-go reads those whole, with large reads already.
func Wrap(rt http.RoundTripper) http.RoundTripper { return roundTripper{rt} }

type roundTripper struct{ rt http.RoundTripper }

func (r roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.rt.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK || resp.Body == nil || !IsWatch(req) {
		return resp, err
	}
	resp.Body = &body{Reader: bufio.NewReaderSize(resp.Body, Size), Closer: resp.Body}
	return resp, nil
}

// body reads through the buffer and closes the original body.
type body struct {
	*bufio.Reader
	io.Closer
}

// IsWatch reports whether req is a watch (GET with watch=true or =1): it has
// no body, so it can also be sent again as it is.
func IsWatch(req *http.Request) bool {
	if req.Method != http.MethodGet || req.Body != nil && req.Body != http.NoBody {
		return false
	}
	switch req.URL.Query().Get("watch") {
	case "true", "1":
		return true
	}
	return false
}
