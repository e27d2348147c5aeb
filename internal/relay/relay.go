package relay

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// The reader of hubs: Relay follows the relay slices and origin Leases of
// one or more hubs and writes the records of every origin they hold into the
// record store, one origin at a time (store.ReplaceCluster), as a source
// does for the cluster it reads.
//
// Records of several hubs are one union: a Pod held by two hubs is one
// record, the statement with the larger Seq winning. While some hub is
// current on an origin (the reader is in contact with it and its Lease says
// it is in contact with the origin), the origin's union is that of the
// current hubs; otherwise that of every hub that listed: a record goes when
// no hub that counts holds it, and a hub cut off loses nothing while no
// other is current. A hub contributes nothing and removes nothing until its
// first list of slices arrived, and until every hub listed once no record
// is removed at all (records loaded from a snapshot stay).
//
// Under verify (Config.Keys), a record counts only when its origin's key
// signed its statement and export annotation for the slice's namespace and
// source-cluster label, and only when its statement is not older than one
// accepted for the same Pod (see ReasonReplayed); and a hub's Lease says
// its origin is connected only with the origin's recent signed heartbeat
// (heartbeat.go).

// Reasons of refusals a reader of hubs adds to annotation's.
const (
	// ReasonReplayed: under verify, a statement with a smaller Seq than one
	// accepted for the Pod (across every hub, deleted Pods included, see
	// TombstoneTTL), or with the same Seq and other bytes.
	ReasonReplayed annotation.Reason = "replayed"
	// ReasonMalformed: a relay annotation that does not parse, a slice
	// without a valid source-cluster label, or a Pod entry whose name or
	// statement is invalid or that the slice lists twice.
	ReasonMalformed annotation.Reason = "malformed_relay"
	// ReasonNoKey: under verify, a record of an origin that has no key.
	ReasonNoKey annotation.Reason = "unknown_origin"
	// ReasonLoop: a record whose relay path (Slice.Paths) names the reader
	// (it relayed the record itself: taking it back would let it loop) or
	// more than MaxPath hubs.
	ReasonLoop annotation.Reason = "relay_loop"
)

// Reasons lists every Reason Events.Refused may report, for metric labels.
var Reasons = append(slices.Clone(annotation.Reasons), ReasonReplayed, ReasonMalformed, ReasonNoKey, ReasonHeartbeat, ReasonStaleHeartbeat, ReasonLoop, ReasonUnlisted, ReasonNoPodList, ReasonWithheldPodList)

// TombstoneTTL is how long the Seq of a deleted record is remembered, so
// that an older statement of it that a lagging or hostile hub presents is
// refused (ReasonReplayed) rather than brought back. At most
// ingest.MaxObjects statements (live and deleted) are remembered per origin;
// the oldest tombstones go first. A variable for tests.
var TombstoneTTL = 24 * time.Hour

// MaxNamespaces bounds Config.Namespaces: the watches a reader holds on
// each hub, as source.Options.MaxNamespaces bounds a scoped source's.
const MaxNamespaces = 1000

// DefaultNamespace is where a hub keeps its origin Leases unless AddHub
// says otherwise.
const DefaultNamespace = metav1.NamespaceSystem

// Config configures a Relay.
type Config struct {
	// Local is the reader's own cluster: relayed records of it are ignored.
	Local string
	// Direct reports the clusters the reader reads directly: relayed
	// records of them are ignored. May be nil.
	Direct func(cluster string) bool
	// Keys, when non-nil, turns verify on: a record counts only when its
	// endpoint statement is signed by its origin's key; an origin without
	// a key is refused (ReasonNoKey); and a hub's Lease says its origin is
	// connected only while it carries a heartbeat signed by the origin's
	// key, not older than HeartbeatTimeout (heartbeat.go).
	Keys map[string]ed25519.PublicKey
	// HeartbeatTimeout, under verify, is how old an origin's heartbeat may
	// be for a hub's word that the origin is connected to count
	// (DefaultHeartbeatTimeout when 0). It should be a few of the origins'
	// heartbeat intervals.
	HeartbeatTimeout time.Duration
	// RequirePodLists, under verify, takes a hub's word that an origin is
	// connected only with a Pod list that verifies, as new as its
	// heartbeat, from the start (podlist.go): as if a list of every origin
	// had been seen. For fleets whose origins and hubs all write lists: it
	// closes the gap of a hub that withholds them from a reader's first
	// start, or after its restart.
	RequirePodLists bool
	// RequirePodUIDLists, under verify, requires lists by UID from the
	// start, as if one of every origin had been seen (it implies
	// RequirePodLists): for fleets whose origins and hubs all write them,
	// so that no hub keeps the old statement of a Pod made again under its
	// name by stripping them from a reader's first start.
	RequirePodUIDLists bool
	// Namespaces, when not empty, limits what the reader takes from every
	// hub to the relay slices of these namespaces: one watch per namespace
	// on each hub, so that the hub's API server filters and the slices of
	// other namespaces never cross the link (and the reader's credential
	// on the hub needs only a Role in each). At most MaxNamespaces, each a
	// namespace name, none twice.
	Namespaces []string
	// KeepProof gives each record a store.Common of its own carrying the
	// origin's bytes it came with and its relay path (store.Proof), so that
	// a reader that is itself a hub relays it further
	// (source.Options.KeepProof for relayed records). Off, records share
	// their service's Common and carry nothing more: an edge pays nothing.
	KeepProof bool
	// Events hears of refusals and state changes.
	Events Events
	// Ingest tunes the reflectors of every hub, as those of every reader of
	// a cluster (its Failed event turns the hub Disconnected).
	Ingest ingest.Options
	// Contact tunes the /readyz check of each hub: ProbeInterval,
	// ProbeTimeout, ReconnectInterval and Check (see source.Options and
	// source.Contact); its other fields are ignored. Check, when set, is
	// called for every hub.
	Contact source.Options
}

// Events are what a Relay reports; each may be nil. They are called from
// the Relay's goroutines and must not block.
type Events struct {
	// Refused hears of a record refused (pod is "" for a whole slice; hub
	// is "" for a Pod refused because the reader remembers ingest.MaxObjects
	// Pods of its origin already, annotation.ReasonTooMany),
	// once per change of what the hub holds, not per resync: unsigned, bad
	// signature (altered, forged, or moved to another namespace or cluster
	// than the signed ones), replayed, malformed, unknown origin, looping
	// (a relay path naming the reader or too long), or an export entry the
	// parse refused (annotation.Reason*).
	Refused func(hub, origin, namespace, pod string, r annotation.Rejection)
	// HubState hears of a hub's transitions, with the error that caused it
	// if any.
	HubState func(hub string, from, to source.State, err error)
	// OriginState hears of an origin's transitions, as the hubs report it
	// (see Origin).
	OriginState func(origin string, from, to source.State)
	// Remembered hears, under verify, of the changes of an origin's replay
	// memory (see Memory): what it now remembers of the Pods in set, and
	// the Pods it forgot (their tombstones expired, or made room). Called
	// in the order of the changes, for a store that keeps the memory
	// across restarts (SeedMemory).
	Remembered func(origin string, set []Remembered, forgotten []string)
	// OriginChanged hears that what Origin says of origin may have changed
	// (its state, hubs, last contact while not connected, records, or that
	// it was forgotten): after each write of it, whatever caused the write
	// (a slice or Lease of it, a hub's state, Expire). It carries no view:
	// the listener asks Origin, so that it always ends with the latest.
	OriginChanged func(origin string)
}

// Origin is what a Relay knows of one origin cluster.
type Origin struct {
	Cluster string
	// Hubs are the hubs holding it now (a slice or a Lease of it), sorted.
	Hubs []string
	// State is Connected while some connected hub's Lease says connected;
	// Disconnected when a Lease says so, or says connected on a hub that is
	// disconnected, or when every hub listed and none holds it (a Lease or
	// a slice); Syncing otherwise (no Lease yet, or one saying syncing), as
	// a source before its first list. Under verify a Lease says
	// connected only with a recent heartbeat (Config.HeartbeatTimeout);
	// without one it counts as saying disconnected.
	State source.State
	// LastContact is now (the latest contact with a hub whose Lease says
	// connected) while Connected; otherwise the latest of each hub's
	// renewTime of a Lease saying otherwise, each hub's last contact while
	// its Lease said connected, and the snapshot's (Seed). Under verify it
	// is the newest heartbeat of the origin that verifies any hub holds,
	// or the snapshot's. Once no hub holds the origin, it is the last
	// contact they gave.
	LastContact time.Time
	// Records is the number of the origin's records written.
	Records int
	// Expired: Expire dropped its records, and no hub has been current on
	// it since.
	Expired bool
}

// Hub is the state of one hub, as a source's.
type Hub struct {
	Name        string
	State       source.State
	LastContact time.Time
	// Synced: its first list of slices arrived (never reset).
	Synced bool
	// Origins is the number of origins it holds (a slice or a Lease).
	Origins int
}

// Relay reads hubs into a record store.
type Relay struct {
	records *store.Store
	cfg     Config

	// write serialises the store's writes (taken before mu, held while
	// they are made, once mu is released: Origins and Hubs never wait on
	// the store's subscribers).
	write sync.Mutex

	mu        sync.Mutex
	hubs      []*hub // sorted by name
	started   bool
	stopped   bool
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	origins   map[string]*origin
	allSynced bool
	// beats is, under verify, the refusal last reported of each hub's
	// Lease of each origin ("" when taken), by hub and origin (heartbeat.go).
	beats map[beatKey]string
	// lists is, under verify, the Pod list refusal last reported of each
	// hub's Lease of each origin (podlist.go), by hub and origin.
	lists map[beatKey]string
	// paths is the relay path refusal last reported of each hub's Lease of
	// each origin (path.go), by hub and origin.
	paths map[beatKey]string
}

// New returns a Relay writing into records; AddHub adds its hubs, Start
// starts it.
func New(records *store.Store, cfg Config) *Relay {
	return &Relay{records: records, cfg: cfg, origins: map[string]*origin{}, beats: map[beatKey]string{}, lists: map[beatKey]string{}, paths: map[beatKey]string{}}
}

// AddHub adds a hub, read with client (made by ingest.Reader.Pods, the
// client every reader of a cluster uses), whose origin Leases are in
// namespace (DefaultNamespace when empty). Before Start only.
func (r *Relay) AddHub(name string, client kubernetes.Interface, namespace string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.started:
		return errors.New("relay already started")
	case name == "" || client == nil:
		return errors.New("a hub needs a name and a client")
	}
	if namespace == "" {
		namespace = DefaultNamespace
	}
	for _, h := range r.hubs {
		if h.name == name {
			return fmt.Errorf("hub %q added twice", name)
		}
	}
	r.hubs = append(r.hubs, newHub(r, name, client, namespace))
	slices.SortFunc(r.hubs, func(a, b *hub) int { return cmpString(a.name, b.name) })
	return nil
}

// Start starts reading every hub in the background and returns at once.
func (r *Relay) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("relay already started")
	}
	if err := CheckNamespaces(r.cfg.Namespaces); err != nil {
		return err
	}
	r.started = true
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	for _, h := range r.hubs {
		h.start(ctx, &r.wg)
	}
	if r.cfg.Keys != nil {
		r.wg.Go(func() { r.runHeartbeats(ctx) })
	}
	return nil
}

// Stop stops every hub's reflectors and checks and waits for them, each
// reflector at most its StopWait (the error then wraps ingest.ErrSlow). The
// records written stay in the store.
func (r *Relay) Stop() error {
	r.mu.Lock()
	if !r.started || r.stopped {
		r.mu.Unlock()
		return nil
	}
	r.stopped = true
	r.cancel()
	hubs := slices.Clone(r.hubs)
	r.mu.Unlock()
	errs := make([]error, len(hubs))
	var wg sync.WaitGroup
	for i, h := range hubs {
		wg.Go(func() { errs[i] = h.stop() })
	}
	wg.Wait()
	r.wg.Wait()
	return errors.Join(errs...)
}

// Seed sets an origin's last contact from a snapshot, until a hub says
// more; a later contact replaces it. It also names the origin as one the
// hubs relay: once every hub listed once, its records that no hub holds go
// (records of a cluster neither seeded nor held by a hub are never touched).
func (r *Relay) Seed(origin string, lastContact time.Time) {
	if r.ignored(origin) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.origin(origin)
	if lastContact.After(o.seed) {
		o.seed = lastContact
	}
}

// Expire drops the records of origin from the store (for a reader's
// expire setting) and keeps them out until some hub is current on the
// origin again (listed, in contact, and its Lease says it is in contact
// with the origin): then the hubs' union comes back. False when the Relay
// knows no such origin.
func (r *Relay) Expire(origin string) bool {
	known := false
	r.locked(func(out *later) {
		o := r.origins[origin]
		if o == nil {
			return
		}
		known = true
		o.expired = true
		r.syncOrigin(origin, out)
	})
	return known
}

// Origins returns what the Relay knows of each origin, sorted by cluster.
func (r *Relay) Origins() []Origin {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Origin, 0, len(r.origins))
	for name := range r.origins {
		out = append(out, r.originLocked(name))
	}
	slices.SortFunc(out, func(a, b Origin) int { return cmpString(a.Cluster, b.Cluster) })
	return out
}

// originLocked is what the Relay knows of origin name, which it holds;
// r.mu is held.
func (r *Relay) originLocked(name string) Origin {
	o := r.origins[name]
	v := r.viewLocked(name)
	return Origin{Cluster: name, Hubs: v.hubs, State: v.state, LastContact: v.last, Records: o.records, Expired: o.expired}
}

// Hubs returns the state of each hub, sorted by name.
func (r *Relay) Hubs() []Hub {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Hub, 0, len(r.hubs))
	for _, h := range r.hubs {
		n := len(h.byOrigin)
		for o := range h.leases {
			if _, ok := h.byOrigin[o]; !ok {
				n++
			}
		}
		out = append(out, Hub{Name: h.name, State: h.State(), LastContact: h.LastContact(), Synced: h.listed, Origins: n})
	}
	return out
}

// ignored reports whether relayed records of cluster are ignored: the
// reader's own, or one it reads directly.
func (r *Relay) ignored(cluster string) bool {
	return cluster == r.cfg.Local || (r.cfg.Direct != nil && r.cfg.Direct(cluster))
}

// CheckNamespaces checks a Config.Namespaces: at most MaxNamespaces
// namespace names, none twice.
func CheckNamespaces(namespaces []string) error {
	if len(namespaces) > MaxNamespaces {
		return fmt.Errorf("%d namespaces, more than %d", len(namespaces), MaxNamespaces)
	}
	seen := make(map[string]bool, len(namespaces))
	for _, ns := range namespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("namespace %q: %s", annotation.Clip(ns), errs[0])
		}
		if seen[ns] {
			return fmt.Errorf("namespace %q named twice", ns)
		}
		seen[ns] = true
	}
	return nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
