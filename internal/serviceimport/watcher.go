// Package serviceimport watches the MCS ServiceImports (multicluster.x-k8s.io)
// of the local cluster and hands the ClusterSetIP services among them to the
// table: a service with a ServiceImport of type ClusterSetIP that has IPs is
// answered with those IPs (KEP-1645 DNS specification 1.0.0).
//
// The CRD is optional: while the API server does not serve ServiceImports
// the watcher holds nothing and looks again every Options.Recheck, so that a
// CRD installed later is picked up. An API server that does not answer
// changes nothing: what is held (from the snapshot, or from before) stays.
package serviceimport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/table"
	"github.com/mcsannotations/mcsannotations/mcsapi"
)

// TypeClusterSetIP is the ServiceImport type that has a virtual IP.
const TypeClusterSetIP = "ClusterSetIP"

const typeHeadless = "Headless"

// Reason says why (part of) a ServiceImport was ignored; the values double as
// metric labels.
type Reason string

// The reasons.
const (
	ReasonMalformed   Reason = "malformed"    // spec is not the shape of a ServiceImport's
	ReasonInvalidType Reason = "invalid_type" // type is neither ClusterSetIP nor Headless
	ReasonInvalidIP   Reason = "invalid_ip"   // an entry of spec.ips is no IP address (that entry is ignored)
	ReasonInvalidPort Reason = "invalid_port" // a port out of 1-65535, or a bad protocol or name (that port is ignored)
)

// Reasons lists every Reason, for pre-registering metric labels.
var Reasons = []Reason{ReasonMalformed, ReasonInvalidType, ReasonInvalidIP, ReasonInvalidPort}

// Rejection is one thing ignored in a ServiceImport.
type Rejection struct {
	Reason Reason
	Detail string
}

func (r Rejection) String() string { return string(r.Reason) + ": " + r.Detail }

// Events are the watcher's callbacks; each may be nil. They are called from
// the watcher's goroutines and must not block; Changed is called one at a
// time, in order.
type Events struct {
	// Changed hands over the complete set of ClusterSetIP services: after
	// the first complete list of a watch, after every change from then on,
	// and (empty) once the API server says it serves no ServiceImports.
	Changed func([]table.ClusterSetIP)
	// Rejected reports what was ignored in a ServiceImport, once per change
	// of it.
	Rejected func(namespace, name string, rej []Rejection)
	// Watching reports the resource a watch starts on.
	Watching func(gvr schema.GroupVersionResource)
	// Absent reports, once per change, that the API server serves no
	// ServiceImports.
	Absent func()
}

// Options tune a watcher; zero values take the defaults.
type Options struct {
	// Recheck is how often discovery is asked again (default 30s): for the
	// CRD when it is absent, or for a change of the served version.
	Recheck time.Duration
	// Ingest tunes the reflector; its StopWait also bounds the wait for a
	// pending discovery request on Stop.
	Ingest ingest.Options
}

// Watcher watches the ServiceImports of one cluster.
type Watcher struct {
	disc discovery.DiscoveryInterface
	dyn  dynamic.Interface
	ev   Events
	opts Options

	mu     sync.Mutex // serialises Start, Stop and the checks; guards the fields below
	cancel context.CancelFunc
	loop   sync.WaitGroup
	run    *run // nil while none runs
	absent bool // the last check found no ServiceImports served

	pushMu sync.Mutex           // one Changed at a time, each from the store as it is then
	last   []table.ClusterSetIP // the set Changed last heard; under pushMu
}

// run is one reflector on one resource, and its store.
type run struct {
	gvr    schema.GroupVersionResource
	refl   *ingest.Run
	store  *ingest.Store[*Slim]
	synced bool // a complete list is in; under the store's lock
	pushed bool // Changed heard this run's set once; under Watcher.pushMu
}

// New returns a watcher; Start starts it.
func New(disc discovery.DiscoveryInterface, dyn dynamic.Interface, ev Events, opts Options) *Watcher {
	if opts.Recheck <= 0 {
		opts.Recheck = 30 * time.Second
	}
	if opts.Ingest.StopWait <= 0 {
		opts.Ingest.StopWait = ingest.StopWait
	}
	return &Watcher{disc: disc, dyn: dyn, ev: ev, opts: opts}
}

// Start looks for ServiceImports now and every Options.Recheck, in the
// background; it never waits for the API server.
func (w *Watcher) Start() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	w.loop.Go(func() { wait.UntilWithContext(ctx, w.check, w.opts.Recheck) })
}

// Stop stops the checks and the reflector, waiting for each at most
// Options.Ingest.StopWait (the error then says it ends in the background).
func (w *Watcher) Stop() error {
	w.mu.Lock()
	cancel := w.cancel
	w.cancel = nil
	w.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	// A check may be waiting for discovery from a hung API server (client-go
	// bounds that at 32 s): it is not waited for. Once it returns it sees
	// the cancel, under mu, and starts nothing.
	var errs []error
	if !ingest.Bounded(w.loop.Wait, w.opts.Ingest.StopWait) {
		errs = append(errs, fmt.Errorf("%w: a discovery request still pending after %s; it ends on its own", ingest.ErrSlow, w.opts.Ingest.StopWait))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.run != nil {
		errs = append(errs, w.stopRun())
	}
	return errors.Join(errs...)
}

// check starts, replaces or stops the reflector after what discovery says.
func (w *Watcher) check(ctx context.Context) {
	gvr, found, err := mcsapi.Find(w.disc, mcsapi.ServiceImports)
	w.mu.Lock()
	defer w.mu.Unlock()
	if ctx.Err() != nil || err != nil {
		return // stopped, or no word from the API server: keep what is held
	}
	if !found {
		if w.run != nil {
			_ = w.stopRun()
		}
		if !w.absent {
			w.absent = true
			if w.ev.Absent != nil {
				w.ev.Absent()
			}
			w.pushMu.Lock()
			w.last = nil
			w.changed(nil)
			w.pushMu.Unlock()
		}
		return
	}
	w.absent = false
	if w.run != nil && w.run.gvr == gvr {
		return
	}
	if w.run != nil {
		_ = w.stopRun()
	}
	w.run = w.start(gvr)
}

// stopRun closes the run's store and stops its reflector; w.mu is held.
func (w *Watcher) stopRun() error {
	r := w.run
	w.run = nil
	r.store.Close()
	return r.refl.Stop()
}

func (w *Watcher) changed(list []table.ClusterSetIP) {
	if w.ev.Changed != nil {
		w.ev.Changed(list)
	}
}

// start runs a reflector on gvr. Until its first complete list the table
// keeps what it held; from then on the run's store is the truth.
func (w *Watcher) start(gvr schema.GroupVersionResource) *run {
	if w.ev.Watching != nil {
		w.ev.Watching(gvr)
	}
	lw := ingest.Resource(w.dyn, gvr, func(u *unstructured.Unstructured) (runtime.Object, error) { return FromUnstructured(u), nil })
	r := w.newRun(gvr)
	r.refl = ingest.Start(lw, r.store, w.opts.Ingest)
	return r
}

// newRun returns a run on gvr with its store, not started.
func (w *Watcher) newRun(gvr schema.GroupVersionResource) *run {
	r := &run{gvr: gvr}
	r.store = &ingest.Store[*Slim]{
		Changed: func(old, s *Slim) {
			w.reject(old, s)
			w.push(r, r.store)
		},
		Deleted: func(*Slim) { w.push(r, r.store) },
		Replaced: func(old, items map[string]*Slim) {
			for k, s := range items {
				w.reject(old[k], s)
			}
			r.synced = true
			w.push(r, r.store)
		},
	}
	return r
}

// push hands the ClusterSetIP services of the run's store to Changed, once
// its first list is in; it runs under the store's lock.
func (w *Watcher) push(r *run, st *ingest.Store[*Slim]) {
	if !r.synced {
		return
	}
	list := Collect(st.Items())
	w.pushMu.Lock()
	defer w.pushMu.Unlock()
	// Most events change no ClusterSetIP (a headless import, a status
	// update): the table and the snapshot hear only of a changed set. A
	// run's first set always goes through: it replaces what the snapshot
	// seeded.
	if r.pushed && slices.EqualFunc(list, w.last, sameClusterSetIP) {
		return
	}
	r.pushed, w.last = true, list
	w.changed(list)
}

func sameClusterSetIP(a, b table.ClusterSetIP) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && slices.Equal(a.IPs, b.IPs) && slices.Equal(a.Ports, b.Ports)
}

// Collect returns the ClusterSetIP services among items, sorted by
// namespace and name.
func Collect(items iter.Seq[*Slim]) []table.ClusterSetIP {
	var out []table.ClusterSetIP
	for s := range items {
		if s.ClusterSetIP != nil {
			out = append(out, *s.ClusterSetIP)
		}
	}
	slices.SortFunc(out, func(a, b table.ClusterSetIP) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// reject reports what s's ServiceImport had ignored, unless old (the version
// held before it, or nil) had the same.
func (w *Watcher) reject(old, s *Slim) {
	if len(s.Rejected) == 0 || w.ev.Rejected == nil {
		return
	}
	if old != nil && (old.ResourceVersion == s.ResourceVersion || slices.Equal(old.Rejected, s.Rejected)) {
		return
	}
	w.ev.Rejected(s.Namespace, s.Name, s.Rejected)
}

// Slim is what the store keeps of a ServiceImport: its name, version and
// what DNS needs.
type Slim struct {
	ingest.Meta
	// ClusterSetIP is set when the ServiceImport is of type ClusterSetIP
	// and has at least one valid IP.
	ClusterSetIP *table.ClusterSetIP
	Rejected     []Rejection
}

// GetObjectKind and DeepCopyObject make Slim a runtime.Object for the
// reflector (it is never copied: the store's objects are not changed).
func (s *Slim) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object.
func (s *Slim) DeepCopyObject() runtime.Object { c := *s; return &c }

// FromUnstructured reads a ServiceImport of either version: spec.type,
// spec.ips and spec.ports have the same shape in v1alpha1 and v1beta1.
func FromUnstructured(u *unstructured.Unstructured) *Slim {
	s := &Slim{Meta: ingest.MetaOf(u)}
	typ, _, err := unstructured.NestedString(u.Object, "spec", "type")
	if err != nil {
		s.Rejected = append(s.Rejected, Rejection{ReasonMalformed, "spec.type: " + err.Error()})
		return s
	}
	switch typ {
	case TypeClusterSetIP:
	case typeHeadless:
		return s // answered from the endpoints, as without a ServiceImport
	default:
		s.Rejected = append(s.Rejected, Rejection{ReasonInvalidType, fmt.Sprintf("spec.type %q is neither ClusterSetIP nor Headless", typ)})
		return s
	}
	ci := &table.ClusterSetIP{Namespace: s.Namespace, Name: s.Name}
	rawIPs, _, err := unstructured.NestedFieldNoCopy(u.Object, "spec", "ips")
	if err != nil {
		s.Rejected = append(s.Rejected, Rejection{ReasonMalformed, "spec.ips: " + err.Error()})
		return s
	}
	if rawIPs != nil {
		list, ok := rawIPs.([]any)
		if !ok {
			s.Rejected = append(s.Rejected, Rejection{ReasonMalformed, fmt.Sprintf("spec.ips is a %T, not a list", rawIPs)})
			return s
		}
		for i, v := range list {
			str, _ := v.(string)
			ip, err := netip.ParseAddr(str)
			if err != nil || ip.Zone() != "" || ip.IsUnspecified() {
				s.Rejected = append(s.Rejected, Rejection{ReasonInvalidIP, fmt.Sprintf("spec.ips[%d] %v is no IP address", i, v)})
				continue
			}
			if ip = ip.Unmap(); !slices.Contains(ci.IPs, ip) {
				ci.IPs = append(ci.IPs, ip)
			}
		}
	}
	rawPorts, _, err := unstructured.NestedFieldNoCopy(u.Object, "spec", "ports")
	if err != nil {
		s.Rejected = append(s.Rejected, Rejection{ReasonMalformed, "spec.ports: " + err.Error()})
	} else if rawPorts != nil {
		list, ok := rawPorts.([]any)
		if !ok {
			s.Rejected = append(s.Rejected, Rejection{ReasonMalformed, fmt.Sprintf("spec.ports is a %T, not a list", rawPorts)})
		}
		for i, v := range list {
			p, err := port(v)
			if err != nil {
				s.Rejected = append(s.Rejected, Rejection{ReasonInvalidPort, fmt.Sprintf("spec.ports[%d]: %v", i, err)})
				continue
			}
			ci.Ports = append(ci.Ports, p)
		}
	}
	if len(ci.IPs) > 0 {
		s.ClusterSetIP = ci
	}
	return s
}

// port reads one entry of spec.ports.
func port(v any) (table.ImportPort, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return table.ImportPort{}, fmt.Errorf("a %T, not an object", v)
	}
	name, _ := m["name"].(string)
	proto, _ := m["protocol"].(string)
	proto = cmp.Or(proto, "TCP")
	var n int64
	switch x := m["port"].(type) {
	case int64:
		n = x
	case float64:
		n = int64(x)
		if float64(n) != x {
			n = 0
		}
	}
	switch {
	case n < 1 || n > 65535:
		return table.ImportPort{}, fmt.Errorf("port %v is not in 1-65535", m["port"])
	case proto != "TCP" && proto != "UDP" && proto != "SCTP":
		return table.ImportPort{}, fmt.Errorf("protocol %q is not TCP, UDP or SCTP", proto)
	case name != "" && len(validation.IsDNS1123Label(name)) > 0:
		return table.ImportPort{}, fmt.Errorf("name %q is not a DNS label", name)
	}
	return table.ImportPort{Name: name, Protocol: proto, Port: uint16(n)}, nil
}
