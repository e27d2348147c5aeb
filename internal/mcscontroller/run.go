package mcscontroller

import (
	"context"
	"fmt"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/mcsapi"
)

// Run starts the informers of the local objects, whose events queue their
// services, until ctx is done (then it shuts the queue down). The
// ServiceImport CRD is looked for until it is served.
func (c *Controller) Run(ctx context.Context) {
	c.started = time.Now()
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
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
		// The full sync is queued before ready says the imports are read, so
		// that a sync started once ready takes it.
		c.queue.Add(keyAll)
		close(c.ready)
		klog.Infof("mcs-controller: writing ServiceImports (%s)", imp.GroupVersion())
	}, c.cfg.CRDPoll)
}

// waitFirstLists waits until every cluster has listed once, at most
// Config.FirstLists.
func (c *Controller) waitFirstLists(ctx context.Context) {
	cx, cancel := context.WithTimeout(ctx, c.cfg.FirstLists)
	defer cancel()
	_ = wait.PollUntilContextCancel(cx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		srcs, pending := c.allSources()
		for _, s := range srcs {
			if !s.HasSynced() {
				return false, nil
			}
		}
		return !pending, nil
	})
}

// RunLoop syncs the services queued (after Interval, so that a burst of
// changes is written once), every service every Resync and when a
// cluster's state changes, until ctx is done. Run must have been started.
// A failed write never holds the loop back: only its service waits
// (Config.RetryMax).
func (c *Controller) RunLoop(ctx context.Context) {
	select { // Run sets the informers first
	case <-ctx.Done():
		return
	case <-c.ready:
	}
	// An informer that syncs an empty list sends no event: the first
	// sync follows the sync of the informers, not an event.
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return
	}
	if c.cfg.Relay {
		go c.runLeases(ctx)
		go c.runRelayedLeases(ctx) // hublease.go
	}
	c.waitFirstLists(ctx)
	go wait.UntilWithContext(ctx, func(context.Context) { c.queue.Add(keyAll) }, c.cfg.Resync)
	go wait.UntilWithContext(ctx, func(context.Context) {
		if _, _, _, st := c.clusterState(time.Now()); c.seenState.Load() != nil && *c.seenState.Load() != st {
			c.queue.Add(keyAll)
		}
	}, c.cfg.StatePoll)
	for {
		// Wait for a key, let the burst settle, then sync everything
		// queued by then together (the caps admit new services in order
		// of age across all of them).
		k, shutdown := c.queue.Get()
		if shutdown {
			return
		}
		select {
		case <-ctx.Done():
			c.queue.Done(k)
			return
		case <-time.After(c.cfg.Interval):
		}
		c.logOnce(c.reconcile(ctx, k))
	}
}

// The keys of the queue that are not one service: every service, the
// services whose records changed (the record index holds which,
// recordIndex), every service of a namespace (namespaceKey).
// A service's key always has a namespace and a name.
var (
	keyAll     = clusterset.Key{}
	keyRecords = clusterset.Key{Name: "records"}
)

// namespaceKey is the queue's key of every service of namespace ns.
func namespaceKey(ns string) clusterset.Key { return clusterset.Key{Namespace: ns} }

// indexService indexes the EndpointSlices by the service they carry.
const indexService = "service"

// handler queues the service of each changed object (every service when
// key is nil or cannot tell).
func (c *Controller) handler(key func(any) (clusterset.Key, bool)) cache.ResourceEventHandler {
	mark := func(o any) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		k, ok := clusterset.Key{}, key != nil
		if ok {
			k, ok = key(o)
		}
		if !ok || k.Namespace == "" || k.Name == "" {
			k = keyAll
		}
		c.queue.Add(k)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    mark,
		UpdateFunc: func(_, o any) { mark(o) },
		DeleteFunc: mark,
	}
}

// namespaceChanged queues the services of a namespace created or deleted.
func (c *Controller) namespaceChanged(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	m, err := meta.Accessor(o)
	if err != nil || m.GetName() == "" {
		c.queue.Add(keyAll)
		return
	}
	c.queue.Add(namespaceKey(m.GetName()))
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

// clusterState says, for a source cluster, whether the table holds its
// current share (current: it listed, or its records were restored from the
// snapshot), whether it has not answered since the start so that its slices
// are held as they are (stale), or whether its
// share is gone (neither: a peer past its expiry, or a cluster no longer
// configured); and, in out, how long each peer has been out of contact
// (absent: in contact), for the services' stale policies.
func (c *Controller) clusterState(now time.Time) (current, stale func(string) bool, out map[string]time.Duration, sig string) {
	cur, st := map[string]bool{}, map[string]bool{}
	out = map[string]time.Duration{}
	var b strings.Builder
	local := c.localCluster()
	srcs, pending := c.allSources()
	known := make(map[string]bool, len(srcs))
	for _, s := range srcs {
		known[s.Cluster()] = true
		if d := outOfContact(s, c.started, now); d > 0 && s.Cluster() != local {
			out[s.Cluster()] = d
			b.WriteString("out:")
		}
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
		case s.HasSynced() || c.cfg.Restored[s.Cluster()]:
			cur[s.Cluster()] = true
			b.WriteString("=current,")
		default:
			st[s.Cluster()] = true
			b.WriteString("=stale,")
		}
	}
	// Until every hub listed once, an unknown cluster may be an origin
	// that a hub will list: its slices are kept, as a peer's not heard
	// from since the start (and expire as one).
	keepUnknown := pending && !(c.cfg.Expire > 0 && now.Sub(c.started) > c.cfg.Expire)
	if keepUnknown {
		b.WriteString("hubs-pending")
	}
	return func(cl string) bool { return cur[cl] },
		func(cl string) bool { return st[cl] || (keepUnknown && !known[cl] && cl != local) }, out, b.String()
}

// localCluster is the local cluster's ID.
func (c *Controller) localCluster() string { return c.cfg.LocalCluster }
