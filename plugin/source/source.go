// Package source feeds the table from one cluster's API server: a
// label-filtered Pod informer whose objects are cut down to slim records
// before they are stored. Each source connects, fails and recovers on its
// own, and nothing here ever blocks start-up or a DNS answer.
package source

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/mcsannotations/mcsannotations/plugin/annotation"
	"github.com/mcsannotations/mcsannotations/plugin/internal/informerstop"
	"github.com/mcsannotations/mcsannotations/plugin/table"
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
}

// Options tune a source; zero values take the defaults.
type Options struct {
	// ProbeInterval is how often the API server's /readyz is checked to
	// track contact (default 5s); ProbeTimeout bounds one check (default 3s).
	ProbeInterval, ProbeTimeout time.Duration
	// StopWait bounds how long Stop and Expire wait for the informer to end
	// (default informerstop.Wait).
	StopWait time.Duration
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
	started     atomic.Int64 // unix nanoseconds of the last Start

	mu      sync.Mutex // serialises Start, Stop and Expire; guards cancel and factory
	cancel  context.CancelFunc
	factory informers.SharedInformerFactory
	wg      sync.WaitGroup
}

// New returns a source for cluster; Start starts it.
func New(cluster string, client kubernetes.Interface, t *table.Table, ev Events, opts Options) *Source {
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = 5 * time.Second
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = 3 * time.Second
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

// Started returns when the source was last started.
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
	stopErr := s.stopLocked()
	s.table.ReplaceCluster(s.cluster, nil)
	s.expired.Store(true)
	return errors.Join(stopErr, s.startLocked())
}

// Start starts the informer and the contact probe in the background and
// returns at once.
func (s *Source) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startLocked()
}

func (s *Source) startLocked() error {
	if s.cancel != nil {
		return errors.New("source already started")
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.started.Store(time.Now().UnixNano())

	selector := labels.Set{annotation.ExporterLabel: annotation.LabelValue}.AsSelector().String()
	s.factory = informers.NewSharedInformerFactoryWithOptions(s.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := s.factory.Core().V1().Pods().Informer()
	if err := inf.SetTransform(toSlim(s.cluster)); err != nil {
		return err
	}
	if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		s.setState(Disconnected, err)
	}); err != nil {
		return err
	}
	reg, err := inf.AddEventHandler(informerstop.Handlers(ctx, cache.ResourceEventHandlerFuncs{
		AddFunc:    s.onAdd,
		UpdateFunc: s.onUpdate,
		DeleteFunc: s.onDelete,
	}))
	if err != nil {
		return err
	}
	s.factory.Start(ctx.Done())

	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			return
		}
		// The first complete list is the truth for this cluster: drop every
		// record (from a snapshot, or from before a restart) that it lacks.
		var recs []*table.Pod
		for _, obj := range inf.GetStore().List() {
			if p, ok := obj.(*slimPod); ok {
				recs = append(recs, p.rec)
			}
		}
		s.table.ReplaceCluster(s.cluster, recs)
		s.lastSync.Store(time.Now().UnixNano())
		s.synced.Store(true)
		s.expired.Store(false)
		s.touch()
		if s.ev.Synced != nil {
			s.ev.Synced(s.cluster)
		}
	}()
	go func() {
		defer s.wg.Done()
		s.probe(ctx)
	}()
	return nil
}

// Stop stops the informer and the probe and waits for them, for the informer
// at most Options.StopWait: the error (wrapping informerstop.ErrSlow) says it
// is still ending in the background, harmless.
func (s *Source) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked()
}

func (s *Source) stopLocked() error {
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	err := informerstop.Shutdown(s.factory, s.opts.StopWait)
	s.wg.Wait()
	s.cancel, s.factory = nil, nil
	return err
}

func (s *Source) onAdd(obj any) {
	p, ok := obj.(*slimPod)
	if !ok {
		return
	}
	s.touch()
	s.reject(p)
	s.table.Upsert(p.rec)
}

func (s *Source) onUpdate(oldObj, newObj any) {
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
	if o.rec.Equal(n.rec) {
		return
	}
	s.table.Upsert(n.rec)
}

func (s *Source) onDelete(obj any) {
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

// probe checks /readyz on an interval, so that contact is tracked (and a
// hung API server is noticed) even when no Pod changes.
func (s *Source) probe(ctx context.Context) {
	t := time.NewTicker(s.opts.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rc := s.client.Discovery().RESTClient()
		if rc == nil { // fake clientsets have none
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, s.opts.ProbeTimeout)
		err := rc.Get().AbsPath("/readyz").Do(pctx).Error()
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.setState(Disconnected, err)
			continue
		}
		s.touch()
	}
}
