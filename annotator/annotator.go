// Package annotator is the controller that writes the export annotation
// (docs/DESIGN.md#the-annotator): for each Service exported in its cluster, by
// the annotation multicluster.kubernetes.io/export: "true" or by an MCS
// ServiceExport, it keeps each selected Pod's export-services annotation and
// exporter label equal to the union of the exported Services that select it,
// removes what it wrote when nothing exports a Pod any more, and sets the
// ServiceExports' status conditions. It shares the wire format with the plugin
// through package annotation, and checks what it writes with the plugin's own
// parser.
//
// Layers: desired.go (what a Pod should carry: pure), slim.go (the
// informers' transforms, ownership), serviceexport.go (discovery, status
// conditions), this file (informers, the work queue, writes). Only the
// leader calls Run; every replica keeps warm informers (Start).
package annotator

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/mcsapi"
)

// Config tunes a Controller; zero values take the defaults.
type Config struct {
	// Cluster, when set, is written into each entry's "cluster" (a reader
	// otherwise defaults it to the cluster it read the Pod from).
	Cluster string
	// SignKey, when set, signs each export annotation into the signature
	// annotation (docs/DESIGN.md#security), over Cluster (then required), the
	// Pod's namespace, name and UID and the value.
	SignKey ed25519.PrivateKey
	// SignEndpoints, with SignKey, also states each exported Pod's
	// addresses, hostname and readiness in a signed endpoint statement
	// (endpoint.go), for relay hubs to pass on.
	SignEndpoints bool
	// Workers reconcile namespaces in parallel (default 2).
	Workers int
	// ServiceExportPoll is how often discovery is asked for the ServiceExport
	// CRD while it is not installed (default 30 s).
	ServiceExportPoll time.Duration
	// ClustersetConflicts says the MCS controller (internal/mcscontroller)
	// sets the Conflict condition from every cluster's exports: the annotator
	// then leaves that condition alone, so that each condition has one writer.
	ClustersetConflicts bool
	// PeerReader, NAMESPACE/NAME of the ServiceAccount that peers read
	// this cluster with, gets a grant in each exporting namespace and the
	// list of them (grants.go). Empty: neither.
	PeerReader string
	// RecordFields makes the Pod informer also keep, on each Pod with the
	// exporter label, what a record of it is made of (spec.hostname, the
	// addresses, the Ready condition), so that the MCS controller's local
	// source reads the local Pods from it (PodInformer) rather than
	// watching them a second time. A change of only those fields queues
	// nothing unless SignEndpoints.
	RecordFields bool
	// HeartbeatInterval is how often, with SignEndpoints, the signed
	// heartbeat Lease is written (heartbeat.go; 0: DefaultHeartbeatInterval).
	HeartbeatInterval time.Duration
}

// Controller is the annotator of one cluster.
type Controller struct {
	client    kubernetes.Interface
	dynamic   dynamic.Interface
	discovery discovery.DiscoveryInterface
	cfg       Config
	public    ed25519.PublicKey // of cfg.SignKey
	metrics   *Metrics

	factory  informers.SharedInformerFactory
	podInf   cache.SharedIndexInformer
	pods     corelisters.PodLister
	services corelisters.ServiceLister
	synced   []cache.InformerSynced
	ready    atomic.Bool

	exports atomic.Pointer[serviceExports] // nil until the CRD is found

	queue workqueue.TypedRateLimitingInterface[string] // namespaces

	mu    sync.Mutex
	state map[string]nsState // by namespace: what its last reconcile found

	grants           workqueue.TypedDelayingInterface[string] // the grants sync (grants.go); nil without PeerReader
	publishedVersion string                                   // the list's ConfigMap as last applied (runGrants only)

	listed podLister // the Pods of the heartbeat's Pod list (podlist.go)
}

// serviceExports is the ServiceExport informer of the version served.
type serviceExports struct {
	gvr       schema.GroupVersionResource
	lister    cache.GenericLister
	hasSynced cache.InformerSynced
}

// nsState is what a namespace's last reconcile found: counts for the gauges
// and what was left out, so that each is logged and counted once while it
// lasts.
type nsState struct {
	exported, annotated, importers int
	skipped                        map[string]string // key -> detail
	// signed remembers the signature of each annotated Pod's value, so
	// that a reconcile signs only what changed (ed25519 costs tens of µs).
	signed map[types.UID]signature
	// statements remembers each exported Pod's endpoint statement
	// (endpoint.go), so that one is verified once, not on every reconcile.
	statements map[types.UID]statement
}

// signature is a Pod's name, annotation value and their signature.
type signature struct{ name, value, sig string }

// New makes a Controller; Start runs its informers, Run its workers.
// Signing (cfg.SignKey) needs cfg.Cluster, and cfg.SignEndpoints needs
// cfg.SignKey: the caller checks.
func New(client kubernetes.Interface, dyn dynamic.Interface, disco discovery.DiscoveryInterface, cfg Config, m *Metrics) *Controller {
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.ServiceExportPoll <= 0 {
		cfg.ServiceExportPoll = 30 * time.Second
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	c := &Controller{
		client: client, dynamic: dyn, discovery: disco, cfg: cfg, metrics: m,
		factory: informers.NewSharedInformerFactory(client, 0),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "mcs-annotator"}),
		state: map[string]nsState{},
	}
	if cfg.SignKey != nil {
		c.public = cfg.SignKey.Public().(ed25519.PublicKey)
	}
	if cfg.PeerReader != "" {
		c.grants = workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Name: "mcs-annotator-grants"})
	}
	podInf := c.factory.Core().V1().Pods()
	svcInf := c.factory.Core().V1().Services()
	switch {
	case cfg.SignEndpoints:
		_ = podInf.Informer().SetTransform(slimPodEndpoint)
	case cfg.RecordFields:
		_ = podInf.Informer().SetTransform(slimPodRecord)
	default:
		_ = podInf.Informer().SetTransform(slimPod)
	}
	c.podInf = podInf.Informer()
	_ = svcInf.Informer().SetTransform(slimService)
	c.pods, c.services = podInf.Lister(), svcInf.Lister()
	podInf.Informer().AddEventHandler(c.handler())
	svcInf.Informer().AddEventHandler(c.handler())
	c.synced = []cache.InformerSynced{podInf.Informer().HasSynced, svcInf.Informer().HasSynced}
	return c
}

// handler enqueues the namespace of an object that was added, deleted or
// changed in what the transforms keep (a Pod's status changes often, and
// only its phase matters here, and with SignEndpoints its addresses and
// readiness).
func (c *Controller) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueue,
		UpdateFunc: func(old, cur any) {
			if c.cfg.RecordFields && !c.cfg.SignEndpoints {
				// What slimPodRecord keeps beyond slimPod is the
				// MCS controller's, not the annotator's.
				old, cur = reslim(old), reslim(cur)
			}
			if !sameButVersion(old, cur) {
				c.enqueue(cur)
			}
		},
		DeleteFunc: c.enqueue,
	}
}

// PodInformer is the informer of every Pod of the cluster, which the
// annotator runs (Start); with Config.RecordFields the MCS controller's
// local source reads the exported Pods from it.
func (c *Controller) PodInformer() cache.SharedIndexInformer { return c.podInf }

// sameButVersion tells whether two stored objects differ only in their
// resource version.
func sameButVersion(a, b any) bool {
	ma, ok1 := a.(metav1.Object)
	mb, ok2 := b.(metav1.Object)
	if !ok1 || !ok2 || reflect.TypeOf(a) != reflect.TypeOf(b) {
		return false
	}
	if rv := ma.GetResourceVersion(); rv != "" && rv == mb.GetResourceVersion() {
		return true // a resync: nothing changed
	}
	switch x := a.(type) {
	case *corev1.Pod:
		y := *b.(*corev1.Pod)
		y.ResourceVersion = x.ResourceVersion
		return reflect.DeepEqual(x, &y)
	case *corev1.Service:
		y := *b.(*corev1.Service)
		y.ResourceVersion = x.ResourceVersion
		return reflect.DeepEqual(x, &y)
	case *unstructured.Unstructured:
		// A ServiceExport: its spec (the generation) and the annotations
		// the export reads are all that matter; its status is what the
		// annotator itself writes.
		y := b.(*unstructured.Unstructured)
		if x.GetGeneration() != y.GetGeneration() {
			return false
		}
		for _, k := range exportAnnotations {
			v1, ok1 := x.GetAnnotations()[k]
			v2, ok2 := y.GetAnnotations()[k]
			if v1 != v2 || ok1 != ok2 {
				return false
			}
		}
		return true
	}
	return false
}

// enqueue adds the namespace of obj (a tombstone's too).
func (c *Controller) enqueue(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if m, ok := obj.(metav1.Object); ok {
		c.queue.Add(m.GetNamespace())
	}
}

// Start runs the informers (every replica: a follower that becomes leader
// starts with warm caches), waits for their first lists as long as ctx
// lasts, and looks for the ServiceExport CRD, now and every
// ServiceExportPoll until it is found. It returns once the caches synced.
func (c *Controller) Start(ctx context.Context) error {
	c.factory.Start(ctx.Done())
	if gvr, ok, _ := mcsapi.Find(c.discovery, mcsapi.ServiceExports); ok {
		c.startServiceExports(ctx, gvr)
	} else {
		klog.Infof("ServiceExport (%s) is not served: exporting Services annotated %s=%q only; looking again every %v",
			mcsapi.Group, annotation.ExportServiceAnnotation, annotation.LabelValue, c.cfg.ServiceExportPoll)
		go c.pollServiceExports(ctx)
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("informers did not sync: %w", ctx.Err())
	}
	if se := c.exports.Load(); se != nil {
		if !cache.WaitForCacheSync(ctx.Done(), se.hasSynced) {
			return fmt.Errorf("the ServiceExport informer did not sync: %w", ctx.Err())
		}
	}
	c.ready.Store(true)
	pods, _ := c.pods.List(labels.Everything())
	svcs, _ := c.services.List(labels.Everything())
	klog.Infof("informers synced: %d Pods, %d Services", len(pods), len(svcs))
	return nil
}

// Ready tells whether the informers have synced.
func (c *Controller) Ready() bool { return c.ready.Load() }

func (c *Controller) pollServiceExports(ctx context.Context) {
	t := time.NewTicker(c.cfg.ServiceExportPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if gvr, ok, _ := mcsapi.Find(c.discovery, mcsapi.ServiceExports); ok {
			c.startServiceExports(ctx, gvr)
			return
		}
	}
}

// startServiceExports starts the ServiceExport informer of gvr.
func (c *Controller) startServiceExports(ctx context.Context, gvr schema.GroupVersionResource) {
	f := dynamicinformer.NewDynamicSharedInformerFactory(c.dynamic, 0)
	inf := f.ForResource(gvr)
	inf.Informer().AddEventHandler(c.handler())
	se := &serviceExports{gvr: gvr, lister: inf.Lister(), hasSynced: inf.Informer().HasSynced}
	f.Start(ctx.Done())
	c.exports.Store(se)
	klog.Infof("watching ServiceExports (%s)", gvr.GroupVersion())
}

// Run reconciles namespaces until ctx ends (the leader only). It first
// queues every namespace that has Pods or Services, so that a new leader
// checks everything once.
func (c *Controller) Run(ctx context.Context) {
	defer c.queue.ShutDown()
	seen := map[string]bool{}
	pods, _ := c.pods.List(labels.Everything())
	for _, p := range pods {
		seen[p.Namespace] = true
	}
	svcs, _ := c.services.List(labels.Everything())
	for _, s := range svcs {
		seen[s.Namespace] = true
	}
	for ns := range seen {
		c.queue.Add(ns)
	}
	var wg sync.WaitGroup
	if c.grants != nil {
		wg.Go(func() { c.runGrants(ctx) })
	}
	if c.cfg.SignEndpoints && c.cfg.SignKey != nil {
		c.seedListFloor(ctx) // before any statement is signed
		wg.Go(func() { c.runHeartbeat(ctx) })
	}
	for range c.cfg.Workers {
		wg.Go(func() {
			for c.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	c.queue.ShutDown()
	if c.grants != nil {
		c.grants.ShutDown()
	}
	wg.Wait()
}

// next reconciles one namespace from the queue; false when the queue shut down.
func (c *Controller) next(ctx context.Context) bool {
	ns, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(ns)
	if err := c.Reconcile(ctx, ns); err != nil {
		c.metrics.Reconciles.WithLabelValues("error").Inc()
		if ctx.Err() == nil {
			klog.Warningf("namespace %s: %v (retrying)", ns, err)
			c.queue.AddRateLimited(ns)
		}
		return true
	}
	c.metrics.Reconciles.WithLabelValues("ok").Inc()
	c.queue.Forget(ns)
	return true
}

// Reconcile brings the Pods and ServiceExports of namespace ns in line with
// the Services exported there.
func (c *Controller) Reconcile(ctx context.Context, ns string) error {
	svcs, err := c.services.Services(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	byName := make(map[string]*corev1.Service, len(svcs))
	for _, s := range svcs {
		byName[s.Name] = s
	}
	se := c.exports.Load()
	var ses []*unstructured.Unstructured
	if se != nil {
		objs, err := se.lister.ByNamespace(ns).List(labels.Everything())
		if err != nil {
			return err
		}
		for _, o := range objs {
			if u, ok := o.(*unstructured.Unstructured); ok {
				ses = append(ses, u)
			}
		}
	}
	exportOf := make(map[string]*unstructured.Unstructured, len(ses))
	for _, u := range ses {
		exportOf[u.GetName()] = u
	}

	skipped := map[string]skip{}
	var exportedSvcs []exported
	for _, s := range svcs {
		ok, refused := isExported(s, exportOf[s.Name] != nil)
		if refused {
			k := skip{skipExternalName, s.Name, fmt.Sprintf("Service %s/%s: not exported: ExternalName Services have no Pods", ns, s.Name)}
			skipped[k.reason+"/"+k.key] = k
		}
		if !ok {
			continue
		}
		e, ks := newExported(s, exportOf[s.Name])
		for _, k := range ks {
			skipped[k.reason+"/"+k.key] = k
		}
		exportedSvcs = append(exportedSvcs, e)
	}
	sortServices(exportedSvcs)

	pods, err := c.pods.Pods(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	results := make(map[string]*exportResult, len(exportedSvcs))
	for _, e := range exportedSvcs {
		results[e.svc.Name] = &exportResult{}
	}
	var errs []error
	annotated, importers := 0, 0
	chk := newChecker(ns, c.cfg.Cluster)
	c.mu.Lock()
	prevSigned, prevStatements := c.state[ns].signed, c.state[ns].statements
	c.mu.Unlock()
	signed := map[types.UID]signature{}
	var statements map[types.UID]statement
	if c.cfg.SignEndpoints {
		statements = map[types.UID]statement{}
	}
	for _, pod := range pods {
		if !writable(pod) {
			if err := c.endEndpoint(ctx, pod, prevStatements, statements); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		want, names, skips := desired(pod, exportedSvcs, c.cfg.Cluster, chk)
		for _, k := range skips {
			skipped[k.reason+"/"+k.key] = k
		}
		if want != "" {
			annotated++
		}
		importer := imports(pod)
		if importer {
			importers++
		}
		sig := c.sign(pod, want, prevSigned, signed)
		stmt, stmtSig := c.endpoint(pod, want, prevStatements, statements)
		var werr error
		if exportOK, importerOK := inSync(pod, want, sig, importer); !exportOK || !importerOK || !endpointInSync(pod, stmt, stmtSig) {
			w := podWrite{export: want, sig: sig, endpoint: stmt, endpointSig: stmtSig, importer: importer}
			werr = c.writePod(ctx, pod, w, exportOK, importerOK)
			if werr != nil {
				errs = append(errs, werr)
			} else {
				c.appliedEndpoint(pod.UID, statements)
			}
		}
		for _, n := range names {
			r := results[n]
			r.pods++
			if werr != nil && r.writeErr == nil {
				r.writeErr = werr
			}
		}
	}

	if se != nil {
		for _, u := range ses {
			var res exportResult
			if r := results[u.GetName()]; r != nil {
				res = *r
			}
			wrote, err := c.updateStatus(ctx, se.gvr, u, conditions(byName[u.GetName()], u.GetName(), res, u.GetGeneration(), !c.cfg.ClustersetConflicts))
			if !wrote || apierrors.IsNotFound(err) {
				continue // unchanged, or deleted meanwhile (its delete event comes)
			}
			if err != nil {
				c.metrics.StatusWrites.WithLabelValues("error").Inc()
				errs = append(errs, fmt.Errorf("ServiceExport %s/%s: status: %w", ns, u.GetName(), err))
				continue
			}
			c.metrics.StatusWrites.WithLabelValues("ok").Inc()
		}
	}
	c.record(ns, nsState{exported: len(exportedSvcs), annotated: annotated, importers: importers, signed: signed, statements: statements}, skipped)
	return errors.Join(errs...)
}

// sign returns the signature of want on pod, or "" when not signing: the one
// remembered in prev for the Pod's UID when its name and value are the same,
// else a new one; it notes it in next.
func (c *Controller) sign(pod *corev1.Pod, want string, prev, next map[types.UID]signature) string {
	if c.cfg.SignKey == nil || want == "" {
		return ""
	}
	s, ok := prev[pod.UID]
	if !ok || s.name != pod.Name || s.value != want {
		s = signature{pod.Name, want, annotation.Sign(c.cfg.SignKey, c.cfg.Cluster, pod.Namespace, pod.Name, string(pod.UID), want)}
	}
	next[pod.UID] = s
	return s.sig
}

// podWrite is what the annotator keeps on a Pod: the export annotation's
// value ("" for none) with its signature ("" for none), the endpoint
// statement ("" for none) with its signature, and whether the Pod gets the
// importer label.
type podWrite struct {
	export, sig           string
	endpoint, endpointSig string
	importer              bool
}

// writePod applies, with server-side apply, what the annotator owns on pod:
// w, with the exporter label when w exports. What it owned and no longer
// applies is removed. The UID makes the apply fail rather than touch another
// Pod of the same name. exportOK and importerOK are inSync's findings, for
// the log.
func (c *Controller) writePod(ctx context.Context, pod *corev1.Pod, w podWrite, exportOK, importerOK bool) error {
	want, importer := w.export, w.importer
	cfg := applycorev1.Pod(pod.Name, pod.Namespace).WithUID(pod.UID)
	labels := map[string]string{}
	if want != "" {
		annos := map[string]string{annotation.ExportAnnotation: want}
		if w.sig != "" {
			annos[annotation.SignatureAnnotation] = w.sig
		}
		if w.endpoint != "" {
			annos[annotation.EndpointAnnotation] = w.endpoint
			annos[annotation.EndpointSignatureAnnotation] = w.endpointSig
		}
		labels[annotation.ExporterLabel] = annotation.LabelValue
		cfg.WithAnnotations(annos)
	}
	if importer {
		labels[annotation.ImporterLabel] = annotation.LabelValue
	}
	if len(labels) > 0 {
		cfg.WithLabels(labels)
	}
	_, err := c.client.CoreV1().Pods(pod.Namespace).Apply(ctx, cfg, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if apierrors.IsNotFound(err) {
		return nil // gone meanwhile; its delete event comes
	}
	if err != nil {
		c.metrics.PodWrites.WithLabelValues("error").Inc()
		return fmt.Errorf("Pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	c.metrics.PodWrites.WithLabelValues("ok").Inc()
	if w.endpoint != "" && w.endpoint != pod.Annotations[annotation.EndpointAnnotation] {
		klog.V(2).Infof("Pod %s/%s: %s=%s", pod.Namespace, pod.Name, annotation.EndpointAnnotation, w.endpoint)
	}
	if !exportOK {
		if want == "" {
			klog.Infof("Pod %s/%s: no exported Service selects it: removed its export annotation and label", pod.Namespace, pod.Name)
		} else {
			klog.V(2).Infof("Pod %s/%s: %s=%s", pod.Namespace, pod.Name, annotation.ExportAnnotation, want)
		}
	}
	if !importerOK {
		if importer {
			klog.V(2).Infof("Pod %s/%s: imports services: labelled %s=%s", pod.Namespace, pod.Name, annotation.ImporterLabel, annotation.LabelValue)
		} else {
			klog.Infof("Pod %s/%s: imports nothing any more: removed the %s label the annotator set", pod.Namespace, pod.Name, annotation.ImporterLabel)
		}
	}
	return nil
}

// record keeps what the reconcile of ns found (now, and what was left
// out), updates the gauges, and logs and counts each new thing left out.
func (c *Controller) record(ns string, now nsState, skipped map[string]skip) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.state[ns]
	now.skipped = make(map[string]string, len(skipped))
	for key, k := range skipped {
		now.skipped[key] = k.detail
		if old.skipped[key] != k.detail {
			c.metrics.Skipped.WithLabelValues(k.reason).Inc()
			klog.Warningf("%s (%s)", k.detail, k.reason)
		}
	}
	if (now.exported > 0) != (old.exported > 0) { // the set of exporting namespaces changed
		c.signalGrants()
	}
	c.metrics.ExportedServices.Add(float64(now.exported - old.exported))
	c.metrics.AnnotatedPods.Add(float64(now.annotated - old.annotated))
	c.metrics.ImporterPods.Add(float64(now.importers - old.importers))
	if now.exported == 0 && now.annotated == 0 && now.importers == 0 && len(skipped) == 0 {
		delete(c.state, ns)
		return
	}
	c.state[ns] = now
}
