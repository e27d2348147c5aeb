package mcsannotations

import (
	"sync"
	"time"

	"github.com/coredns/coredns/plugin"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

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

	answers = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "answers_total",
		Help:      "Answers given, by server and kind (service, endpoint, srv, nxdomain, nodata, version, apex, nameserver, clustersetip).",
	}, []string{"server", "kind"})

	refused = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "refused_total",
		Help:      "Queries refused (NXDOMAIN) by imports enforce, by reason: unknown_client (not a known local Pod, not in an allowed CIDR) or not_imported.",
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
		Help:      "Snapshot problems by kind: open (could not open: serving without), moved_aside (unusable file renamed), damaged (found damaged while open: reopened), load, bad_record, encode.",
	}, []string{"kind"})

	snapshotLoadSeconds = promauto.NewGauge(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "snapshot_load_seconds",
		Help:      "Time taken to open the snapshot and load it into the answer index at start-up.",
	})

	sourceExpirations = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "source_expirations_total",
		Help:      "Times a source's records were dropped after it was out of contact for longer than expire.",
	}, []string{"cluster"})

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
		Help:      "Lists of Pods that broke off, did not decode or were over their size bound; what was held stays, and the list is made again.",
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
		Help:      "Replies from an API server refused at their size bound (64 MiB for a reply read whole, 16 MiB for one object); what was held stays.",
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

	indexBuilds = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: subsystem,
		Name:      "index_builds_total",
		Help:      "Answer index rebuilds (bursts of changes coalesce into one).",
	})
)

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
		counts := m.table.Len()
		for _, s := range m.sources {
			cl := s.Cluster()
			if seen[cl] {
				continue
			}
			seen[cl] = true
			ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.GaugeValue, float64(counts[cl]), cl)
			for _, st := range source.States {
				v := 0.0
				if s.State() == st {
					v = 1
				}
				ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, v, cl, st.String())
			}
			since := -1.0
			if t := s.LastContact(); !t.IsZero() {
				since = time.Since(t).Seconds()
			}
			ch <- prometheus.MustNewConstMetric(contactDesc, prometheus.GaugeValue, since, cl)
		}
	}
}

func init() {
	for _, r := range serviceimport.Reasons {
		rejectedImports.WithLabelValues(string(r))
	}
}
