package relay

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// hub is one hub read: the reflectors of its relay slices (one in every
// namespace, or one per namespace of Config.Namespaces), the reflector of
// its origin Leases in its namespace, and its /readyz check.
type hub struct {
	r               *Relay
	name, namespace string
	client          kubernetes.Interface
	parts           []*slicePart
	leaseSt         *ingest.Store[*slimLease]
	runs            []*ingest.Run
	state           atomic.Int32
	lastContact     atomic.Int64 // unix nanoseconds
	listedOnce      atomic.Bool  // the first list of slices arrived (read without r.mu)

	// Under r.mu.
	listed   bool                    // every part's first list of slices arrived
	byOrigin map[string][]*slimSlice // origin → its slices, in no order
	leases   map[string]*slimLease   // origin → its Lease
}

func newHub(r *Relay, name string, client kubernetes.Interface, namespace string) *hub {
	return &hub{r: r, name: name, client: client, namespace: namespace,
		byOrigin: map[string][]*slimSlice{}, leases: map[string]*slimLease{}}
}

// State and LastContact are the hub's, as a source's.
func (h *hub) State() source.State { return source.State(h.state.Load()) }

func (h *hub) LastContact() time.Time {
	n := h.lastContact.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// slicePart is the reflector of a hub's slices in one namespace ("" for
// every namespace).
type slicePart struct {
	namespace string
	st        *ingest.Store[*slimSlice]
	listed    bool // its first list arrived (under r.mu)
}

// sliceSelector selects the slices our controller manages that carry the
// relay annotation's origin label.
func sliceSelector() string {
	managed, _ := labels.NewRequirement(discoveryv1.LabelManagedBy, selection.Equals, []string{clusterset.ManagedBy})
	origin, _ := labels.NewRequirement(mcsv1beta1.LabelSourceCluster, selection.Exists, nil)
	return labels.NewSelector().Add(*managed, *origin).String()
}

// start starts the hub's reflectors and check.
func (h *hub) start(ctx context.Context, wg *sync.WaitGroup) {
	opts := h.r.cfg.Ingest
	failed := opts.Events.Failed
	opts.Events.Failed = func(err error) {
		h.setState(source.Disconnected, err)
		if failed != nil {
			failed(err)
		}
	}
	name := opts.Name
	if name == "" {
		name = "hub/" + h.name
	}
	h.leaseSt = h.leaseStore()
	lopts := opts
	lopts.Name = name + "/leases"
	// A hub whose Leases may not be read (a credential without the grant)
	// still relays its records: the refusal is reported, the hub stays
	// connected, and its origins' states stay unknown (Syncing).
	lopts.Events.Failed = func(err error) {
		if !apierrors.IsForbidden(err) {
			h.setState(source.Disconnected, err)
		}
		if failed != nil {
			failed(err)
		}
	}
	// With a namespace limit, one watch per namespace: the hub's API server
	// filters, so slices of other namespaces never cross the link.
	namespaces := h.r.cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	for _, ns := range namespaces {
		p := &slicePart{namespace: ns}
		p.st = h.sliceStore(p)
		lw := ingest.EndpointSlices(h.client, ns, sliceSelector(), func(es *discoveryv1.EndpointSlice) (runtime.Object, error) {
			if old, ok := p.st.Get(es.Namespace + "/" + es.Name); ok && old.Same(ingest.MetaOf(es)) {
				return old, nil
			}
			return h.r.toSlim(es), nil
		})
		sopts := opts
		sopts.Name = name + "/slices"
		if ns != metav1.NamespaceAll {
			sopts.Name += "/" + ns
		}
		h.parts = append(h.parts, p)
		h.runs = append(h.runs, ingest.Start(lw, p.st, sopts))
	}
	ll := ingest.Leases(h.client, h.namespace, OriginLabel, func(l *coordinationv1.Lease) (runtime.Object, error) {
		return h.r.keepLease(h.r.toLease(l), l), nil
	})
	h.runs = append(h.runs, ingest.Start(ll, h.leaseSt, lopts))
	wg.Go(func() {
		source.Contact(ctx, h.client, h.r.cfg.Contact, func(err error) {
			if err != nil {
				h.setState(source.Disconnected, err)
				return
			}
			h.touch()
		})
	})
}

// stop stops the reflectors; the stores are closed first, so nothing
// changes once it returns.
func (h *hub) stop() error {
	if h.leaseSt == nil {
		return nil
	}
	for _, p := range h.parts {
		p.st.Close()
	}
	h.leaseSt.Close()
	var errs []error
	for _, run := range h.runs {
		errs = append(errs, run.Stop())
	}
	return errors.Join(errs...)
}

// touch records a contact: the hub is Connected once it listed its slices.
func (h *hub) touch() {
	h.lastContact.Store(time.Now().UnixNano())
	if h.listedOnce.Load() {
		h.setState(source.Connected, nil)
	}
}

func (h *hub) setState(to source.State, err error) {
	from := source.State(h.state.Swap(int32(to)))
	if from == to {
		return
	}
	if ev := h.r.cfg.Events.HubState; ev != nil {
		ev(h.name, from, to, err)
	}
	h.r.hubChanged() // the origins it reports on may change state
}

// sliceStore returns the store of part p of the hub's slices: each change
// updates the hub's index and the union of the origins it touches.
func (h *hub) sliceStore(p *slicePart) *ingest.Store[*slimSlice] {
	st := &ingest.Store[*slimSlice]{}
	st.Changed = func(old, s *slimSlice) {
		h.touch()
		if old == s {
			return
		}
		h.r.report(h.name, old, s)
		h.r.sliceChanged(h, old, s)
	}
	st.Deleted = func(s *slimSlice) {
		h.touch()
		h.r.sliceChanged(h, s, nil)
	}
	st.Replaced = func(old, objs map[string]*slimSlice) {
		for k, s := range objs {
			h.r.report(h.name, old[k], s)
		}
		h.r.slicesReplaced(h, p, old, objs)
		h.touch()
	}
	return st
}

// leaseStore returns the store of the hub's origin Leases.
func (h *hub) leaseStore() *ingest.Store[*slimLease] {
	st := &ingest.Store[*slimLease]{}
	st.Changed = func(old, l *slimLease) {
		h.touch()
		h.r.leaseChanged(h, old, l)
	}
	st.Deleted = func(l *slimLease) {
		h.touch()
		h.r.leaseChanged(h, l, nil)
	}
	st.Replaced = func(old, objs map[string]*slimLease) {
		h.r.leasesReplaced(h, objs)
		h.touch()
	}
	return st
}
