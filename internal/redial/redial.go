// Package redial makes a client's watch requests wait for an API server that
// refuses connections, instead of failing at once.
//
// When an API server is unreachable, client-go's reflector retries its watch
// with a backoff of 0.8 s doubling to 30 s, and does not know when the server
// is back: after a 10 s cut that backoff alone took 2 to 5 s of the resync.
// A watch request that goes through Wrap instead keeps asking every Interval
// for as long as the connection is refused (and its context lives), so the
// reflector resumes its watch, from the resource version it had, at most an
// Interval after the server answers again: only the changes made meanwhile
// travel, no relist. Other requests (the contact check, lists) fail at once
// as before, and so do watches that fail any other way (a server that
// answers with an error, a timeout).
package redial

import (
	"net/http"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/mcsannotations/mcsannotations/internal/watchread"
)

// Interval is how often a refused watch request is tried again.
const Interval = 250 * time.Millisecond

// Wrap returns rt with watch requests retried every interval while the
// connection is refused, until their context ends. waiting, if not nil, is
// called with true when a request starts to wait and with false when it
// stops.
func Wrap(rt http.RoundTripper, interval time.Duration, waiting func(bool)) http.RoundTripper {
	return &roundTripper{rt: rt, interval: interval, waiting: waiting}
}

type roundTripper struct {
	rt       http.RoundTripper
	interval time.Duration
	waiting  func(bool)
}

func (r *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.rt.RoundTrip(req)
	if err == nil || !watchread.IsWatch(req) || !utilnet.IsConnectionRefused(err) {
		return resp, err
	}
	if r.waiting != nil {
		r.waiting(true)
		defer r.waiting(false)
	}
	t := time.NewTimer(r.interval)
	defer t.Stop()
	for {
		select {
		case <-req.Context().Done():
			return nil, err // the last refusal: the caller knows why it stopped
		case <-t.C:
		}
		resp, err = r.rt.RoundTrip(req)
		if err == nil || !utilnet.IsConnectionRefused(err) {
			return resp, err
		}
		t.Reset(r.interval)
	}
}
