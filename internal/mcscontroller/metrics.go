package mcscontroller

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcsannotations/mcsannotations/internal/relay"
)

// Metrics are the controller's metrics, under mcs_controller_.
type Metrics struct {
	Imports   prometheus.Gauge
	Slices    prometheus.Gauge
	Conflicts prometheus.Gauge
	Writes    *prometheus.CounterVec // by kind and result
	Foreign   prometheus.Counter
	Reconcile prometheus.Histogram
	// Refused counts what was refused or left out, by reason, once per
	// change (a service still refused is not counted again); RefusedNow
	// are the services refused for a cap now; Deferred counts the times a
	// changed service waited (damping, or the backoff of a failed write).
	Refused    *prometheus.CounterVec
	RefusedNow prometheus.Gauge
	Deferred   prometheus.Counter
	// SnapshotErrors counts the snapshot's problems (--snapshot-dir), by
	// kind (snapshotErrorKinds).
	SnapshotErrors *prometheus.CounterVec

	// sources are read at scrape time for the clusters' last contact (set
	// by New; none before).
	sources atomic.Pointer[func() ([]Source, bool)]
	// hubs are read at scrape time for the hubs' metrics (none without).
	hubs atomic.Pointer[relay.Relay]
}

var contactDesc = prometheus.NewDesc("mcs_controller_cluster_last_contact_seconds",
	"Seconds since the cluster's API server last answered the controller (-1 if never), by cluster (the local one, each peer, and each origin read through relay hubs, as the hubs report it).", []string{"cluster"}, nil)

// contact is the collector of mcs_controller_cluster_last_contact_seconds.
type contact struct{ m *Metrics }

func (c contact) Describe(ch chan<- *prometheus.Desc) { ch <- contactDesc }

func (c contact) Collect(ch chan<- prometheus.Metric) {
	srcs := c.m.sources.Load()
	if srcs == nil {
		return
	}
	all, _ := (*srcs)()
	for _, s := range all {
		since := -1.0
		if t := s.LastContact(); !t.IsZero() {
			since = time.Since(t).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(contactDesc, prometheus.GaugeValue, since, s.Cluster())
	}
}

// writeKinds are the kinds of write, pre-registered with both results.
var writeKinds = []string{"serviceimport", "serviceimport_status", "service", "endpointslice",
	"serviceimport_delete", "service_delete", "endpointslice_delete", "serviceexport_status"}

// NewMetrics registers the controller's metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Imports: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mcs_controller_serviceimports",
			Help: "ServiceImports the controller keeps in the local cluster."}),
		Slices: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mcs_controller_endpointslices",
			Help: "EndpointSlices the controller keeps in the local cluster (kept ones of unreachable clusters included)."}),
		Conflicts: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mcs_controller_conflicts",
			Help: "Exported services whose clusters' exports conflict (KEP-1645)."}),
		Writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mcs_controller_writes_total",
			Help: "Writes to the local API server, by kind and result (ok or error)."}, []string{"kind", "result"}),
		Foreign: prometheus.NewCounter(prometheus.CounterOpts{Name: "mcs_controller_foreign_objects_total",
			Help: "ServiceImports, Services or EndpointSlices of the name it would write that it did not make for that service, left alone."}),
		Reconcile: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mcs_controller_reconcile_seconds",
			Help: "Time of one reconcile: of the services that changed, or of every exported service (at the start, on the resync, when a cluster's state changes).", Buckets: prometheus.ExponentialBuckets(0.001, 4, 8)}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mcs_controller_refused_total",
			Help: "What the controller refused to write or left out, by reason, counted when it starts or changes."}, []string{"reason"}),
		RefusedNow: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mcs_controller_refused_services",
			Help: "Exported services (or clusters' shares of them) not imported now because a namespace or a source cluster reached its cap."}),
		SnapshotErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mcs_controller_snapshot_errors_total",
			Help: "Snapshot problems by kind: open (it could not be opened: running without it), moved_aside (an unusable file renamed), load, bad_record (a record skipped at the restore), encode (a record left out of the file)."}, []string{"kind"}),
		Deferred: prometheus.NewCounter(prometheus.CounterOpts{Name: "mcs_controller_deferred_total",
			Help: "Changed services that waited before being written: damping of a service that keeps changing, or the backoff of its failed writes."}),
	}
	for _, r := range refusalReasons {
		m.Refused.WithLabelValues(r)
	}
	for _, k := range snapshotErrorKinds {
		m.SnapshotErrors.WithLabelValues(k)
	}
	for _, k := range writeKinds {
		m.Writes.WithLabelValues(k, "ok")
		m.Writes.WithLabelValues(k, "error")
	}
	if reg != nil {
		reg.MustRegister(m.Imports, m.Slices, m.Conflicts, m.Writes, m.Foreign, m.Reconcile, m.Refused, m.RefusedNow, m.Deferred, m.SnapshotErrors, contact{m}, hubCollector{m})
	}
	return m
}

func (m *Metrics) write(kind string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.Writes.WithLabelValues(kind, result).Inc()
}

func (m *Metrics) observe(imports, slices, conflicts, refused int, took time.Duration) {
	m.Imports.Set(float64(imports))
	m.RefusedNow.Set(float64(refused))
	m.Slices.Set(float64(slices))
	m.Conflicts.Set(float64(conflicts))
	m.Reconcile.Observe(took.Seconds())
}
