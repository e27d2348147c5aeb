package mcscontroller

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
)

// What a tenant or a peer can make the controller write is bounded here:
// the namespaces it writes to, how many services a namespace and a source
// cluster may have imported, what the API server would refuse (left out
// before writing, so that it never fails and retries), and how often one
// service is written.

// Refusal reasons: the reason label of mcs_controller_refused_total, and
// the reason of the Event.
const (
	ReasonNamespace      = "RefusedNamespace"    // a namespace imports are never written to
	ReasonNamespaceCap   = "NamespaceCap"        // the namespace has as many imports as it may
	ReasonClusterCap     = "ClusterCap"          // a source cluster takes part in as many imports as it may
	ReasonAddress        = "RefusedAddress"      // endpoint addresses left out
	ReasonInvalidService = "InvalidService"      // no derived Service: the API server would refuse it
	ReasonNameTaken      = "NameTaken"           // an object of the name exists that is not this service's
	ReasonConflict       = "Conflict"            // the clusters' exports conflict (an Event only)
	reasonNoAddress      = "NoEndpointAddresses" // no ClusterSetIP yet: not a refusal, logged at -v=2
)

var refusalReasons = []string{ReasonNamespace, ReasonNamespaceCap, ReasonClusterCap, ReasonAddress, ReasonInvalidService, ReasonNameTaken}

// DefaultRefusedNamespaces are the namespaces no import is written to
// unless Config.RefusedNamespaces says otherwise: the cluster's own, which
// no tenant of a peer should be able to add Services or EndpointSlices to.
var DefaultRefusedNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

// note is one thing the controller refused or left out for a service.
type note struct{ reason, msg string }

// notes are a service's notes by topic (one note per topic).
type notes map[string]note

func (n *notes) add(topic, reason, format string, args ...any) {
	if *n == nil {
		*n = notes{}
	}
	(*n)[topic] = note{reason, fmt.Sprintf(format, args...)}
}

// report logs, counts and records as an Event each note of k that is new
// or says something else than last time; notes no longer there are
// forgotten (and logged as cleared). Called by the reconcile alone.
func (c *Controller) report(k clusterset.Key, now notes) {
	before := c.said[k]
	for topic, n := range now {
		if old, ok := before[topic]; ok && old == n {
			continue
		}
		switch n.reason {
		case reasonNoAddress:
			klog.V(2).Infof("mcs-controller: service %s: %s", k, n.msg)
			continue
		case ReasonConflict: // not a refusal: the ServiceExports have it as a condition
			klog.V(2).Infof("mcs-controller: service %s: %s", k, n.msg)
			c.eventOnImport(k, corev1.EventTypeWarning, n.reason, n.msg)
			continue
		case reasonStaleDropped: // the exporter's choice, not a refusal
			klog.Infof("mcs-controller: service %s: %s", k, n.msg)
			c.event(k, corev1.EventTypeNormal, n.reason, n.msg)
			continue
		case ReasonNamespaceCap, ReasonClusterCap:
			// One tenant can have thousands refused: each at -v=2, and a
			// summary (logCaps) when their number changes.
			klog.V(2).Infof("mcs-controller: service %s: %s", k, n.msg)
		default:
			klog.Warningf("mcs-controller: service %s: %s", k, n.msg)
		}
		c.metrics.Refused.WithLabelValues(n.reason).Inc()
		c.event(k, corev1.EventTypeWarning, n.reason, n.msg)
	}
	for topic, n := range before {
		switch _, ok := now[topic]; {
		case ok || n.reason == reasonNoAddress:
		case n.reason == reasonStaleDropped:
			klog.Infof("mcs-controller: service %s: no longer: %s", k, n.msg)
		default:
			klog.V(2).Infof("mcs-controller: service %s: no longer: %s", k, n.msg)
		}
	}
	if len(now) == 0 {
		delete(c.said, k)
		return
	}
	c.said[k] = maps.Clone(now)
}

// logCaps logs how many services the caps refuse, with a few of them,
// when that number changes.
func (c *Controller) logCaps() {
	if len(c.refused) == c.loggedRefused {
		return
	}
	c.loggedRefused = len(c.refused)
	if len(c.refused) == 0 {
		klog.Infof("mcs-controller: no service refused for a cap any more")
		return
	}
	keys := make([]string, 0, len(c.refused))
	for k := range c.refused {
		keys = append(keys, k.String())
	}
	slices.Sort(keys)
	if len(keys) > 5 {
		keys = append(keys[:5], fmt.Sprintf("and %d more", len(keys)-5))
	}
	klog.Warningf("mcs-controller: %d services (or clusters' shares of them) not imported: a namespace or a source cluster reached its cap (%d per namespace, %d per cluster): %s",
		len(c.refused), c.cfg.MaxImportsPerNamespace, c.cfg.MaxImportsPerCluster, strings.Join(keys, ", "))
}

// event records an Event on the local ServiceExport of k, else on its
// ServiceImport (one of ours), when the controller has a recorder.
// (Conflicts go to both: eventOnImport, syncConflicts.)
func (c *Controller) event(k clusterset.Key, typ, reason, msg string) {
	if c.cfg.Recorder == nil {
		return
	}
	var obj runtime.Object
	if o, err := c.exports.ByNamespace(k.Namespace).Get(k.Name); err == nil {
		obj = o
	} else {
		obj = c.importRef(k)
	}
	if obj != nil {
		c.cfg.Recorder.Event(obj, typ, reason, msg)
	}
}

// eventOnImport records an Event on the ServiceImport of k that the last
// sync wrote, when the controller has a recorder.
func (c *Controller) eventOnImport(k clusterset.Key, typ, reason, msg string) {
	if c.cfg.Recorder == nil {
		return
	}
	if obj := c.importRef(k); obj != nil {
		c.cfg.Recorder.Event(obj, typ, reason, msg)
	}
}

// importRef is the ServiceImport of k as an Event's object: the one the
// informer holds, else the one the last sync wrote (nil: none).
func (c *Controller) importRef(k clusterset.Key) runtime.Object {
	if u := c.storedImport(k); u != nil {
		return u
	}
	o := c.done[k]
	if o == nil || o.importUID == "" {
		return nil
	}
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(c.importsGVR.GroupVersion().String())
	u.SetKind("ServiceImport")
	u.SetNamespace(k.Namespace)
	u.SetName(k.Name)
	u.SetUID(o.importUID)
	return u
}

// storedImport is the ServiceImport of k that this controller made, as the
// informer holds it (nil: none).
func (c *Controller) storedImport(k clusterset.Key) *unstructured.Unstructured {
	o, err := c.imports.ByNamespace(k.Namespace).Get(k.Name)
	if err != nil {
		return nil
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok || u.GetLabels()[clusterset.LabelManagedBy] != clusterset.ManagedBy {
		return nil
	}
	return u
}

// addressNotes notes the endpoint addresses of one cluster's share that
// clusterset.Slices leaves out, by problem, and says whether any address is
// left.
func addressNotes(n *notes, cluster string, eps []clusterset.Endpoint) (usable bool) {
	bad := map[string][]string{}
	for _, ep := range eps {
		for _, a := range ep.Addresses {
			if p := clusterset.AddressProblem(a); p != "" {
				bad[p] = append(bad[p], a.String())
			} else {
				usable = true
			}
		}
	}
	if len(bad) == 0 {
		return usable
	}
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(bad)) {
		addrs := bad[p]
		slices.Sort(addrs)
		if len(addrs) > 5 {
			addrs = append(addrs[:5], fmt.Sprintf("and %d more", len(addrs)-5))
		}
		parts = append(parts, p+" "+strings.Join(addrs, ", "))
	}
	n.add("address/"+cluster, ReasonAddress, "cluster %s: endpoint addresses left out (the API server refuses them in an EndpointSlice, or no service may send to them): %s",
		cluster, strings.Join(parts, "; "))
	return usable
}

// derivedProblem says why the API server would refuse the derived Service
// ("" if it would not): the checks of its Service validation that what
// the controller builds can fail.
func derivedProblem(svc *corev1.Service) string {
	if errs := validation.IsDNS1035Label(svc.Name); len(errs) > 0 {
		return fmt.Sprintf("name %q: %s", svc.Name, strings.Join(errs, "; "))
	}
	if len(svc.Spec.Ports) == 0 {
		return "no ports: a ClusterIP Service needs at least one"
	}
	names := map[string]bool{}
	type pp struct {
		port  int32
		proto corev1.Protocol
	}
	seen := map[pp]bool{}
	for _, p := range svc.Spec.Ports {
		if p.Name == "" && len(svc.Spec.Ports) > 1 {
			return fmt.Sprintf("port %d/%s has no name, and a Service of several ports must name each", p.Port, p.Protocol)
		}
		if p.Name != "" {
			if errs := validation.IsDNS1123Label(p.Name); len(errs) > 0 {
				return fmt.Sprintf("port name %q: %s", p.Name, strings.Join(errs, "; "))
			}
			if names[p.Name] {
				return fmt.Sprintf("port name %q is used twice", p.Name)
			}
			names[p.Name] = true
		}
		if errs := validation.IsValidPortNum(int(p.Port)); len(errs) > 0 {
			return fmt.Sprintf("port %d: %s", p.Port, strings.Join(errs, "; "))
		}
		switch p.Protocol {
		case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		default:
			return fmt.Sprintf("port %d: protocol %q", p.Port, p.Protocol)
		}
		if seen[pp{p.Port, p.Protocol}] {
			return fmt.Sprintf("port %d/%s is used twice", p.Port, p.Protocol)
		}
		seen[pp{p.Port, p.Protocol}] = true
	}
	if sc := svc.Spec.SessionAffinityConfig; sc != nil && sc.ClientIP != nil && sc.ClientIP.TimeoutSeconds != nil {
		if t := *sc.ClientIP.TimeoutSeconds; t <= 0 || t > 86400 {
			return fmt.Sprintf("session affinity timeout %ds: must be 1-86400", t)
		}
	}
	return ""
}

// damping is how often one service (its ServiceImport, derived Service and
// deletes) or one cluster's share of it (its slices) is written: after a
// write, the next waits interval (Damp). One written again within twice
// its interval more than dampStrikes times in a row waits twice as long
// each time (up to DampMax); one quiet for longer starts again from Damp.
// A few changes in a row (an operator's edits one after the other) wait
// Damp at most. A flapping cluster's share waits alone: the other clusters'
// shares of the service are written as they change (a relay hub's service
// of a thousand origins is not held back by one).
type damping struct {
	last     time.Time
	interval time.Duration
	strikes  int
}

const dampStrikes = 3

// shareKey is one cluster's share of a service.
type shareKey struct {
	k  clusterset.Key
	cl string
}

// wrote notes a write of k's ServiceImport or derived Service (or a delete)
// at now and returns when k may be written next.
func (c *Controller) wrote(k clusterset.Key, now time.Time) time.Time {
	return pace(c.cfg, c.damp, k, now)
}

// wroteShare notes a write of cluster cl's slices of k at now and returns
// when they may be written next.
func (c *Controller) wroteShare(k clusterset.Key, cl string, now time.Time) time.Time {
	return pace(c.cfg, c.shareDamp, shareKey{k, cl}, now)
}

// pace notes a write of key at now in damp (the rule of damping) and returns
// when key may be written next.
func pace[K comparable](cfg Config, damp map[K]*damping, key K, now time.Time) time.Time {
	if cfg.Damp <= 0 {
		return now
	}
	d := damp[key]
	switch {
	case d == nil:
		d = &damping{interval: cfg.Damp}
		damp[key] = d
	case now.Sub(d.last) > 2*d.interval:
		d.interval, d.strikes = cfg.Damp, 0
	default:
		if d.strikes++; d.strikes > dampStrikes {
			d.interval = min(2*d.interval, cfg.DampMax)
		}
	}
	d.last = now
	return now.Add(d.interval)
}

// forget drops the pacing of keys not written for long, and the due times
// passed.
func forget[K comparable](damp map[K]*damping, notBefore map[K]time.Time, now time.Time, dampMax time.Duration) {
	for k, d := range damp {
		if now.Sub(d.last) > 2*max(d.interval, dampMax) {
			delete(damp, k)
		}
	}
	for k, t := range notBefore {
		if now.After(t) {
			delete(notBefore, k)
		}
	}
}

// pruneDamping forgets the pacing of the services not written for long,
// and when services gone long ago turned Headless.
func (c *Controller) pruneDamping(now time.Time) {
	forget(c.damp, c.notBefore, now, c.cfg.DampMax)
	forget(c.shareDamp, c.shareNotBefore, now, c.cfg.DampMax)
	for k, t := range c.headless {
		if now.Sub(t) > 2*c.cfg.DampMax {
			delete(c.headless, k)
		}
	}
}
