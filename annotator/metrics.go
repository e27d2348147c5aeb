package annotator

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the annotator's Prometheus metrics, under mcs_annotator_.
type Metrics struct {
	Leader           prometheus.Gauge
	ExportedServices prometheus.Gauge
	AnnotatedPods    prometheus.Gauge
	ImporterPods     prometheus.Gauge
	PodWrites        *prometheus.CounterVec
	// EndpointStatements counts the endpoint statements written (--sign-endpoints).
	EndpointStatements prometheus.Counter
	StatusWrites       *prometheus.CounterVec
	Reconciles         *prometheus.CounterVec
	Skipped            *prometheus.CounterVec
	PeerGrants         prometheus.Gauge
	GrantWrites        *prometheus.CounterVec
	// HeartbeatWrites counts the writes of the heartbeat Lease (--sign-endpoints).
	HeartbeatWrites *prometheus.CounterVec
}

// NewMetrics makes the metrics and registers them with reg (when not nil).
// Every label value is set up front, so that each series reads 0 before its
// first event.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns = "mcs_annotator"
	m := &Metrics{
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "leader",
			Help: "1 while this annotator holds the lease and writes, else 0."}),
		ExportedServices: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "exported_services",
			Help: "Services exported (annotation multicluster.kubernetes.io/export or a ServiceExport), as of the leader's last reconcile of each namespace."}),
		AnnotatedPods: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "annotated_pods",
			Help: "Pods that an exported Service selects, as of the leader's last reconcile of each namespace."}),
		ImporterPods: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "importer_pods",
			Help: "Pods with an import annotation (which get the importer label), as of the leader's last reconcile of each namespace."}),
		PodWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "pod_writes_total",
			Help: "Server-side applies of a Pod's export annotation and labels (or of their removal), by result."}, []string{"result"}),
		EndpointStatements: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "endpoint_statements_total",
			Help: "Signed endpoint statements written onto Pods (--sign-endpoints): one per change of an exported Pod's addresses, hostname, readiness or export annotation."}),
		StatusWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "status_writes_total",
			Help: "Updates of a ServiceExport's status conditions, by result."}, []string{"result"}),
		Reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reconciles_total",
			Help: "Reconciles of a namespace, by result (an error retries with backoff)."}, []string{"result"}),
		Skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "skipped_total",
			Help: "Exports or ports left out, by reason, counted once per change (each also logged once)."}, []string{"reason"}),
		PeerGrants: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "peer_grants",
			Help: "Namespaces whose Pods the peer reader may read (each with at least one exported Service), as of the leader's last sync of the grants."}),
		GrantWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "grant_writes_total",
			Help: "Writes of the peer reader's RoleBindings and of the list of exporting namespaces, by result."}, []string{"result"}),
		HeartbeatWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "heartbeat_writes_total",
			Help: "Writes of the signed heartbeat Lease kube-system/mcs-heartbeat (--sign-endpoints), one per --heartbeat-interval, by result."}, []string{"result"}),
	}
	for _, r := range []string{"ok", "error"} {
		m.PodWrites.WithLabelValues(r)
		m.StatusWrites.WithLabelValues(r)
		m.Reconciles.WithLabelValues(r)
		m.GrantWrites.WithLabelValues(r)
		m.HeartbeatWrites.WithLabelValues(r)
	}
	for _, r := range skipReasons {
		m.Skipped.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.Leader, m.ExportedServices, m.AnnotatedPods, m.ImporterPods, m.PodWrites, m.EndpointStatements, m.StatusWrites, m.Reconciles, m.Skipped, m.PeerGrants, m.GrantWrites, m.HeartbeatWrites)
	}
	return m
}
