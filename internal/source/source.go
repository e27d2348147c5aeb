// Package source feeds the table from one cluster's API server: a
// label-filtered Pod informer whose objects are cut down to slim records
// before they are stored. Each source connects, fails and recovers on its
// own, and nothing here ever blocks start-up or a DNS answer.
package source

import (
	"context"
	"crypto/ed25519"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/informerstop"
	"github.com/mcsannotations/mcsannotations/internal/podinformer"
	"github.com/mcsannotations/mcsannotations/internal/table"
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
	// Synced reports that a complete list has replaced the cluster's records.
	Synced func(cluster string)
	// Informer is what the source's Pod informer reports (a malformed list,
	// an expired watch, each list of every Pod after the first; the records
	// stay as they were meanwhile), for this source's cluster.
	Informer podinformer.Events
}

// Options tune a source; zero values take the defaults.
type Options struct {
	// ProbeInterval is how often the API server's /readyz is checked to
	// track contact (default 5s); ProbeTimeout bounds one check (default 3s).
	ProbeInterval, ProbeTimeout time.Duration
	// ReconnectInterval is how often the API server is checked while the
	// last check failed (default 500ms), so that contact is seen soon after
	// it comes back.
	ReconnectInterval time.Duration
	// StopWait bounds how long Stop and Expire wait for the informer to end
	// (default informerstop.Wait).
	StopWait time.Duration
	// Check replaces the /readyz check (for tests: fake clientsets have no
	// REST client).
	Check func(context.Context) error
	// Key, when set, is the cluster's public key: a Pod's export annotation
	// counts only with a signature annotation that verifies with it (SPEC
	// section 6); others export nothing and are reported through
	// Events.Rejected (annotation.ReasonUnsigned, ReasonBadSignature). Nil:
	// no verification.
	Key ed25519.PublicKey
}

// Source is one cluster's feed into the table.
type Source struct {
	cluster string
	client  kubernetes.Interface
	table   *table.Table
	ev      Events
	opts    Options

	state       atomic.Int32
	lastContact atomic.Int64 // unix nanoseconds
	lastSync    atomic.Int64 // unix nanoseconds of the last complete list
	synced      atomic.Bool  // a complete list was applied once; never reset
	expired     atomic.Bool  // records dropped by Expire; cleared by the next complete list
	started     atomic.Int64 // unix nanoseconds of the last start of the informer

	// evMu orders the event handlers against the first list's swap, so that
	// an event the swap's list missed is applied after it, not before.
	evMu sync.Mutex

	mu     sync.Mutex         // serialises Start, Stop and Expire; guards cancel and inf
	cancel context.CancelFunc // of the check loop
	inf    *informer          // the running informer; nil when stopped
	wg     sync.WaitGroup     // the check loop
}

// informer is one run of the Pod informer; Expire replaces it.
type informer struct {
	cancel  context.CancelFunc
	factory informers.SharedInformerFactory
	store   cache.Store
	swap    sync.WaitGroup // the goroutine that applies the first complete list
	// live is set (under Source.evMu) once the first complete list is in the
	// table. Until then the handlers leave the table alone and the swap
	// applies the informer's whole store in one step: applied one by one, a
	// first list over a snapshot's records would show, for a moment, the
	// Pods created meanwhile beside those deleted meanwhile.
	live bool
}

// New returns a source for cluster; Start starts it.
func New(cluster string, client kubernetes.Interface, t *table.Table, ev Events, opts Options) *Source {
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = 5 * time.Second
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = 3 * time.Second
	}
	if opts.ReconnectInterval <= 0 {
		opts.ReconnectInterval = 500 * time.Millisecond
	}
	if opts.StopWait <= 0 {
		opts.StopWait = informerstop.Wait
	}
	return &Source{cluster: cluster, client: client, table: t, ev: ev, opts: opts}
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

// Started returns when the informer was last started (by Start or Expire).
func (s *Source) Started() time.Time { return time.Unix(0, s.started.Load()) }

// Expire drops every record of the cluster from the table and restarts the
// informer from scratch, so that the next complete list, whenever the API
// server answers again, restores them (a running informer's relist would
// look unchanged and restore nothing).
//
// Its error may wrap informerstop.ErrSlow: the old informer is still ending
// in the background; the records are dropped and the new one runs all the same.
func (s *Source) Expire() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel == nil {
		return errors.New("source not started")
	}
	var stopErr error
	if s.inf != nil {
		stopErr = s.inf.stop(s.opts.StopWait)
		s.inf = nil
	}
	s.table.ReplaceCluster(s.cluster, nil)
	s.expired.Store(true)
	inf, err := s.startInformer()
	s.inf = inf
	return errors.Join(stopErr, err)
}

// Start starts the informer and the contact check in the background and
// returns at once.
func (s *Source) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		return errors.New("source already started")
	}
	inf, err := s.startInformer()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.inf = cancel, inf
	s.wg.Go(func() { s.check(ctx) })
	return nil
}

// startInformer starts a new run of the Pod informer.
func (s *Source) startInformer() (*informer, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s.started.Store(time.Now().UnixNano())

	selector := labels.Set{annotation.ExporterLabel: annotation.LabelValue}.AsSelector().String()
	factory, inf, err := podinformer.New(s.client, selector, toSlim(s.cluster, s.opts.Key), s.ev.Informer)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		if ctx.Err() == nil {
			s.setState(Disconnected, err)
		}
	}); err != nil {
		cancel()
		return nil, err
	}
	run := &informer{cancel: cancel, factory: factory, store: inf.GetStore()}
	reg, err := inf.AddEventHandler(informerstop.Handlers(ctx, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.onAdd(run, obj) },
		UpdateFunc: func(oldObj, newObj any) { s.onUpdate(run, oldObj, newObj) },
		DeleteFunc: func(obj any) { s.onDelete(run, obj) },
	}))
	if err != nil {
		cancel()
		return nil, err
	}
	factory.Start(ctx.Done())

	run.swap.Go(func() {
		if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			return
		}
		s.evMu.Lock()
		defer s.evMu.Unlock()
		if ctx.Err() != nil {
			return // replaced or stopped meanwhile: its list is not the newest
		}
		// The first complete list is the truth for this cluster: drop every
		// record (from a snapshot, or from before a restart) that it lacks.
		var recs []*table.Pod
		for _, obj := range run.store.List() {
			if p, ok := obj.(*slimPod); ok {
				recs = append(recs, p.rec)
			}
		}
		s.table.ReplaceCluster(s.cluster, recs)
		run.live = true
		s.lastSync.Store(time.Now().UnixNano())
		s.synced.Store(true)
		s.expired.Store(false)
		s.touch()
		if s.ev.Synced != nil {
			s.ev.Synced(s.cluster)
		}
	})
	return run, nil
}

// stop cancels the run and waits up to within for its informer to end; the
// error (wrapping informerstop.ErrSlow) says it is still ending in the
// background, harmless.
func (r *informer) stop(within time.Duration) error {
	r.cancel()
	err := informerstop.Shutdown(r.factory, within)
	r.swap.Wait()
	return err
}

// Stop stops the informer and the check and waits for them, for the informer
// at most Options.StopWait: the error (wrapping informerstop.ErrSlow) says it
// is still ending in the background, harmless.
func (s *Source) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	var err error
	if s.inf != nil {
		err = s.inf.stop(s.opts.StopWait)
	}
	s.wg.Wait()
	s.cancel, s.inf = nil, nil
	return err
}

// event holds evMu for an event's handler; the returned func releases it.
func (s *Source) event() func() {
	s.evMu.Lock()
	return s.evMu.Unlock
}

// The handlers apply a change to the table once run is live (see
// informer.live); before, the swap will.

func (s *Source) onAdd(run *informer, obj any) {
	defer s.event()()
	p, ok := obj.(*slimPod)
	if !ok {
		return
	}
	s.touch()
	s.reject(p)
	if run.live {
		s.table.Upsert(p.rec)
	}
}

func (s *Source) onUpdate(run *informer, oldObj, newObj any) {
	defer s.event()()
	o, ok1 := oldObj.(*slimPod)
	n, ok2 := newObj.(*slimPod)
	if !ok1 || !ok2 {
		return
	}
	s.touch()
	if o.ResourceVersion == n.ResourceVersion {
		return // a relist or resync: nothing changed
	}
	if o.annoHash != n.annoHash {
		s.reject(n)
	}
	if !run.live || o.rec.Equal(n.rec) {
		return
	}
	s.table.Upsert(n.rec)
}

func (s *Source) onDelete(run *informer, obj any) {
	defer s.event()()
	if !run.live {
		return
	}
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	switch p := obj.(type) {
	case *slimPod:
		s.table.Delete(p.rec.Key())
	case *v1.Pod: // a tombstone that was never transformed
		s.table.Delete(table.Key{Cluster: s.cluster, Namespace: p.Namespace, Name: p.Name})
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

// check looks at /readyz on an interval, so that contact is tracked (and a
// hung API server is noticed) even when no Pod changes: at once on start,
// then every ProbeInterval, and every ReconnectInterval while the last check
// failed.
func (s *Source) check(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := s.checkOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNoCheck) {
			t.Reset(s.opts.ProbeInterval)
			continue
		}
		if err != nil {
			s.setState(Disconnected, err)
			t.Reset(s.opts.ReconnectInterval)
			continue
		}
		s.touch()
		t.Reset(s.opts.ProbeInterval)
	}
}

// errNoCheck: the client cannot be checked (a fake clientset without
// Options.Check), so contact is learned from events alone.
var errNoCheck = errors.New("no REST client to check")

// checkOnce checks /readyz once, within ProbeTimeout.
func (s *Source) checkOnce(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, s.opts.ProbeTimeout)
	defer cancel()
	if s.opts.Check != nil {
		return s.opts.Check(cctx)
	}
	rc := s.client.Discovery().RESTClient()
	if rc == nil { // fake clientsets have none
		return errNoCheck
	}
	return rc.Get().AbsPath("/readyz").Do(cctx).Error()
}
