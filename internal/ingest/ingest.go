// Package ingest is how the plugin follows what it watches in an API server
// (the Pods of each source, the local client Pods, the ServiceImports): one
// client-go Reflector per resource, writing into a store that the component
// owns. The store's Replace is the component's swap (a complete list is the
// truth) and its Add, Update and Delete are its upserts; nothing else sits
// in between (no informer, no DeltaFIFO, no second copy of the objects).
//
// The ListerWatcher hands the store slim objects (each component's
// Transform cuts an object down as it arrives; Pods and custom resources
// are listed one object at a time, so a list is never held whole), reports
// what client-go logs only at high verbosity (a malformed list, an expired
// watch, each relist) and keeps client-go's watch-list off (its retry
// sleeps without looking at its context, so a stop would wait for it). The reflector's retry backoff
// is Backoff: short, so that a peer that comes back is listed and watched
// again within a third of a second, however long or often it was gone.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
)

// Backoff is the reflectors' retry backoff: 100 ms, then 200 ms, then every
// 250 ms (each up to a fifth longer), so that a list or watch resumes soon
// after an API server answers again, however often it failed before
// (client-go's default backoff grows to 30 s and resets only every two
// minutes). The reflector also waits one step of it between every end of a
// watch and the next list: the relist after an expired watch starts one
// step after the 410, at most about 300 ms after an outage. A shorter step
// relists sooner but retries an API server that is down more often, once
// per reflector (a scoped peer has one per exporting namespace).
var Backoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 10, Cap: 250 * time.Millisecond}

// StopWait is the default bound on the wait for a stopping reflector.
const StopWait = 2 * time.Second

// ErrSlow is wrapped by the error Stop returns when it stopped waiting.
var ErrSlow = errors.New("still stopping")

// Events are what a run reports; each may be nil. They are called from the
// run's goroutines and must not block.
type Events struct {
	// Malformed hears of a list that broke off, did not decode or was over
	// its size bound (bytes, or MaxObjects objects), unless a Reader's
	// TooLarge heard of it already (a streamed list of Pods over a bound).
	// The store keeps what it holds; the list is made again.
	Malformed func(err error)
	// Expired hears that a watch expired (410: the API server restarted, or
	// the watch fell behind its window of changes); every object is listed
	// again.
	Expired func()
	// Relisted hears of each complete list after the run's first: its
	// objects, and the time from the list's start until it arrived (the
	// store takes it next).
	Relisted func(objects int, took time.Duration)
	// Failed hears of a list or a watch that failed (a watch that the
	// server ends with an error included); the reflector tries again after
	// its backoff.
	Failed func(err error)
	// Full hears of the first new object that a Store holding MaxObjects
	// dropped, once per spell of being full (a deletion or a list ends it).
	// The watch then ends at its next event and the objects are listed
	// again: a list that fits replaces what the store holds, dropped
	// objects included.
	Full func(err error)
}

// Options tune a run; zero values take the defaults.
type Options struct {
	// Name names the run in client-go's logs and the plugin's metrics
	// ("cluster/<id>", "clients", "serviceimports").
	Name string
	// Backoff replaces the package's Backoff (tests lengthen it).
	Backoff *wait.Backoff
	// StopWait bounds the wait for the reflector to end (default StopWait).
	StopWait time.Duration
	Events   Events
}

// Run is one reflector filling one store, from Start until Stop.
type Run struct {
	cancel   context.CancelFunc
	ctx      context.Context
	done     chan struct{}
	stopWait time.Duration
}

// Start starts a reflector that lists and watches with lw and writes into
// store, in the background.
func Start(lw *ListerWatcher, store cache.ReflectorStore, opts Options) *Run {
	if opts.Backoff == nil {
		b := Backoff
		opts.Backoff = &b
	}
	if opts.StopWait <= 0 {
		opts.StopWait = StopWait
	}
	ctx, cancel := context.WithCancel(context.Background())
	lw = lw.observed(opts.Events)
	if s, ok := store.(interface{ refuseWith(func(error)) }); ok {
		s.refuseWith(func(err error) {
			lw.relist.Store(true)
			if opts.Events.Full != nil {
				opts.Events.Full(err)
			}
		})
	}
	r := cache.NewReflectorWithOptions(lw, nil, store, cache.ReflectorOptions{Name: opts.Name, Backoff: opts.Backoff})
	run := &Run{cancel: cancel, ctx: ctx, done: make(chan struct{}), stopWait: opts.StopWait}
	go func() {
		defer close(run.done)
		r.RunWithContext(ctx)
	}()
	return run
}

// Context ends when the run is stopped: a store checks it (under the lock
// its owner's Stop takes) before it changes anything.
func (r *Run) Context() context.Context { return r.ctx }

// Stop stops the reflector and waits for it at most Options.StopWait: the
// error (wrapping ErrSlow) says it still ends in the background, harmless,
// since the store ignores it once the run's context is done.
func (r *Run) Stop() error {
	r.cancel()
	if Bounded(func() { <-r.done }, r.stopWait) {
		return nil
	}
	return fmt.Errorf("%w: gave up waiting after %s; it ends on its own", ErrSlow, r.stopWait)
}

// Bounded runs f and reports whether it returned within d; when it has not,
// it is left to return in the background.
func Bounded(f func(), d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
