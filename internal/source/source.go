// Package source feeds the record store (internal/store) from one cluster's
// API server: a reflector of the exported Pods (see ingest) whose store holds
// slim records and hands every change to the record store. Each source
// connects, fails and recovers on its own, and nothing here ever blocks
// start-up or a DNS answer.
package source

import (
	"context"
	"crypto/ed25519"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// State is a source's connection state.
type State int32

// The states of a source.
const (
	Syncing      State = iota // started, first complete list not applied yet
	Connected                 // synced and the API server answers
	Disconnected              // the API server does not answer or the watch fails
)

var stateNames = [...]string{"syncing", "connected", "disconnected"}

func (s State) String() string { return stateNames[s] }

// States lists every State, for metric labels.
var States = []State{Syncing, Connected, Disconnected}

// Events are the callbacks a source makes; each may be nil. They are called
// from the source's goroutines and must not block.
type Events struct {
	// Rejected reports entries of a Pod's annotation that were skipped. It is
	// called once per change of the annotation, not on every Pod update.
	Rejected func(cluster, namespace, name string, rej []annotation.Rejection)
	// StateChanged reports a transition, with the error that caused it if any.
	StateChanged func(cluster string, from, to State, err error)
	// Synced reports that the first complete list of a reflector (after
	// Start or Expire) has replaced the cluster's records (of every
	// reflector, for a scoped source).
	Synced func(cluster string)
	// Scope reports what a scoped source reads, at start and at each
	// change.
	Scope func(cluster string, sc Scope)
}

// StaleGrace is how long a cluster counts as in contact after its source last
// had contact with its API server (or started, when it never had): one failed
// check, or a restart about to reconnect, marks no answer stale and drops no
// endpoint. CoreDNS's stale marks and policies, the MCS controller's slices
// and mcsctl all count it so.
const StaleGrace = 5 * time.Second

// Options tune a source; zero values take the defaults.
type Options struct {
	// ProbeInterval is how often the API server's /readyz is checked to
	// track contact (default 5s); ProbeTimeout bounds one check (default 3s).
	ProbeInterval, ProbeTimeout time.Duration
	// ReconnectInterval is how often the API server is checked while the
	// last check failed (default 500ms), so that contact is seen soon after
	// it comes back.
	ReconnectInterval time.Duration
	// Check replaces the /readyz check (for tests: fake clientsets have no
	// REST client).
	Check func(context.Context) error
	// Key, when set, is the cluster's public key: a Pod's export annotation
	// counts only with a signature annotation that verifies with it
	// (docs/DESIGN.md#security); others export nothing and are reported through
	// Events.Rejected (annotation.ReasonUnsigned, ReasonBadSignature). Nil:
	// no verification.
	Key ed25519.PublicKey
	// Ingest tunes the reflectors; their Failed event is the source's too
	// (the state turns Disconnected).
	Ingest ingest.Options
	// Scoped reads only the namespaces that the cluster publishes as
	// exporting (ConfigMap ExportingNamespacesName in
	// ExportingNamespacesNamespace, kept by its annotator), one watch each,
	// following the list as it changes: a peer's credential then needs a
	// grant in those namespaces only. Without the list (an older exporter)
	// or leave to read it, or with more than MaxNamespaces names, it reads
	// every namespace, as without Scoped; Events.Scope says so.
	Scoped bool
	// MaxNamespaces bounds the watches of a scoped source (default 1000).
	MaxNamespaces int
	// RecheckList is how often a scoped source that may not read the list
	// tries again (default 1 minute).
	RecheckList time.Duration
	// KeepProof fills each record's store.Proof (the Pod's UID, raw export
	// annotation, endpoint statement and signature), which a relay hub
	// passes on, in a store.Common of the record's own; off, records carry
	// none and share their service's Common (an edge's table stays as small).
	KeepProof bool
	// Shared, when set, is an informer of the cluster's Pods that another
	// component of the process runs (the annotator's, of every local Pod):
	// the source reads the exported ones from it instead of watching them
	// itself, so that the process watches the cluster's Pods once
	// (shared.go). Its objects must keep what a record is made of (the
	// export annotation and its signature, the endpoint statement and its
	// signature, the exporter label, spec.hostname, the addresses, the
	// phase, the Ready condition and the deletion time). Scoped and the
	// Ingest events of the reflectors do not apply; contact is still
	// checked with the client.
	Shared cache.SharedInformer
}

// Source is one cluster's feed into the record store.
type Source struct {
	cluster string
	client  kubernetes.Interface
	records *store.Store
	ev      Events
	opts    Options

	state       atomic.Int32
	lastContact atomic.Int64 // unix nanoseconds
	lastSync    atomic.Int64 // unix nanoseconds of the last complete list
	synced      atomic.Bool  // a complete list was applied once; never reset
	expired     atomic.Bool  // records dropped by Expire; cleared by the next complete list
	started     atomic.Int64 // unix nanoseconds of the last start of the reflector

	mu     sync.Mutex         // serialises Start, Stop and Expire; guards cancel and feed
	cancel context.CancelFunc // of the check loop
	feed   *feed              // the running reflectors; nil when stopped
	wg     sync.WaitGroup     // the check loop
}

// New returns a source for cluster; Start starts it.
func New(cluster string, client kubernetes.Interface, records *store.Store, ev Events, opts Options) *Source {
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = 5 * time.Second
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = 3 * time.Second
	}
	if opts.ReconnectInterval <= 0 {
		opts.ReconnectInterval = 500 * time.Millisecond
	}
	if opts.MaxNamespaces <= 0 {
		opts.MaxNamespaces = 1000
	}
	if opts.RecheckList <= 0 {
		opts.RecheckList = time.Minute
	}
	return &Source{cluster: cluster, client: client, records: records, ev: ev, opts: opts}
}

// Cluster returns the cluster ID of the source.
func (s *Source) Cluster() string { return s.cluster }

// State returns the current connection state.
func (s *Source) State() State { return State(s.state.Load()) }

// HasSynced reports whether the first complete list has been applied.
func (s *Source) HasSynced() bool { return s.synced.Load() }

// LastContact returns when the API server last answered (zero if never).
func (s *Source) LastContact() time.Time {
	n := s.lastContact.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// LastFullSync returns when a complete list last replaced the cluster's
// records (zero if never).
func (s *Source) LastFullSync() time.Time {
	n := s.lastSync.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// SeedLastContact sets the last contact when none is known yet: a snapshot
// remembers it across restarts, so that expiry counts from the real loss.
func (s *Source) SeedLastContact(t time.Time) {
	if !t.IsZero() {
		s.lastContact.CompareAndSwap(0, t.UnixNano())
	}
}

// SeedLastFullSync sets the last full sync when none is known yet, from a
// snapshot: a source that has not listed in this process must not write "never"
// over the stored time, or the next offline restart would not be ready.
func (s *Source) SeedLastFullSync(t time.Time) {
	if !t.IsZero() {
		s.lastSync.CompareAndSwap(0, t.UnixNano())
	}
}

// Expired reports whether Expire dropped the records and no complete list
// has restored them yet.
func (s *Source) Expired() bool { return s.expired.Load() }

// Started returns when the reflector was last started (by Start or Expire).
func (s *Source) Started() time.Time { return time.Unix(0, s.started.Load()) }

// Expire drops every record of the cluster from the record store and restarts the
// reflector with an empty store, so that the next complete list, whenever
// the API server answers again, restores them.
//
// Its error may wrap ingest.ErrSlow: the old reflector is still ending in
// the background; the records are dropped and the new one runs all the same.
func (s *Source) Expire() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel == nil {
		return errors.New("source not started")
	}
	err := s.stopRun()
	s.records.ReplaceCluster(s.cluster, nil)
	s.expired.Store(true)
	s.startRun()
	return err
}

// Start starts the reflector and the contact check in the background and
// returns at once.
func (s *Source) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		return errors.New("source already started")
	}
	s.startRun()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Go(func() { s.check(ctx) })
	return nil
}

// startRun starts the reflectors of the exported Pods; s.mu is held.
func (s *Source) startRun() {
	s.started.Store(time.Now().UnixNano())
	s.feed = s.startFeed()
}

// stopRun stops the reflectors; s.mu is held.
func (s *Source) stopRun() error {
	if s.feed == nil {
		return nil
	}
	err := s.feed.stop()
	s.feed = nil
	return err
}

// Stop stops the reflector and the check and waits for them, for the
// reflector at most its StopWait: the error (wrapping ingest.ErrSlow) says
// it is still ending in the background, harmless.
func (s *Source) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	err := s.stopRun()
	s.wg.Wait()
	s.cancel = nil
	return err
}

// listed records a complete list applied by the store.
func (s *Source) listed(first bool) {
	s.lastSync.Store(time.Now().UnixNano())
	s.synced.Store(true)
	s.expired.Store(false)
	s.touch()
	if first && s.ev.Synced != nil {
		s.ev.Synced(s.cluster)
	}
}

func (s *Source) reject(p *slimPod) {
	if len(p.rejected) > 0 && s.ev.Rejected != nil {
		s.ev.Rejected(s.cluster, p.Namespace, p.Name, p.rejected)
	}
}

// touch records a successful contact.
func (s *Source) touch() {
	s.lastContact.Store(time.Now().UnixNano())
	if s.synced.Load() {
		s.setState(Connected, nil)
	}
}

func (s *Source) setState(to State, err error) {
	from := State(s.state.Swap(int32(to)))
	if from != to && s.ev.StateChanged != nil {
		s.ev.StateChanged(s.cluster, from, to, err)
	}
}

// check looks at /readyz so that contact is tracked (and a hung API server
// is noticed) even when no Pod changes (see Contact).
func (s *Source) check(ctx context.Context) {
	Contact(ctx, s.client, s.opts, func(err error) {
		if err != nil {
			s.setState(Disconnected, err)
			return
		}
		s.touch()
	})
}

// Contact checks client's /readyz (opts.Check instead, when set), each check
// within opts.ProbeTimeout: at once, then opts.ProbeInterval after each check
// that passed and opts.ReconnectInterval after each that failed, until ctx
// ends; result hears of each check's outcome. A client that cannot be
// checked (a fake clientset without opts.Check) is not checked again:
// contact is then learned from events alone. Every reader of a cluster
// (sources, relay hubs) tracks contact so; zero durations take New's
// defaults.
func Contact(ctx context.Context, client kubernetes.Interface, opts Options, result func(err error)) {
	opts = New("", nil, nil, Events{}, opts).opts
	failing := true
	next := wait.DelayFunc(func() time.Duration {
		if failing {
			return opts.ReconnectInterval
		}
		return opts.ProbeInterval
	})
	_ = next.Until(ctx, true, true, func(ctx context.Context) (bool, error) {
		err := checkOnce(ctx, client, opts)
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, errNoCheck):
			return true, nil
		default:
			failing = err != nil
			result(err)
		}
		return false, nil
	})
}

// errNoCheck: the client cannot be checked (a fake clientset without
// Options.Check), so contact is learned from events alone.
var errNoCheck = errors.New("no REST client to check")

// checkOnce checks /readyz once, within ProbeTimeout.
func checkOnce(ctx context.Context, client kubernetes.Interface, opts Options) error {
	cctx, cancel := context.WithTimeout(ctx, opts.ProbeTimeout)
	defer cancel()
	if opts.Check != nil {
		return opts.Check(cctx)
	}
	rc := client.Discovery().RESTClient()
	if rc == nil { // fake clientsets have none
		return errNoCheck
	}
	return rc.Get().AbsPath("/readyz").Do(cctx).Error()
}
