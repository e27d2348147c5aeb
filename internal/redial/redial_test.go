package redial

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// freeAddr returns a loopback address nothing listens on (for now).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func serve(t *testing.T, addr string, status int) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

type waits struct {
	mu  sync.Mutex
	log []bool
}

func (w *waits) record(b bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, b)
}

func (w *waits) get() []bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]bool(nil), w.log...)
}

func client(w *waits) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	return &http.Client{Transport: Wrap(tr, 10*time.Millisecond, w.record)}
}

func get(ctx context.Context, c *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return c.Do(req)
}

// A watch to a refused address waits, and gets through once something
// listens there.
func TestWatchWaitsForTheServer(t *testing.T) {
	addr := freeAddr(t)
	var w waits
	c := client(&w)
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := get(context.Background(), c, "http://"+addr+"/api/v1/pods?watch=true&resourceVersion=7")
		done <- result{resp, err}
	}()
	time.Sleep(100 * time.Millisecond) // several refusals
	select {
	case r := <-done:
		t.Fatalf("the watch ended while refused: %v %v", r.resp, r.err)
	default:
	}
	serve(t, addr, http.StatusOK)
	select {
	case r := <-done:
		if r.err != nil || r.resp.StatusCode != http.StatusOK {
			t.Fatalf("after the server came: %v %v", r.resp, r.err)
		}
		r.resp.Body.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not get through after the server came")
	}
	if got := w.get(); len(got) != 2 || !got[0] || got[1] {
		t.Errorf("waiting calls %v, want [true false]", got)
	}
}

// Anything else fails at once: a request that is not a watch, and a watch
// that the server answers, even with an error.
func TestOthersFailAtOnce(t *testing.T) {
	var w waits
	c := client(&w)
	addr := freeAddr(t)
	for _, path := range []string{"/readyz", "/api/v1/pods", "/api/v1/pods?watch=false"} {
		start := time.Now()
		if _, err := get(context.Background(), c, "http://"+addr+path); err == nil {
			t.Errorf("%s: no error from a refused address", path)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: took %s", path, d)
		}
	}
	serve(t, addr, http.StatusInternalServerError)
	resp, err := get(context.Background(), c, "http://"+addr+"/api/v1/pods?watch=1")
	if err != nil || resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("a watch the server answers with 500: %v %v", resp, err)
	}
	resp.Body.Close()
	if got := w.get(); len(got) != 0 {
		t.Errorf("waiting calls %v, want none", got)
	}
}

// A waiting watch ends with its context, with the refusal as its error.
func TestWaitEndsWithContext(t *testing.T) {
	var w waits
	c := client(&w)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	var refusals atomic.Int64
	c.Transport = Wrap(countingTransport{&http.Transport{DisableKeepAlives: true}, &refusals}, 10*time.Millisecond, w.record)
	errc := make(chan error, 1)
	go func() {
		_, err := get(ctx, c, "http://"+addr+"/api/v1/pods?watch=true")
		errc <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); refusals.Load() < 3; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the watch was not retried")
		}
	}
	cancel()
	select {
	case err := <-errc:
		var op *net.OpError
		if !errors.As(err, &op) {
			t.Errorf("error %v, want the connection refusal", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not end with its context")
	}
}

type countingTransport struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(req)
	if err != nil {
		c.n.Add(1)
	}
	return resp, err
}
