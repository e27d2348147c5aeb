// Package mcscontroller is each cluster's MCS controller (docs/DESIGN.md):
// from the export annotations of the local cluster and of every peer, read
// into a table by the plugin's own sources, it keeps in the local cluster a
// ServiceImport per exported service, the derived Service whose ClusterIPs
// are a ClusterSetIP service's ClusterSetIPs, the EndpointSlices of every
// exporting cluster, and the Conflict condition of the local ServiceExports.
//
// What a cluster that cannot be reached exported stays as last written: its
// records stay in the table while it is cut, and across a restart the
// snapshot (--snapshot-dir, RestoreSnapshot) gives them back; without one, a
// cluster that has not answered since the controller started keeps its
// EndpointSlices as they are, never rebuilt from them nor removed. Only a
// cluster that answers and no longer exports a service takes its share away
// (or one past its expiry, when the operator set one).
package mcscontroller

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/store"
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
	// Pods has reached the table in this process: only then is the table's
	// view of the cluster its current share.
	HasSynced() bool
	// LastContact is when the cluster's API server last answered.
	LastContact() time.Time
	// Connected says whether the cluster's API server answers now (the
	// services' stale policies count from when it stopped).
	Connected() bool
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
	// takes part in (default 20000); negative: no cap. Over a cap, a new service (or a
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
	// Recorder, when set, records Events for what is refused (on the local
	// ServiceExport, else the ServiceImport) and for conflicts (on both).
	Recorder record.EventRecorder
	// Relay makes this cluster a relay hub (internal/relay): each
	// EndpointSlice it writes carries relay.SliceAnnotation, the origin
	// Pods' own bytes (the records' store.Proof: the sources must keep it),
	// in slices of at most clusterset.RelayEndpointsPerSlice endpoints; and
	// it keeps one Lease per source cluster in RelayNamespace, written at
	// the start and on each change of the cluster's state, and deleted
	// once the cluster has been neither read nor relayed for LeaseGrace.
	Relay          bool
	RelayNamespace string
	// LeaseGrace, for a relay hub, is how long a cluster it neither reads
	// nor relays any more keeps its Lease before the hub deletes it
	// (hublease.go; default 1m).
	LeaseGrace time.Duration
	// Heartbeats, for a relay hub, are the clients of the source clusters
	// (those the sources read with, ingest.Reader.Pods), by cluster ID,
	// whose heartbeat Lease the hub copies into its Lease of the cluster
	// (heartbeat.go). A cluster without a client has no heartbeat relayed:
	// edges that verify then take it as cut off.
	Heartbeats map[string]kubernetes.Interface
	// HeartbeatWait bounds how long a cluster's first Lease write waits for
	// the first list of its heartbeat (0: DefaultHeartbeatWait).
	HeartbeatWait time.Duration
	// Hubs, when set, is the reader of the relay hubs this cluster reads
	// (internal/relay), writing into the same records: each origin it knows
	// is a source cluster too (see relayedOrigin). The caller starts and
	// stops it.
	Hubs *relay.Relay
	// Restored are the clusters whose records RestoreSnapshot put back
	// from the snapshot: until they list, their records are their
	// current share, as before the restart. Any other cluster not heard
	// from since the start keeps its slices as they are (heldSlices).
	Restored map[string]bool
}

// Controller keeps the MCS objects of the local cluster.
type Controller struct {
	cfg Config
	// index is the records by service, from the record store's change
	// feed (indexRecords).
	index   *recordIndex
	sources []Source
	// directs are the sources' clusters (direct): a hub's service of a
	// thousand origins asks for each.
	directs map[string]bool
	client  kubernetes.Interface
	dyn     dynamic.Interface
	disco   discovery.DiscoveryInterface
	metrics *Metrics
	started time.Time

	// queue holds the services to sync (keyed by service; keyAll,
	// keyRecords and namespaceKey for what concerns many), deduplicated
	// while they wait, delayed while a service's writes are damped or
	// backed off (retry is its rate limiter: each service's backoff after
	// a failed write).
	queue workqueue.TypedRateLimitingInterface[clusterset.Key]
	retry workqueue.TypedRateLimiter[clusterset.Key]
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

	// What the last reconcile saw and did; only Reconcile touches these,
	// holding reconciling (one reconcile at a time).
	reconciling sync.Mutex
	done        map[clusterset.Key]*outcome
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
	// damp and notBefore pace each service's writes of its ServiceImport,
	// derived Service and deletes, shareDamp and shareNotBefore each
	// cluster's share's slices: a service queued before its time waits in
	// the queue until then, a share's slices stay as they are (the other
	// shares are written). headless is when a ClusterSetIP service whose
	// derived Service is kept turned Headless.
	damp           map[clusterset.Key]*damping
	notBefore      map[clusterset.Key]time.Time
	shareDamp      map[shareKey]*damping
	shareNotBefore map[shareKey]time.Time
	headless       map[clusterset.Key]time.Time
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
	// wrote: the sync wrote the ServiceImport or the derived Service (the
	// service's damping counts it); wroteShares: the clusters whose slices
	// it wrote (each share's damping); due: when the earliest share it
	// left as stored for its damping is due (zero: none).
	wrote       bool
	wroteShares []string
	due         time.Time
	// notes are what the sync left out, reported after it.
	notes notes
	// importUID is the UID of the ServiceImport the sync wrote (its Events' object).
	importUID types.UID
	// memo is, per source cluster, what the last sync found written of its
	// share (syncService): the next sync builds no slice of a share whose
	// records and inputs are the same and whose slices are as found then.
	memo map[string]*sliceMemo
}

// sliceMemo is what a sync found written of one cluster's share of a
// service: the inputs it built the slices from (sum: a hash of all but the
// records; recs: the share's records, each a pointer the records' store
// replaces on any change) and each slice's name and the resourceVersion it
// had once it was checked or written. A slice changed by anyone since has
// another resourceVersion.
type sliceMemo struct {
	sum    uint64
	recs   []*store.Pod
	slices []memoSlice
}

type memoSlice struct{ key, rv string }

func (o *outcome) addSlice(s *discoveryv1.EndpointSlice) {
	o.slices = append(o.slices, s.Namespace+"/"+s.Name)
}

// hasSliceUnsorted says whether o holds the slice ns/name, before the
// reconcile sorts o.slices.
func (o *outcome) hasSliceUnsorted(ns, name string) bool {
	return slices.Contains(o.slices, ns+"/"+name)
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

// New returns a controller over the records that sources feed (one per
// cluster, the local one included).
func New(rs records, sources []Source, client kubernetes.Interface, dyn dynamic.Interface, disco discovery.DiscoveryInterface, cfg Config, m *Metrics) *Controller {
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
	if cfg.LeaseGrace <= 0 {
		cfg.LeaseGrace = time.Minute
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
	c := &Controller{cfg: cfg, sources: sources, client: client, dyn: dyn, disco: disco, metrics: m,
		ready: make(chan struct{}),
		done:  map[clusterset.Key]*outcome{}, perNS: map[string]int{}, perCluster: map[string]int{}, refused: map[clusterset.Key]bool{},
		said: map[clusterset.Key]notes{}, damp: map[clusterset.Key]*damping{}, notBefore: map[clusterset.Key]time.Time{},
		shareDamp: map[shareKey]*damping{}, shareNotBefore: map[shareKey]time.Time{},
		headless: map[clusterset.Key]time.Time{}, refusedNS: map[string]bool{},
		retry: workqueue.NewTypedItemExponentialFailureRateLimiter[clusterset.Key](cfg.Interval, cfg.RetryMax)}
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(c.retry, workqueue.TypedRateLimitingQueueConfig[clusterset.Key]{Name: "mcs-controller"})
	c.directs = make(map[string]bool, len(sources))
	for _, s := range sources {
		c.directs[s.Cluster()] = true
	}
	c.queue.Add(keyAll) // the first sync looks at every service
	for _, ns := range cfg.RefusedNamespaces {
		c.refusedNS[ns] = true
	}
	c.index = indexRecords(rs, func() { c.queue.Add(keyRecords) })
	all := c.allSources
	m.sources.Store(&all)
	if cfg.Hubs != nil {
		m.hubs.Store(cfg.Hubs)
	}
	return c
}
