// Package mcscontroller is each cluster's MCS controller (docs/DESIGN.md):
// from the export annotations of the local cluster and of every peer, read
// into a record store by the plugin's own sources, it keeps in the local cluster a
// ServiceImport per exported service, the derived Service whose ClusterIPs
// are a ClusterSetIP service's ClusterSetIPs, the EndpointSlices of every
// exporting cluster, and the Conflict condition of the local ServiceExports.
//
// What a cluster that cannot be reached exported stays as last written: the
// local API server holds it, and a cluster that has not answered since the
// controller started is merged from its EndpointSlices, never removed. Only a
// cluster that answers and no longer exports a service takes its share away
// (or one past its expiry, when the operator set one).
package mcscontroller

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/mcsapi"
)

// FieldManager is the controller's server-side apply field manager.
const FieldManager = "mcs-controller"

// AnnotationApplied holds a hash of what the controller last applied to an
// object, so that an unchanged object is not written again.
const AnnotationApplied = "multicluster.mcsannotations.io/applied"

// Source is what the controller needs of a cluster's feed (internal/source).
type Source interface {
	Cluster() string
	// HasSynced reports whether a complete list of the cluster's exporter
	// Pods has reached the store in this process: only then is the store's
	// view of the cluster its current share.
	HasSynced() bool
	// LastContact is when the cluster's API server last answered.
	LastContact() time.Time
}

// Config configures a Controller.
type Config struct {
	// LocalCluster is the local cluster's ID: its share never expires.
	LocalCluster string
	// Expire drops the share of a peer whose API server has not answered
	// for this long (0: never, the default). The local cluster never expires.
	Expire time.Duration
	// Interval bounds how long a change waits before it is written (the
	// changes of a burst are written together), and Resync how often
	// everything is checked even without a change.
	Interval, Resync time.Duration
	// CRDPoll is how often the ServiceImport CRD is looked for while the API
	// server does not serve it.
	CRDPoll time.Duration
	// StatePoll is how often the clusters' states (current, stale, past
	// their expiry) are looked at, so that a peer's share goes when its
	// expiry passes and comes back when it answers again, without waiting
	// for a change of records or for the resync (default 1s).
	StatePoll time.Duration
	// Workers is how many services a reconcile writes at once (default 8):
	// the writes of one service follow each other, those of different
	// services do not wait for each other.
	Workers int
	// FirstLists bounds how long the first reconcile waits for every
	// cluster's first complete list (default 5s): a service that several
	// clusters export is then written once with all of them, not once more
	// as each cluster's list comes in. A cluster that does not answer
	// within it is written as it is held (stale), and again once it lists.
	FirstLists time.Duration

	// MaxImportsPerNamespace caps the services imported into one namespace
	// (default 1000), MaxImportsPerCluster the services one source cluster
	// takes part in (default 20000: the 10,000 services of the benchmark
	// with room); negative: no cap. Over a cap, a new service (or a
	// cluster's new share of one) is refused, never one already imported:
	// what was imported first stays, and among new ones the oldest export
	// (then the name) goes first.
	MaxImportsPerNamespace, MaxImportsPerCluster int
	// RefusedNamespaces are the namespaces no import is written to (nil:
	// DefaultRefusedNamespaces; empty: none).
	RefusedNamespaces []string
	// Damp is the least time between two writes of one service (default 1s;
	// negative: none). A service that keeps changing (more than three writes
	// in a row, each within twice its wait of the last) waits twice as long
	// each time, up to DampMax (default 30s). A ClusterSetIP service that
	// turns Headless keeps its derived Service, and so its ClusterSetIPs,
	// for DampMax: turned back within it, it has the same ones.
	Damp, DampMax time.Duration
	// RetryMax caps the backoff of a service whose writes failed (its own:
	// from Interval, doubling; default 1m). The other services do not wait.
	RetryMax time.Duration
	// Recorder, when set, records Events on the ServiceExport (else the
	// ServiceImport) of a service for what is refused or conflicts.
	Recorder record.EventRecorder
}

// Controller keeps the MCS objects of the local cluster.
type Controller struct {
	cfg     Config
	records *store.Store
	sources []Source
	client  kubernetes.Interface
	dyn     dynamic.Interface
	disco   discovery.DiscoveryInterface
	metrics *Metrics
	started time.Time

	kick chan struct{}
	// ready is closed by Run once every field below is set (the CRDs are
	// served and the informers started); nothing writes them after that.
	ready chan struct{}

	namespaces cache.Indexer
	services   cache.Indexer
	slices     cache.Indexer
	imports    cache.GenericLister
	importsGVR schema.GroupVersionResource
	exportsGVR schema.GroupVersionResource
	exports    cache.GenericLister
	synced     []cache.InformerSynced

	mu      sync.Mutex
	lastErr error
	// seenState is the clusters' states the last reconcile wrote for (nil
	// before the first); the loop reads it without waiting for a reconcile.
	seenState atomic.Pointer[string]

	// dirty are the services to reconcile next (all of them when all is
	// set): those whose local objects changed, and every service of the
	// namespaces in dirtyNS (created or deleted). The services whose
	// records changed are found by the reconcile itself.
	dirtyMu sync.Mutex
	dirty   map[clusterset.Key]bool
	dirtyNS map[string]bool
	all     bool

	// What the last reconcile saw and did; only Reconcile touches these,
	// holding reconciling (one reconcile at a time).
	reconciling sync.Mutex
	// lastPods are the current clusters' records (the store keeps the
	// pointer of a record that did not change, and holding them keeps a
	// pointer from being reused), lastCount their number per service.
	lastPods  map[*store.Pod]struct{}
	lastCount map[clusterset.Key]int
	done      map[clusterset.Key]*outcome
	// nslices and nconflicts total the slices and the conflicts of done,
	// kept as done changes so that the metrics need no walk over it;
	// perNS and perCluster count the services of done by namespace and by
	// source cluster (the caps).
	nslices, nconflicts int
	perNS, perCluster   map[string]int
	// refused are the services left out for a cap: looked at again when a
	// service goes and makes room.
	refused map[clusterset.Key]bool
	// loggedRefused is how many were refused when logCaps last logged.
	loggedRefused int
	// said are the notes last reported per service (report).
	said map[clusterset.Key]notes
	// damp and notBefore pace each service's writes: a service marked
	// before its time waits in later. headless is when a ClusterSetIP
	// service whose derived Service is kept turned Headless.
	damp      map[clusterset.Key]*damping
	notBefore map[clusterset.Key]time.Time
	headless  map[clusterset.Key]time.Time

	// retry is each service's backoff after a failed write; later holds
	// the services that wait (backoff or damping) until they are due.
	retry workqueue.TypedRateLimiter[clusterset.Key]
	later workqueue.TypedDelayingInterface[clusterset.Key]
	// refusedNS are the namespaces no import is written to.
	refusedNS map[string]bool
}

// outcome is what the controller keeps for one service.
type outcome struct {
	slices  []string // namespace/name, sorted once the reconcile has written
	service string   // the derived Service's namespace/name ("": none)
	merged  *clusterset.Import
	// failed: a write failed, so what it holds is not known to be all it
	// wants; nothing of it is deleted until a reconcile succeeds.
	failed bool
	// clusters are the source clusters whose shares it holds (the caps).
	clusters []string
	// wrote: the sync wrote something (the damping counts it).
	wrote bool
	// notes are what the sync left out, reported after it.
	notes notes
}

func (o *outcome) addSlice(s *discoveryv1.EndpointSlice) {
	o.slices = append(o.slices, s.Namespace+"/"+s.Name)
}

// hasSlice says whether o holds the slice ns/name (o.slices sorted).
func (o *outcome) hasSlice(ns, name string) bool {
	_, ok := slices.BinarySearch(o.slices, ns+"/"+name)
	return ok
}

// counts are what o adds to the controller's totals of slices and conflicts.
func (o *outcome) counts() (slices, conflicts int) {
	if o.merged != nil && o.merged.Conflict() {
		conflicts = 1
	}
	return len(o.slices), conflicts
}

// New returns a controller over records, which sources feed (one per
// cluster, the local one included).
func New(records *store.Store, sources []Source, client kubernetes.Interface, dyn dynamic.Interface, disco discovery.DiscoveryInterface, cfg Config, m *Metrics) *Controller {
	if cfg.Interval <= 0 {
		cfg.Interval = 100 * time.Millisecond
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 30 * time.Second
	}
	if cfg.CRDPoll <= 0 {
		cfg.CRDPoll = 10 * time.Second
	}
	if cfg.StatePoll <= 0 {
		cfg.StatePoll = time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.FirstLists <= 0 {
		cfg.FirstLists = 5 * time.Second
	}
	if cfg.MaxImportsPerNamespace == 0 {
		cfg.MaxImportsPerNamespace = 1000
	}
	if cfg.MaxImportsPerCluster == 0 {
		cfg.MaxImportsPerCluster = 20000
	}
	if cfg.RefusedNamespaces == nil {
		cfg.RefusedNamespaces = DefaultRefusedNamespaces
	}
	if cfg.Damp == 0 {
		cfg.Damp = time.Second
	}
	if cfg.DampMax <= 0 {
		cfg.DampMax = 30 * time.Second
	}
	cfg.DampMax = max(cfg.DampMax, cfg.Damp)
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = time.Minute
	}
	c := &Controller{cfg: cfg, records: records, sources: sources, client: client, dyn: dyn, disco: disco, metrics: m,
		kick: make(chan struct{}, 1), ready: make(chan struct{}), dirty: map[clusterset.Key]bool{}, dirtyNS: map[string]bool{}, all: true,
		done: map[clusterset.Key]*outcome{}, perNS: map[string]int{}, perCluster: map[string]int{}, refused: map[clusterset.Key]bool{},
		said: map[clusterset.Key]notes{}, damp: map[clusterset.Key]*damping{}, notBefore: map[clusterset.Key]time.Time{},
		headless: map[clusterset.Key]time.Time{}, refusedNS: map[string]bool{},
		retry: workqueue.NewTypedItemExponentialFailureRateLimiter[clusterset.Key](cfg.Interval, cfg.RetryMax),
		later: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[clusterset.Key]{Name: "mcs-controller"})}
	for _, ns := range cfg.RefusedNamespaces {
		c.refusedNS[ns] = true
	}
	records.Subscribe(func([]store.Change) { c.Kick() })
	m.sources.Store(&sources)
	return c
}

// Kick asks for a reconcile soon.
func (c *Controller) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run starts the informers of the local objects and reconciles until ctx is
// done. The ServiceImport CRD is looked for until it is served.
func (c *Controller) Run(ctx context.Context) {
	c.started = time.Now()
	// The services that waited (backoff, damping) are marked when due.
	go func() {
		<-ctx.Done()
		c.later.ShutDown()
	}()
	go func() {
		for {
			k, shutdown := c.later.Get()
			if shutdown {
				return
			}
			c.markDirty(k, false)
			c.later.Done(k)
			c.Kick()
		}
	}()
	managed := labels.Set{discoveryv1.LabelManagedBy: clusterset.ManagedBy}.String()
	derived := labels.Set{clusterset.LabelManagedBy: clusterset.ManagedBy}.String()
	nsf := informers.NewSharedInformerFactory(c.client, 0)
	svf := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = derived }))
	slf := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = managed }))
	var crdsFound bool
	nsInf := nsf.Core().V1().Namespaces().Informer()
	svInf := svf.Core().V1().Services().Informer()
	slInf := slf.Discovery().V1().EndpointSlices().Informer()
	// Of a Namespace the controller reads only whether it exists.
	// Synced once the handlers heard the initial list too, not only the
	// store: a first reconcile before them would be followed by a second,
	// near-full one for their Adds.
	nsReg, _ := nsInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: c.namespaceChanged, DeleteFunc: c.namespaceChanged})
	svReg, _ := svInf.AddEventHandler(c.handler(byServiceLabel))
	slReg, _ := slInf.AddEventHandler(c.handler(byServiceLabel))
	byService := cache.Indexers{indexService: func(o any) ([]string, error) {
		k, ok := byServiceLabel(o)
		if !ok {
			return nil, nil
		}
		return []string{k.String()}, nil
	}}
	_ = slInf.AddIndexers(byService)
	_ = svInf.AddIndexers(byService)
	c.namespaces, c.services, c.slices = nsInf.GetIndexer(), svInf.GetIndexer(), slInf.GetIndexer()
	c.synced = []cache.InformerSynced{nsReg.HasSynced, svReg.HasSynced, slReg.HasSynced}
	nsf.Start(ctx.Done())
	svf.Start(ctx.Done())
	slf.Start(ctx.Done())

	// The MCS CRDs: looked for until served.
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if crdsFound {
			return
		}
		imp, found, err := mcsapi.Find(c.disco, mcsapi.ServiceImports)
		if err != nil || !found {
			c.logOnce(fmt.Errorf("the ServiceImport CRD is not served (found %v, %v): no ServiceImports until it is", found, err))
			return
		}
		exp, found, err := mcsapi.Find(c.disco, mcsapi.ServiceExports)
		if err != nil || !found {
			c.logOnce(fmt.Errorf("the ServiceExport CRD is not served (found %v, %v)", found, err))
			return
		}
		f := dynamicinformer.NewDynamicSharedInformerFactory(c.dyn, 0)
		im, ex := f.ForResource(imp), f.ForResource(exp)
		imReg, _ := im.Informer().AddEventHandler(c.handler(byName))
		exReg, _ := ex.Informer().AddEventHandler(c.handler(byName))
		f.Start(ctx.Done())
		c.importsGVR, c.exportsGVR = imp, exp
		c.imports, c.exports = im.Lister(), ex.Lister()
		c.synced = append(c.synced, imReg.HasSynced, exReg.HasSynced)
		crdsFound = true
		close(c.ready)
		klog.Infof("mcs-controller: writing ServiceImports (%s)", imp.GroupVersion())
		c.Kick()
	}, c.cfg.CRDPoll)
}

// waitFirstLists waits until every cluster has listed once, at most
// Config.FirstLists.
func (c *Controller) waitFirstLists(ctx context.Context) {
	cx, cancel := context.WithTimeout(ctx, c.cfg.FirstLists)
	defer cancel()
	_ = wait.PollUntilContextCancel(cx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		for _, s := range c.sources {
			if !s.HasSynced() {
				return false, nil
			}
		}
		return true, nil
	})
}

// RunLoop reconciles on every kick (after Interval, so that a burst of
// changes is written once) and every Resync, until ctx is done. Run must
// have been started. A failed write never holds the loop back: only its
// service waits (Config.RetryMax).
func (c *Controller) RunLoop(ctx context.Context) {
	resync := time.NewTicker(c.cfg.Resync)
	defer resync.Stop()
	poll := time.NewTicker(c.cfg.StatePoll)
	defer poll.Stop()
	select { // Run sets the informers first
	case <-ctx.Done():
		return
	case <-c.ready:
	}
	// An informer that syncs an empty list sends no event: the first
	// reconcile follows the sync, not a kick.
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return
	}
	c.waitFirstLists(ctx)
	c.Kick()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-resync.C:
			c.markDirty(clusterset.Key{}, true)
		case <-poll.C:
			if _, _, st := c.clusterState(time.Now()); c.seenState.Load() == nil || *c.seenState.Load() == st {
				continue
			}
		}
		select { // let the burst settle
		case <-ctx.Done():
			return
		case <-time.After(c.cfg.Interval):
		}
		// A service whose writes failed is retried after its own backoff
		// (Reconcile schedules it): the others do not wait for it.
		c.logOnce(c.Reconcile(ctx))
	}
}

// indexService indexes the EndpointSlices by the service they carry.
const indexService = "service"

// handler marks the service of each changed object to be reconciled (every
// service when key is nil or cannot tell) and kicks.
func (c *Controller) handler(key func(any) (clusterset.Key, bool)) cache.ResourceEventHandler {
	mark := func(o any) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		var k clusterset.Key
		ok := key != nil
		if ok {
			k, ok = key(o)
		}
		c.markDirty(k, !ok)
		c.Kick()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    mark,
		UpdateFunc: func(_, o any) { mark(o) },
		DeleteFunc: mark,
	}
}

// namespaceChanged marks the services of a namespace created or deleted.
func (c *Controller) namespaceChanged(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	m, err := meta.Accessor(o)
	c.dirtyMu.Lock()
	if err != nil {
		c.all = true
	} else {
		c.dirtyNS[m.GetName()] = true
	}
	c.dirtyMu.Unlock()
	c.Kick()
}

func (c *Controller) markDirty(k clusterset.Key, all bool) {
	c.dirtyMu.Lock()
	defer c.dirtyMu.Unlock()
	if all {
		c.all = true
		return
	}
	c.dirty[k] = true
}

// takeDirty returns the services and namespaces marked since the last
// call, or all.
func (c *Controller) takeDirty() (map[clusterset.Key]bool, map[string]bool, bool) {
	c.dirtyMu.Lock()
	defer c.dirtyMu.Unlock()
	d, ns, all := c.dirty, c.dirtyNS, c.all
	c.dirty, c.dirtyNS, c.all = map[clusterset.Key]bool{}, map[string]bool{}, false
	return d, ns, all
}

// byName is the service of a ServiceImport or ServiceExport.
func byName(o any) (clusterset.Key, bool) {
	m, err := meta.Accessor(o)
	if err != nil {
		return clusterset.Key{}, false
	}
	return clusterset.Key{Namespace: m.GetNamespace(), Name: m.GetName()}, true
}

// byServiceLabel is the service of an EndpointSlice or derived Service the
// controller wrote.
func byServiceLabel(o any) (clusterset.Key, bool) {
	m, err := meta.Accessor(o)
	if err != nil {
		return clusterset.Key{}, false
	}
	name, ok := m.GetLabels()[mcsv1beta1.LabelServiceName]
	return clusterset.Key{Namespace: m.GetNamespace(), Name: name}, ok
}

// logOnce logs an error when it differs from the last one, and the recovery.
func (c *Controller) logOnce(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err == nil && c.lastErr != nil:
		klog.Infof("mcs-controller: writing again after: %v", c.lastErr)
	case err != nil && (c.lastErr == nil || c.lastErr.Error() != err.Error()):
		klog.Warningf("mcs-controller: %v", err)
	}
	c.lastErr = err
}

// clusterState says, for a source cluster, whether the store holds its
// current share (current), whether it has not answered since the start so
// that its share is what the local API server holds (stale), or whether its
// share is gone (neither: a peer past its expiry, or a cluster no longer
// configured).
func (c *Controller) clusterState(now time.Time) (current, stale func(string) bool, sig string) {
	cur, st := map[string]bool{}, map[string]bool{}
	var b strings.Builder
	local := c.cfg.LocalCluster
	for _, s := range c.sources {
		last := s.LastContact()
		if last.IsZero() {
			last = c.started
		}
		// The expiry is a peer's: the local cluster's API server is the one
		// written to, and while it does not answer nothing is written.
		b.WriteString(s.Cluster())
		switch {
		case c.cfg.Expire > 0 && s.Cluster() != local && now.Sub(last) > c.cfg.Expire:
			b.WriteString("=gone,")
		case s.HasSynced():
			cur[s.Cluster()] = true
			b.WriteString("=current,")
		default:
			st[s.Cluster()] = true
			b.WriteString("=stale,")
		}
	}
	return func(cl string) bool { return cur[cl] }, func(cl string) bool { return st[cl] }, b.String()
}

// Reconcile writes what the local cluster should hold, once: for the
// services whose records or local objects changed since the last reconcile,
// or for every service when the clusters' states changed, on the periodic
// resync and at the first.
func (c *Controller) Reconcile(ctx context.Context) error {
	select {
	case <-c.ready:
	default:
		return nil // the CRDs are not served yet
	}
	for _, s := range c.synced {
		if !s() {
			return nil // the write loop waits for the sync
		}
	}
	c.reconciling.Lock()
	defer c.reconciling.Unlock()
	start := time.Now()
	current, stale, state := c.clusterState(start)
	dirty, dirtyNS, all := c.takeDirty()
	if seen := c.seenState.Load(); seen == nil || *seen != state {
		all = true
	}

	// The current clusters' records by service; a service whose records
	// are not all the same pointers as last time is dirty.
	pods := c.records.Pods("")
	seen := make(map[*store.Pod]struct{}, len(pods))
	groups := map[clusterset.Key][]*store.Pod{}
	for _, p := range pods {
		if !current(p.Cluster) {
			continue
		}
		seen[p] = struct{}{}
		for _, e := range p.Exports {
			k := clusterset.Key{Namespace: e.Namespace, Name: e.Name}
			groups[k] = append(groups[k], p)
		}
	}
	for k, g := range groups {
		if dirty[k] || len(g) != c.lastCount[k] {
			dirty[k] = true
			continue
		}
		for _, p := range g {
			if _, ok := c.lastPods[p]; !ok {
				dirty[k] = true
				break
			}
		}
	}
	for k := range c.lastCount {
		if _, ok := groups[k]; !ok {
			dirty[k] = true
		}
	}
	if len(dirtyNS) > 0 && !all {
		for k := range groups {
			if dirtyNS[k.Namespace] {
				dirty[k] = true
			}
		}
		for k := range c.done {
			if dirtyNS[k.Namespace] {
				dirty[k] = true
			}
		}
	}

	// The shares of the clusters that have not answered since the start,
	// from the slices the controller wrote before.
	var existing []*discoveryv1.EndpointSlice
	addSlices := func(objs []any) {
		for _, o := range objs {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok {
				existing = append(existing, s)
			}
		}
	}
	if all {
		addSlices(c.slices.List())
	} else {
		for k := range dirty {
			objs, _ := c.slices.ByIndex(indexService, k.String())
			addSlices(objs)
		}
	}
	keep := keptShares(existing, stale)

	if all {
		for k := range groups {
			dirty[k] = true
		}
		for k := range keep {
			dirty[k] = true
		}
		for k := range c.done {
			dirty[k] = true
		}
	}
	now := time.Now()
	if all {
		c.pruneDamping(now)
	}
	// A service that waits (damping, the backoff of a failed write) is
	// left as it is until due: later marks it then.
	for k := range dirty {
		if t, ok := c.notBefore[k]; ok && now.Before(t) {
			delete(dirty, k)
			c.later.AddAfter(k, t.Sub(now))
			c.metrics.Deferred.Inc()
		}
	}
	jobs, said := c.plan(dirty, groups, keep, now)
	errs := make([]error, len(jobs))
	workqueue.ParallelizeUntil(ctx, c.cfg.Workers, len(jobs), func(i int) {
		j := jobs[i]
		if err := c.syncService(ctx, j.k, j.im, j.cur, j.out, j.derived); err != nil {
			errs[i] = fmt.Errorf("service %s: %w", j.k, err)
			j.out.failed = true
		}
	})
	failed := map[clusterset.Key]error{}
	for i, j := range jobs {
		if errs[i] != nil {
			failed[j.k] = errs[i]
		}
	}
	if ctx.Err() != nil {
		// Stopped before every job ran: what did not run is not known to be written.
		for _, j := range jobs {
			j.out.failed = true
		}
		errs = append(errs, ctx.Err())
	}
	for k := range dirty {
		if o := c.done[k]; o != nil {
			slices.Sort(o.slices)
			s, cf := o.counts()
			c.nslices, c.nconflicts = c.nslices+s, c.nconflicts+cf
		}
	}
	fail := func(k clusterset.Key, err error) {
		failed[k] = errors.Join(failed[k], err)
		errs = append(errs, fmt.Errorf("service %s: %w", k, err))
	}
	deleted := c.deleteUnwanted(ctx, dirty, all, fail)
	c.syncConflicts(ctx, dirty, all, fail)

	// What was left out is reported; each service's writes are paced, and
	// a failed one is tried again after its own backoff.
	for _, j := range jobs {
		said[j.k] = j.out.notes // the plan's and the sync's
	}
	for k, n := range said {
		c.report(k, n)
	}
	for _, j := range jobs {
		if j.out.wrote {
			deleted[j.k] = true
		}
	}
	for k := range deleted {
		if t := c.wrote(k, now); t.After(c.notBefore[k]) {
			c.notBefore[k] = t
		}
	}
	for k := range dirty {
		if failed[k] == nil {
			c.retry.Forget(k)
		}
	}
	for k := range failed {
		d := c.retry.When(k)
		if t := now.Add(d); t.After(c.notBefore[k]) {
			c.notBefore[k] = t
		}
		c.later.AddAfter(k, d)
	}

	c.lastPods = seen
	c.seenState.Store(&state)
	c.lastCount = make(map[clusterset.Key]int, len(groups))
	for k, g := range groups {
		c.lastCount[k] = len(g)
	}
	c.logCaps()
	c.metrics.observe(len(c.done), c.nslices, c.nconflicts, len(c.refused), time.Since(start))
	return errors.Join(errs...)
}

// derivedMode is what a sync does with a service's derived Service.
type derivedMode int

const (
	derivedNone  derivedMode = iota // none (deleted if there is one)
	derivedApply                    // applied, its ClusterIPs the import's
	derivedKeep                     // kept as it is: a ClusterSetIP service turned Headless, for DampMax
)

// job is the sync of one service: what it should be.
type job struct {
	k       clusterset.Key
	im      *clusterset.Import
	cur     map[string]*share
	out     *outcome
	derived derivedMode
}

// plan decides what each dirty service should be, and returns the syncs to
// run and the notes of every dirty service (those of the syncs are added
// by them). The services imported before go first, then the new ones by
// the age of their oldest export and by name: the caps never refuse a
// service already imported, and admit the oldest new ones.
func (c *Controller) plan(dirty map[clusterset.Key]bool, groups map[clusterset.Key][]*store.Pod,
	keep map[clusterset.Key]map[string]*kept, now time.Time) ([]job, map[clusterset.Key]notes) {
	type cand struct {
		k      clusterset.Key
		old    *outcome
		stored *unstructured.Unstructured
		cur    map[string]*share
		oldest time.Time
	}
	said := map[clusterset.Key]notes{}
	before := map[string]int{}
	var cands []cand
	for k := range dirty {
		said[k] = nil
		old := c.done[k]
		if old != nil {
			s, cf := old.counts()
			c.nslices, c.nconflicts = c.nslices-s, c.nconflicts-cf
			c.count(k, old, -1, before)
			delete(c.done, k)
		}
		delete(c.refused, k)
		cur := shares(groups[k])[k]
		if c.refusedNS[k.Namespace] {
			if len(cur) > 0 {
				n := notes{}
				n.add("namespace", ReasonNamespace, "namespace %s is one no import is written to", k.Namespace)
				said[k] = n
			}
			continue
		}
		if _, ok, _ := c.namespaces.GetByKey(k.Namespace); !ok {
			continue // never create a namespace: no import where it does not exist
		}
		cd := cand{k: k, old: old, cur: cur, stored: c.storedImport(k)}
		for _, s := range cur {
			if t := s.entry.Exported(); cd.oldest.IsZero() || t.Before(cd.oldest) {
				cd.oldest = t
			}
		}
		cands = append(cands, cd)
	}
	slices.SortFunc(cands, func(a, b cand) int {
		ea, eb := a.old != nil || a.stored != nil, b.old != nil || b.stored != nil
		if ea != eb {
			if ea {
				return -1
			}
			return 1
		}
		return cmp.Or(a.oldest.Compare(b.oldest), cmp.Compare(a.k.String(), b.k.String()))
	})

	var jobs []job
	for _, cd := range cands {
		k := cd.k
		var n notes
		out := &outcome{}
		existing := cd.old != nil || cd.stored != nil
		hadShare := func(cl string) bool {
			if cd.old != nil {
				return slices.Contains(cd.old.clusters, cl)
			}
			return cd.stored != nil && slices.Contains(statusClusters(cd.stored), cl)
		}
		if !existing && len(cd.cur) > 0 && capped(c.cfg.MaxImportsPerNamespace, c.perNS[k.Namespace]) {
			n.add("cap", ReasonNamespaceCap, "not imported: namespace %s has %d imports, its cap (the ones imported first are kept)",
				k.Namespace, c.perNS[k.Namespace])
			said[k] = n
			c.refused[k] = true
			continue
		}
		var exports []clusterset.Export
		cur := map[string]*share{}
		var over []string
		usable := false
		for _, cl := range slices.Sorted(maps.Keys(cd.cur)) {
			if !hadShare(cl) && capped(c.cfg.MaxImportsPerCluster, c.perCluster[cl]) {
				over = append(over, cl)
				continue
			}
			s := cd.cur[cl]
			cur[cl] = s
			exports = append(exports, toExport(cl, &s.entry))
			out.clusters = append(out.clusters, cl)
			if addressNotes(&n, cl, s.endpoints) {
				usable = true
			}
		}
		if len(over) > 0 {
			n.add("cap", ReasonClusterCap, "the share of %s not imported: each takes part in %d imports, its cap (the ones imported first are kept)",
				clusterset.ClusterList(over), c.cfg.MaxImportsPerCluster)
			c.refused[k] = true
		}
		for cl, kc := range keep[k] {
			for _, s := range kc.slices {
				out.addSlice(s)
				if len(s.Endpoints) > 0 {
					usable = true
				}
			}
			out.clusters = append(out.clusters, cl)
			if kc.entry.Name != "" {
				exports = append(exports, toExport(cl, &kc.entry))
			}
		}
		said[k] = n
		if len(exports) == 0 {
			if len(out.slices) > 0 {
				// Only slices without a readable entry: keep them and the import as they are.
				out.service = k.Namespace + "/" + clusterset.DerivedServiceName(k.Name)
				c.count(k, out, 1, before)
				c.done[k] = out
			}
			continue
		}
		im := clusterset.Merge(exports)
		out.merged = &im
		out.notes = n
		c.count(k, out, 1, before)
		c.done[k] = out

		// A derived Service (a ClusterSetIP) once some cluster has an
		// endpoint address: a service of Pods that never got one makes
		// none. Once made, it stays while the service is a ClusterSetIP
		// one, and for DampMax after it turns Headless.
		had := cd.old != nil && cd.old.service != "" || c.derivedExists(k)
		mode := derivedNone
		switch {
		case im.Spec.Type == mcsv1beta1.ClusterSetIP:
			delete(c.headless, k)
			if usable || had {
				mode = derivedApply
			} else {
				out.notes.add("address", reasonNoAddress, "no endpoint address in any cluster yet: no derived Service, no ClusterSetIP")
			}
		case had && c.cfg.Damp > 0:
			since, ok := c.headless[k]
			if !ok {
				since = now
				c.headless[k] = now
			}
			if until := since.Add(c.cfg.DampMax); now.Before(until) {
				mode = derivedKeep
				out.service = k.Namespace + "/" + clusterset.DerivedServiceName(k.Name)
				if cd.old != nil && cd.old.service != "" {
					out.service = cd.old.service
				}
				c.later.AddAfter(k, until.Sub(now)) // deleted then if still Headless
			} else {
				delete(c.headless, k)
			}
		default:
			delete(c.headless, k)
		}
		jobs = append(jobs, job{k, &im, cur, out, mode})
	}
	// A namespace or cluster with fewer services than before has room: the
	// services refused for a cap are looked at again.
	for key, n := range before {
		ns, isNS := strings.CutPrefix(key, "ns/")
		if isNS && c.perNS[ns] < n || !isNS && c.perCluster[strings.TrimPrefix(key, "cluster/")] < n {
			for k := range c.refused {
				c.markDirty(k, false)
			}
			c.Kick()
			break
		}
	}
	return jobs, said
}

// capped says whether a count has reached its cap (negative: no cap).
func capped(limit, n int) bool { return limit >= 0 && n >= limit }

// count adds (by 1) or takes away (by -1) o's service from the counts the
// caps read, noting in before each count as it was before the plan.
func (c *Controller) count(k clusterset.Key, o *outcome, by int, before map[string]int) {
	add := func(m map[string]int, key, name string) {
		if _, ok := before[key]; !ok {
			before[key] = m[name]
		}
		if m[name] += by; m[name] <= 0 {
			delete(m, name)
		}
	}
	add(c.perNS, "ns/"+k.Namespace, k.Namespace)
	for _, cl := range o.clusters {
		add(c.perCluster, "cluster/"+cl, cl)
	}
}

// heldDerived is the derived Service of k the informer holds, when it has
// ClusterIPs (nil: none).
func (c *Controller) heldDerived(k clusterset.Key) *corev1.Service {
	o, ok, _ := c.services.GetByKey(k.Namespace + "/" + clusterset.DerivedServiceName(k.Name))
	svc, _ := o.(*corev1.Service)
	if !ok || svc == nil || svc.Labels[mcsv1beta1.LabelServiceName] != k.Name || len(svc.Spec.ClusterIPs) == 0 || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil
	}
	return svc
}

// derivedExists says whether a derived Service of k is held (made by this
// controller, perhaps before a restart).
func (c *Controller) derivedExists(k clusterset.Key) bool {
	objs, _ := c.services.ByIndex(indexService, k.String())
	return len(objs) > 0
}

// statusClusters are the clusters a stored ServiceImport names.
func statusClusters(u *unstructured.Unstructured) []string {
	list, _, _ := unstructured.NestedSlice(u.Object, "status", "clusters")
	var out []string
	for _, c := range list {
		if m, ok := c.(map[string]any); ok {
			if s, ok := m["cluster"].(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// syncService writes one service's ServiceImport, derived Service (as mode
// says) and the slices of the clusters whose share is current. What it
// leaves out goes to out.notes.
func (c *Controller) syncService(ctx context.Context, k clusterset.Key, im *clusterset.Import, cur map[string]*share, out *outcome, mode derivedMode) error {
	// A derived Service held from before (a service turned back from
	// Headless) gives the import its IPs at once, not after a write without.
	var ips []string
	var families []corev1.IPFamily
	if mode == derivedApply {
		if svc := c.heldDerived(k); svc != nil && derivedProblem(clusterset.DerivedService(k, im, metav1.OwnerReference{})) == "" {
			ips, families = svc.Spec.ClusterIPs, svc.Spec.IPFamilies
		}
	}
	si, err := c.applyImport(ctx, k, im, ips, families, out)
	if err != nil {
		return err
	}
	owner := metav1.OwnerReference{APIVersion: c.importsGVR.GroupVersion().String(), Kind: "ServiceImport", Name: k.Name, UID: si.GetUID()}
	derived := ""
	if mode == derivedApply {
		want := clusterset.DerivedService(k, im, owner)
		if p := derivedProblem(want); p != "" {
			out.notes.add("service", ReasonInvalidService, "no derived Service, so no ClusterSetIP (the API server would refuse it): %s", p)
		} else {
			svc, err := c.applyDerived(ctx, k, want, out)
			if err != nil {
				return err
			}
			if svc != nil {
				derived = svc.Name
				out.service = k.Namespace + "/" + derived
				if len(svc.Spec.ClusterIPs) > 0 && svc.Spec.ClusterIP != corev1.ClusterIPNone {
					if _, err := c.applyImport(ctx, k, im, svc.Spec.ClusterIPs, svc.Spec.IPFamilies, out); err != nil {
						return err
					}
				}
			}
		}
	}
	var errs []error
	for cl, s := range cur {
		entry, _ := json.Marshal(s.entry)
		for _, sl := range clusterset.Slices(k, cl, derived, im, s.endpoints, owner) {
			sl.Annotations = map[string]string{AnnotationExport: string(entry)}
			taken, err := c.applySlice(ctx, sl, out)
			if taken != "" {
				out.notes.add("slice/"+sl.Name, ReasonNameTaken, "cluster %s: EndpointSlice %s not written: %s", cl, sl.Name, taken)
				c.metrics.Foreign.Inc()
				continue
			}
			out.addSlice(sl)
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// applied returns the hash of obj, and whether the stored object's
// annotations (nil: none stored) already carry it.
func applied(stored map[string]string, obj any) (string, bool) {
	b, _ := json.Marshal(obj)
	h := fnv.New64a()
	h.Write(b)
	sum := hex.EncodeToString(h.Sum(nil))
	return sum, stored[AnnotationApplied] == sum
}

// applyImport applies the ServiceImport of k (with ips, when known) and its
// status, unless the stored one already says the same. It returns the
// ServiceImport as stored.
func (c *Controller) applyImport(ctx context.Context, k clusterset.Key, im *clusterset.Import, ips []string, families []corev1.IPFamily, o *outcome) (*unstructured.Unstructured, error) {
	spec := im.Spec
	spec.IPs = ips
	spec.IPFamilies = families
	var cur map[string]string
	var stored *unstructured.Unstructured
	if o, err := c.imports.ByNamespace(k.Namespace).Get(k.Name); err == nil {
		if u, ok := o.(*unstructured.Unstructured); ok {
			cur, stored = u.GetAnnotations(), u
			if u.GetLabels()[clusterset.LabelManagedBy] != clusterset.ManagedBy {
				c.metrics.Foreign.Inc()
				return nil, fmt.Errorf("a ServiceImport %s exists that this controller did not create: left alone", k)
			}
		}
	}
	if spec.Type == mcsv1beta1.ClusterSetIP && ips == nil && stored != nil {
		// Until the derived Service has its IPs, keep what is stored.
		if old, _, _ := unstructured.NestedStringSlice(stored.Object, "spec", "ips"); len(old) > 0 {
			return stored, nil
		}
	}
	obj := &mcsv1beta1.ServiceImport{
		TypeMeta: metav1.TypeMeta{APIVersion: c.importsGVR.GroupVersion().String(), Kind: "ServiceImport"},
		ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name,
			Labels:      merge(im.Labels, map[string]string{clusterset.LabelManagedBy: clusterset.ManagedBy}),
			Annotations: merge(im.Annotations, nil)},
		Spec: spec,
	}
	for _, cl := range im.Clusters {
		obj.Status.Clusters = append(obj.Status.Clusters, mcsv1beta1.ClusterStatus{Cluster: cl})
	}
	sum, same := applied(cur, obj)
	if same {
		return stored, nil
	}
	// A new ClusterSetIP import is applied for its UID (the derived
	// Service's owner), then again with the derived Service's IPs: the
	// first apply leaves out the status and the hash, which the second
	// writes.
	first := spec.Type == mcsv1beta1.ClusterSetIP && ips == nil && stored == nil
	if !first {
		obj.Annotations[AnnotationApplied] = sum
	}
	u, err := toUnstructured(obj)
	if err != nil {
		return nil, err
	}
	status := u.Object["status"]
	delete(u.Object, "status")
	ri := c.dyn.Resource(c.importsGVR).Namespace(k.Namespace)
	o.wrote = true
	out, err := ri.Apply(ctx, k.Name, u, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	c.metrics.write("serviceimport", err)
	if err != nil || first {
		return out, err
	}
	st := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": u.GetAPIVersion(), "kind": "ServiceImport",
		"metadata": map[string]any{"namespace": k.Namespace, "name": k.Name},
		"status":   status,
	}}
	_, err = ri.ApplyStatus(ctx, k.Name, st, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	c.metrics.write("serviceimport_status", err)
	return out, err
}

// applyDerived applies want, the derived Service of a ClusterSetIP import,
// and returns it as stored (with the ClusterIPs the API server allocated).
// A Service of its name that is not this service's derived Service (not
// made by this controller, or for another service) is left alone: nil,
// noted.
func (c *Controller) applyDerived(ctx context.Context, k clusterset.Key, want *corev1.Service, o *outcome) (*corev1.Service, error) {
	var cur *corev1.Service
	if obj, ok, _ := c.services.GetByKey(k.Namespace + "/" + want.Name); ok {
		cur, _ = obj.(*corev1.Service)
	} else if s, err := c.client.CoreV1().Services(k.Namespace).Get(ctx, want.Name, metav1.GetOptions{}); err == nil {
		cur = s
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	if cur != nil && (cur.Labels[clusterset.LabelManagedBy] != clusterset.ManagedBy || cur.Labels[mcsv1beta1.LabelServiceName] != k.Name) {
		c.metrics.Foreign.Inc()
		o.notes.add("service", ReasonNameTaken, "no derived Service, so no ClusterSetIP: a Service %s exists that this controller did not make for this service (labels %v): left alone",
			want.Name, cur.Labels)
		return nil, nil
	}
	var stored map[string]string
	if cur != nil {
		stored = cur.Annotations
	}
	sum, same := applied(stored, want)
	if same {
		return cur, nil
	}
	want.Annotations = map[string]string{AnnotationApplied: sum}
	body, err := json.Marshal(want)
	if err != nil {
		return nil, err
	}
	o.wrote = true
	out, err := c.client.CoreV1().Services(k.Namespace).Patch(ctx, want.Name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: FieldManager, Force: ptrTrue()})
	c.metrics.write("service", err)
	return out, err
}

// applySlice applies want unless the stored slice already says the same.
// A slice of its name that is not this service's and cluster's (not made
// by this controller, or for another service or cluster) is left alone:
// taken says why.
func (c *Controller) applySlice(ctx context.Context, want *discoveryv1.EndpointSlice, o *outcome) (taken string, err error) {
	var cur *discoveryv1.EndpointSlice
	if obj, ok, _ := c.slices.GetByKey(want.Namespace + "/" + want.Name); ok {
		cur, _ = obj.(*discoveryv1.EndpointSlice)
	} else if s, err := c.client.DiscoveryV1().EndpointSlices(want.Namespace).Get(ctx, want.Name, metav1.GetOptions{}); err == nil {
		cur = s
	} else if !apierrors.IsNotFound(err) {
		return "", err
	}
	var stored map[string]string
	if cur != nil {
		for _, l := range []string{discoveryv1.LabelManagedBy, mcsv1beta1.LabelServiceName, mcsv1beta1.LabelSourceCluster} {
			if cur.Labels[l] != want.Labels[l] {
				return fmt.Sprintf("a slice of that name exists that this controller did not make for this service and cluster (%s=%q)", l, cur.Labels[l]), nil
			}
		}
		stored = cur.Annotations
	}
	sum, same := applied(stored, want)
	if same {
		return "", nil
	}
	want.Annotations[AnnotationApplied] = sum
	body, err := json.Marshal(want)
	if err != nil {
		return "", err
	}
	o.wrote = true
	_, err = c.client.DiscoveryV1().EndpointSlices(want.Namespace).Patch(ctx, want.Name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: FieldManager, Force: ptrTrue()})
	c.metrics.write("endpointslice", err)
	return "", err
}

// deleteUnwanted deletes the objects this controller made for the services
// in keys (every service when all is set) that nothing wants any more, and
// returns the services it deleted something of. A failed delete goes to fail.
func (c *Controller) deleteUnwanted(ctx context.Context, keys map[clusterset.Key]bool, all bool, fail func(clusterset.Key, error)) map[clusterset.Key]bool {
	deleted := map[clusterset.Key]bool{}
	del := func(k clusterset.Key, kind string, err error) {
		if apierrors.IsNotFound(err) {
			err = nil
		}
		c.metrics.write(kind+"_delete", err)
		deleted[k] = true
		if err != nil {
			fail(k, err)
		}
	}
	var sls, svcs []any
	if all {
		sls, svcs = c.slices.List(), c.services.List()
	} else {
		for k := range keys {
			objs, _ := c.slices.ByIndex(indexService, k.String())
			sls = append(sls, objs...)
			objs, _ = c.services.ByIndex(indexService, k.String())
			svcs = append(svcs, objs...)
		}
	}
	for _, o := range sls {
		s, ok := o.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		k, _ := byServiceLabel(s)
		if d := c.done[k]; d == nil || !d.failed && !d.hasSlice(s.Namespace, s.Name) {
			del(k, "endpointslice", c.client.DiscoveryV1().EndpointSlices(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}))
		}
	}
	for _, o := range svcs {
		s, ok := o.(*corev1.Service)
		if !ok {
			continue
		}
		k, _ := byServiceLabel(s)
		if d := c.done[k]; d == nil || !d.failed && d.service != s.Namespace+"/"+s.Name {
			del(k, "service", c.client.CoreV1().Services(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}))
		}
	}
	var objs []runtime.Object
	if all {
		var err error
		if objs, err = c.imports.List(labels.Everything()); err != nil {
			fail(clusterset.Key{}, err)
			return deleted
		}
	} else {
		for k := range keys {
			if o, err := c.imports.ByNamespace(k.Namespace).Get(k.Name); err == nil {
				objs = append(objs, o)
			}
		}
	}
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok || u.GetLabels()[clusterset.LabelManagedBy] != clusterset.ManagedBy {
			continue // not ours
		}
		if k := (clusterset.Key{Namespace: u.GetNamespace(), Name: u.GetName()}); c.done[k] == nil {
			del(k, "serviceimport", c.dyn.Resource(c.importsGVR).Namespace(u.GetNamespace()).Delete(ctx, u.GetName(), metav1.DeleteOptions{}))
		}
	}
	return deleted
}

// syncConflicts sets the Conflict condition of the local ServiceExports of
// the services in keys (every one when all is set), as the whole clusterset
// shows it, and records an Event when the exports come to conflict. The
// annotator sets Valid and Ready; each condition has one writer. A failed
// write goes to fail.
func (c *Controller) syncConflicts(ctx context.Context, keys map[clusterset.Key]bool, all bool, fail func(clusterset.Key, error)) {
	var objs []runtime.Object
	if all {
		var err error
		if objs, err = c.exports.List(labels.Everything()); err != nil {
			fail(clusterset.Key{}, err)
			return
		}
	} else {
		for k := range keys {
			if o, err := c.exports.ByNamespace(k.Namespace).Get(k.Name); err == nil {
				objs = append(objs, o)
			}
		}
	}
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var im *clusterset.Import
		k := clusterset.Key{Namespace: u.GetNamespace(), Name: u.GetName()}
		if d := c.done[k]; d != nil {
			im = d.merged
		}
		if im == nil {
			continue // not exported (yet): the annotator's Valid and Ready say why
		}
		status, reason := metav1.ConditionFalse, im.Reason()
		if im.Conflict() {
			status = metav1.ConditionTrue
		}
		have := condition(u, string(mcsv1beta1.ServiceExportConditionConflict))
		if have != nil && have.Status == status && have.Reason == reason && have.Message == im.Message && have.ObservedGeneration == u.GetGeneration() {
			continue
		}
		if status == metav1.ConditionTrue && (have == nil || have.Status != status || have.Reason != reason || have.Message != im.Message) && c.cfg.Recorder != nil {
			c.cfg.Recorder.Event(u, corev1.EventTypeWarning, ReasonConflict, reason+": "+im.Message)
		}
		cond := metav1.Condition{Type: string(mcsv1beta1.ServiceExportConditionConflict), Status: status, Reason: reason,
			Message: im.Message, ObservedGeneration: u.GetGeneration(), LastTransitionTime: metav1.Now()}
		cm, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&cond)
		st := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": u.GetAPIVersion(), "kind": u.GetKind(),
			"metadata": map[string]any{"namespace": u.GetNamespace(), "name": u.GetName()},
			"status":   map[string]any{"conditions": []any{cm}},
		}}
		_, err := c.dyn.Resource(c.exportsGVR).Namespace(u.GetNamespace()).ApplyStatus(ctx, u.GetName(), st,
			metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
		c.metrics.write("serviceexport_status", err)
		if err != nil {
			fail(k, err)
		}
	}
}

func condition(u *unstructured.Unstructured, typ string) *metav1.Condition {
	list, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, o := range list {
		m, ok := o.(map[string]any)
		if !ok || m["type"] != typ {
			continue
		}
		var c metav1.Condition
		if runtime.DefaultUnstructuredConverter.FromUnstructured(m, &c) == nil {
			return &c
		}
	}
	return nil
}

func toUnstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	return u, nil
}

func merge(a, b map[string]string) map[string]string {
	out := make(map[string]string, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func ptrTrue() *bool { t := true; return &t }
