package mcsannotations

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coredns/coredns/plugin"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/serviceimport"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

const subsystem = pluginName

var (
	rejectedAnnotations = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "rejected_annotations_total",
		Help:      "Annotation entries skipped, by source cluster and reason.",
	}, []string{"cluster", "reason"})

	unencodableNames = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "unencodable_names_total",
		Help:      "Endpoints left out of SRV answers and endpoint names because their name cannot be encoded in DNS (a label over 63 octets, a name over 255), by source cluster; counted once per change of the record.",
	}, []string{"cluster"})

	sourceWatches = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "source_watches",
		Help:      "Pod watches a peer's source keeps: one per exporting namespace of the peer, or 1 when it reads every namespace.",
	}, []string{"cluster"})

	cappedRecords = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "capped_records",
		Help:      "Records left out of a namespace's answers by records_per_namespace, by namespace; only capped namespaces have a series.",
	}, []string{"namespace"})

	answers = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "answers_total",
		Help:      "Answers given, by server and kind (service, endpoint, srv, nxdomain, nodata, version, apex, nameserver, clustersetip).",
	}, []string{"server", "kind"})

	staleAnswers = newClusterCounters(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "stale_answers_total",
		Help:      "Answers holding records of a cluster whose source has been out of contact for longer than a short grace, by that cluster (an answer with two such clusters counts once for each), whether or not the query carried EDNS0 (only then does the reply carry Extended DNS Error 3, Stale Answer).",
	})

	refused = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "refused_total",
		Help:      "Queries refused (answered as names that do not exist) by imports enforce, by reason: unknown_client (not a known local Pod, not in an allowed CIDR) or not_allowed (the service does not allow the client's namespace; an alias to it resolves as no alias).",
	}, []string{"server", "reason"})

	services = promauto.NewGauge(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "services",
		Help:      "Services with at least one ready endpoint in the answer index.",
	})

	snapshotErrors = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "snapshot_errors_total",
		Help:      "Snapshot problems by kind: open (an attempt to open it failed: serving without it, trying again), moved_aside (unusable file renamed), damaged (found damaged while open: reopened), load, bad_record, encode.",
	}, []string{"kind"})

	snapshotOpen = promauto.NewGauge(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "snapshot_open",
		Help:      "1 while the snapshot file is open and written; 0 while it could not be opened (serving without it, trying again in the background).",
	})

	snapshotLoadSeconds = promauto.NewGauge(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "snapshot_load_seconds",
		Help:      "Time taken to open the snapshot and load it into the answer index at start-up.",
	})

	sourceExpirations = newClusterCounters(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "source_expirations_total",
		Help:      "Times a source's records were dropped after it was out of contact for longer than expire.",
	})

	slowStops = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "informer_slow_stops_total",
		Help:      "Reflector stops (shutdown, reload, expiry) not waited for to the end; each ends on its own in the background.",
	}, []string{"informer"})

	malformedLists = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "malformed_lists_total",
		Help:      "Lists that broke off or did not decode, and spells of a reader dropping new Pods for holding the most it may; what was held stays, and a list is made again.",
	}, []string{"informer"})

	watchExpirations = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "watch_expirations_total",
		Help:      "Times a reflector's watch expired (410), after which it lists every object again.",
	}, []string{"informer"})

	relistSeconds = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "relist_seconds",
		Help:      "Time each list of every object after a reflector's first took to arrive, from its start.",
		Buckets:   []float64{0.25, 0.5, 1, 2, 5, 10, 30, 60, 120},
	}, []string{"informer"})

	oversizedReplies = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "oversized_replies_total",
		Help:      "Replies from an API server refused at their bound (64 MiB for a reply read whole, 16 MiB for one object, 64 KiB for a list's metadata, more objects in a list than a reader holds); what was held stays.",
	})

	serviceImports = promauto.NewGauge(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "serviceimports",
		Help:      "ClusterSetIP services (local ServiceImports of type ClusterSetIP with IPs) in the answer index.",
	})

	rejectedImports = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "rejected_serviceimports_total",
		Help:      "Parts of ServiceImports ignored, by reason: malformed, invalid_type, invalid_ip, invalid_port.",
	}, []string{"reason"})

	relayRefused = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "relay_refused_total",
		Help:      "Records relayed by a hub and refused, by hub and reason (unsigned, bad_signature, replayed, malformed, ...); counted once per change of the record.",
	}, []string{"hub", "reason"})

	indexBuilds = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "index_builds_total",
		Help:      "Answer index rebuilds (bursts of changes coalesce into one).",
	})
)

// clusterCounters is a counter labelled by cluster alone, for the counters
// that every cluster has a series of from its start, relayed origins
// included (an edge reading hubs holds one for each origin): a series costs
// a map entry and a clusterCounter, where a prometheus.CounterVec's holds
// its label pairs and created timestamp as protobuf messages, several times
// more. Its exposition is a CounterVec's; series are never deleted.
type clusterCounters struct {
	desc *prometheus.Desc
	mu   sync.RWMutex
	by   map[string]*clusterCounter
}

// newClusterCounters returns the counter of opts (its ConstLabels ignored),
// registered with the default registry.
func newClusterCounters(opts prometheus.CounterOpts) *clusterCounters {
	c := makeClusterCounters(opts)
	prometheus.MustRegister(c)
	return c
}

func makeClusterCounters(opts prometheus.CounterOpts) *clusterCounters {
	return &clusterCounters{
		desc: prometheus.NewDesc(prometheus.BuildFQName(opts.Namespace, opts.Subsystem, opts.Name), opts.Help, []string{"cluster"}, nil),
		by:   map[string]*clusterCounter{},
	}
}

// WithLabelValues returns the series of cluster, made at 0 if new.
func (c *clusterCounters) WithLabelValues(cluster string) prometheus.Counter {
	c.mu.RLock()
	s := c.by[cluster]
	c.mu.RUnlock()
	if s != nil {
		return s
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s = c.by[cluster]; s == nil {
		s = &clusterCounter{desc: c.desc, cluster: cluster}
		c.by[cluster] = s
	}
	return s
}

func (c *clusterCounters) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *clusterCounters) Collect(ch chan<- prometheus.Metric) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, s := range c.by {
		ch <- s
	}
}

// clusterCounter is one series of a clusterCounters.
type clusterCounter struct {
	desc    *prometheus.Desc
	cluster string
	bits    atomic.Uint64 // the value's float64 bits
}

func (s *clusterCounter) Inc() { s.Add(1) }

// Add adds v, which must not be negative (as a prometheus.Counter's).
func (s *clusterCounter) Add(v float64) {
	if v < 0 {
		panic(errors.New("counter cannot decrease in value"))
	}
	for {
		old := s.bits.Load()
		if s.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

func (s *clusterCounter) Desc() *prometheus.Desc { return s.desc }

func (s *clusterCounter) Write(m *dto.Metric) error {
	return prometheus.MustNewConstMetric(s.desc, prometheus.CounterValue, math.Float64frombits(s.bits.Load()), s.cluster).Write(m)
}

func (s *clusterCounter) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }
func (s *clusterCounter) Collect(ch chan<- prometheus.Metric) { ch <- s }

// Per-source gauges are read at scrape time from the running sources, so a
// source removed by a reload leaves no stale series behind.
var (
	recordsDesc = prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, subsystem, "records"),
		"Pod records held per source cluster.", []string{"cluster"}, nil)
	stateDesc = prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, subsystem, "source_state"),
		"1 for the source's current state (syncing, connected, disconnected), 0 for the others.", []string{"cluster", "state"}, nil)
	writesDesc = prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, subsystem, "snapshot_writes_total"),
		"Snapshot batch commits since the file was opened.", nil, nil)
	writeErrorsDesc = prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, subsystem, "snapshot_write_errors_total"),
		"Failed snapshot commits since the file was opened (their changes are kept and retried).", nil, nil)
	pendingDesc = prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, subsystem, "snapshot_pending_changes"),
		"Record changes waiting for the next snapshot commit (grows while writes fail).", nil, nil)
	lastWriteDesc = prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, subsystem, "snapshot_last_write_timestamp_seconds"),
		"Unix time of the last successful snapshot commit.", nil, nil)
	hubStateDesc = prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, subsystem, "hub_state"),
		"1 for the hub's current state (syncing, connected, disconnected), 0 for the others.", []string{"hub", "state"}, nil)
	hubContactDesc = prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, subsystem, "hub_last_contact_seconds"),
		"Seconds since the hub's API server last answered (-1 if never).", []string{"hub"}, nil)
	originViaDesc = prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, subsystem, "origin_via"),
		"1 for each hub that relays the records of a cluster the plugin does not read itself.", []string{"cluster", "hub"}, nil)
	contactDesc = prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, subsystem, "source_last_contact_seconds"),
		"Seconds since the source's API server last answered (-1 if never).", []string{"cluster"}, nil)
)

type sourceCollector struct {
	mu   sync.Mutex
	live map[*MCS]struct{}
}

var collector = &sourceCollector{live: map[*MCS]struct{}{}}

func init() { prometheus.MustRegister(collector) }

func (c *sourceCollector) add(m *MCS)    { c.mu.Lock(); c.live[m] = struct{}{}; c.mu.Unlock() }
func (c *sourceCollector) remove(m *MCS) { c.mu.Lock(); delete(c.live, m); c.mu.Unlock() }

func (c *sourceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- recordsDesc
	ch <- stateDesc
	ch <- contactDesc
	ch <- hubStateDesc
	ch <- hubContactDesc
	ch <- originViaDesc
	ch <- writesDesc
	ch <- writeErrorsDesc
	ch <- lastWriteDesc
	ch <- pendingDesc
}

func (c *sourceCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]bool{} // a reload briefly runs two instances: report one
	snapshotSeen := false
	for m := range c.live {
		if st := m.store.Load(); st != nil && !snapshotSeen {
			snapshotSeen = true
			stats := st.Stats()
			ch <- prometheus.MustNewConstMetric(writesDesc, prometheus.CounterValue, float64(stats.Commits))
			ch <- prometheus.MustNewConstMetric(writeErrorsDesc, prometheus.CounterValue, float64(stats.WriteErrors))
			ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(stats.Pending))
			if !stats.LastWrite.IsZero() {
				ch <- prometheus.MustNewConstMetric(lastWriteDesc, prometheus.GaugeValue, float64(stats.LastWrite.UnixNano())/1e9)
			}
		}
		counts := m.records.Len()
		for _, s := range m.sources {
			cl := s.Cluster()
			if seen[cl] {
				continue
			}
			seen[cl] = true
			ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.GaugeValue, float64(counts[cl]), cl)
			collectContact(ch, stateDesc, contactDesc, s.State(), s.LastContact(), cl)
		}
		m.collectHubs(ch, seen, counts)
	}
}

// collectContact reports a state gauge (1 for state, 0 for the others) and
// the seconds since last (-1: never) of the one labelled label.
func collectContact(ch chan<- prometheus.Metric, stateDesc, contactDesc *prometheus.Desc, state source.State, last time.Time, label string) {
	for _, st := range source.States {
		v := 0.0
		if state == st {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, v, label, st.String())
	}
	since := -1.0
	if !last.IsZero() {
		since = time.Since(last).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(contactDesc, prometheus.GaugeValue, since, label)
}

// snapshotErrorKinds are the kind label values of snapshot_errors_total.
var snapshotErrorKinds = []string{"open", "moved_aside", "damaged", "load", "bad_record", "encode"}

func init() {
	for _, r := range serviceimport.Reasons {
		rejectedImports.WithLabelValues(string(r))
	}
	for _, k := range snapshotErrorKinds {
		snapshotErrors.WithLabelValues(k)
	}
}

// Informer names, the informer label of the informer metrics.
const (
	clientsInformer = "clients"
	importsInformer = "serviceimports"
)

// clusterInformer names the informer of a source.
func clusterInformer(cluster string) string { return "cluster/" + cluster }

// registerClusterSeries creates, at 0, the series of a cluster's counters.
func registerClusterSeries(cl string) {
	sourceExpirations.WithLabelValues(cl)
	staleAnswers.WithLabelValues(cl)
	unencodableNames.WithLabelValues(cl)
	for _, r := range annotation.Reasons {
		rejectedAnnotations.WithLabelValues(cl, string(r))
	}
}

// registerSeries creates, at 0, every labelled series of m's clusters and
// informers before anything starts, so that an alert on a counter's increase
// sees its first event (Prometheus takes a series' first sample as its
// start). Series stay after a reload drops a cluster: counters are not reset.
func (m *MCS) registerSeries() {
	informers := []string{clientsInformer}
	for _, s := range m.sources {
		informers = append(informers, clusterInformer(s.Cluster()))
		registerClusterSeries(s.Cluster())
	}
	if m.relay != nil {
		informers = append(informers, hubsInformer)
		for _, h := range m.relay.Hubs() {
			for _, r := range relay.Reasons {
				relayRefused.WithLabelValues(h.Name, string(r))
			}
		}
	}
	for _, inf := range informers {
		watchExpirations.WithLabelValues(inf)
		malformedLists.WithLabelValues(inf)
		relistSeconds.WithLabelValues(inf)
		slowStops.WithLabelValues(inf)
	}
	if m.imports != nil {
		slowStops.WithLabelValues(importsInformer)
	}
}
