package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// The annotator tests (docs/DESIGN.md#the-annotator; the contract of
// bin/mcs-annotator): real Services, ServiceExports and Pods in edge-a, the
// annotator writing the export annotations, and bin/coredns answering from
// what it wrote.

// annotatorPropagation bounds how long the annotator may take to bring a
// change in Services, ServiceExports or Pods onto the Pods (or the status).
const annotatorPropagation = 15 * time.Second

// Short leader-election timings: hand-overs within seconds.
var fastLease = []string{"--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms"}

// startAnnotator runs bin/mcs-annotator on edge-a with --cluster edge-a and
// the extra flags.
func startAnnotator(t *testing.T, c *harness.Cluster, extra ...string) *harness.Annotator {
	t.Helper()
	a := harness.StartAnnotator(t, c.Kubeconfig, append([]string{"--cluster", clusterID}, extra...)...)
	t.Cleanup(func() {
		if t.Failed() {
			return // the harness prints the tail of its log
		}
		if !a.Running() {
			t.Logf("annotator %s is not running at the end of the test", a.Addr())
		}
	})
	return a
}

// tcpPort is a Service port name -> targetPort (a number or a container port name).
func tcpPort(name string, port int32, target intstr.IntOrString) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, TargetPort: target, Protocol: corev1.ProtocolTCP}
}

// exportedService is a ClusterIP Service with the annotation
// multicluster.kubernetes.io/export set to value (none when empty).
func exportedService(ns, name, value string, selector map[string]string, ports ...corev1.ServicePort) *corev1.Service {
	s := harness.ServiceObject(ns, name, selector, ports...)
	if value != "" {
		s.Annotations = map[string]string{harness.ServiceExportAnnotation: value}
	}
	return s
}

// plainPod creates a Pod with these labels and, when ports are given, one
// container with exactly these ports (else the harness's default container,
// port "http" 8080), and makes it Running and Ready with ip.
func plainPod(t *testing.T, c *harness.Cluster, ns, name, ip string, labels map[string]string, ports ...corev1.ContainerPort) {
	t.Helper()
	p := harness.Pod{Name: name, Labels: labels}.Object(ns)
	if len(ports) > 0 {
		p.Spec.Containers[0].Ports = ports
	}
	c.CreatePodObject(t, p)
	c.SetPodReady(t, ns, name, true, ip)
}

func containerPort(name string, port int32) corev1.ContainerPort {
	return corev1.ContainerPort{Name: name, ContainerPort: port, Protocol: corev1.ProtocolTCP}
}

// export is one entry as the annotator must write it for a ClusterIP
// Service: every field explicit (exportedAt, the API server's time, is
// checked apart).
func export(name, ns string, ports ...annotation.Port) annotation.Export {
	return annotation.Export{Name: name, Namespace: ns, Cluster: clusterID, Ports: ports,
		Service: annotation.Service{Type: annotation.TypeClusterSetIP}}
}

func port(name string, p, target int32) annotation.Port {
	return annotation.Port{Name: name, Port: p, TargetPort: target, Protocol: "TCP"}
}

// strictEntry is the export annotation's entry with every field the contract
// says the annotator writes, none defaulted: pointers tell absent from zero.
type strictEntry struct {
	Name      *string `json:"name"`
	Namespace *string `json:"namespace"`
	Cluster   *string `json:"cluster"`
	Ports     []struct {
		Name       *string `json:"name"`
		Port       *int32  `json:"port"`
		TargetPort *int32  `json:"targetPort"`
		Protocol   *string `json:"protocol"`
	} `json:"ports"`
	// What the entry says of the Service (annotation.Service): type and
	// exportedAt always, the rest when the Service sets them.
	Type                          *string           `json:"type"`
	ExportedAt                    *string           `json:"exportedAt"`
	SessionAffinity               *string           `json:"sessionAffinity"`
	SessionAffinityTimeoutSeconds *int32            `json:"sessionAffinityTimeoutSeconds"`
	InternalTrafficPolicy         *string           `json:"internalTrafficPolicy"`
	TrafficDistribution           *string           `json:"trafficDistribution"`
	Labels                        map[string]string `json:"labels"`
	Annotations                   map[string]string `json:"annotations"`
}

// checkWritten checks that raw is the export annotation the contract
// describes: strict JSON, every field explicit ("cluster" exactly when the
// annotator was given --cluster, flagCluster not empty), and parsed
// by the plugin's own parser without a rejection into exactly want (services
// sorted by name, ports in the Service's order).
func checkWritten(raw, ns, flagCluster string, want []annotation.Export) error {
	var env struct {
		Services []strictEntry `json:"services"`
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return fmt.Errorf("annotation %s: %v", raw, err)
	}
	for i, e := range env.Services {
		if e.Name == nil || e.Namespace == nil {
			return fmt.Errorf("annotation %s: services[%d] lacks name or namespace", raw, i)
		}
		if flagCluster != "" && (e.Cluster == nil || *e.Cluster != flagCluster) {
			return fmt.Errorf("annotation %s: services[%d] lacks cluster %q (given --cluster)", raw, i, flagCluster)
		}
		if flagCluster == "" && e.Cluster != nil {
			return fmt.Errorf("annotation %s: services[%d] has a cluster although the annotator has no --cluster", raw, i)
		}
		if e.Type == nil || e.ExportedAt == nil {
			return fmt.Errorf("annotation %s: services[%d] lacks type or exportedAt", raw, i)
		}
		for j, p := range e.Ports {
			if p.Port == nil || p.TargetPort == nil || p.Protocol == nil || p.Name == nil {
				return fmt.Errorf("annotation %s: services[%d].ports[%d] lacks name, port, targetPort or protocol", raw, i, j)
			}
		}
	}
	got, rej := annotation.ParseExports(raw, ns, clusterID)
	if len(rej) > 0 {
		return fmt.Errorf("annotation %s: the plugin rejects %v", raw, rej)
	}
	if len(got) == 0 {
		got = nil
	}
	for i := range got {
		if got[i].Exported().IsZero() {
			return fmt.Errorf("annotation %s: services[%d]: exportedAt %q is not a time", raw, i, got[i].ExportedAt)
		}
		got[i].ExportedAt = ""
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("annotation %s\nparses to %+v\nwant       %+v", raw, got, want)
	}
	return nil
}

// podExport reads a Pod's exporter label and export annotation.
func podExport(c *harness.Cluster, ns, name string) (label string, hasLabel bool, raw string, hasAnn bool, err error) {
	cx, cancel := ctxTimeout()
	defer cancel()
	p, err := c.Client.CoreV1().Pods(ns).Get(cx, name, metav1.GetOptions{})
	if err != nil {
		return "", false, "", false, err
	}
	label, hasLabel = p.Labels[harness.ExporterLabel]
	raw, hasAnn = p.Annotations[harness.ExportAnnotation]
	return label, hasLabel, raw, hasAnn, nil
}

// wantExports waits until the Pod carries the exporter label and exactly
// this export annotation, written by an annotator with --cluster edge-a.
func wantExports(t *testing.T, c *harness.Cluster, ns, name string, want ...annotation.Export) {
	t.Helper()
	wantExportsBy(t, c, ns, name, clusterID, want...)
}

// wantExportsBy is wantExports for an annotator given --cluster flagCluster
// (none when empty).
func wantExportsBy(t *testing.T, c *harness.Cluster, ns, name, flagCluster string, want ...annotation.Export) {
	t.Helper()
	took := harness.Eventually(t, annotatorPropagation, func() error {
		label, hasLabel, raw, hasAnn, err := podExport(c, ns, name)
		if err != nil {
			return err
		}
		if !hasAnn {
			return fmt.Errorf("pod %s/%s has no %s annotation", ns, name, harness.ExportAnnotation)
		}
		if err := checkWritten(raw, ns, flagCluster, want); err != nil {
			return fmt.Errorf("pod %s/%s: %w", ns, name, err)
		}
		if !hasLabel || label != "true" {
			return fmt.Errorf("pod %s/%s: label %s=%q (present %v), want \"true\"", ns, name, harness.ExporterLabel, label, hasLabel)
		}
		return nil
	})
	t.Logf("pod %s/%s exports %d service(s) as expected after %s", ns, name, len(want), took.Round(time.Millisecond))
}

// noExport accepts a Pod with neither the exporter label nor the annotation.
func noExport(c *harness.Cluster, ns, name string) error {
	label, hasLabel, raw, hasAnn, err := podExport(c, ns, name)
	if err != nil {
		return err
	}
	if hasLabel || hasAnn {
		return fmt.Errorf("pod %s/%s: label %s=%q (present %v), annotation %q (present %v); want neither",
			ns, name, harness.ExporterLabel, label, hasLabel, raw, hasAnn)
	}
	return nil
}

// wantNoExport waits until the Pod has neither label nor annotation.
func wantNoExport(t *testing.T, c *harness.Cluster, ns, name string) {
	t.Helper()
	took := harness.Eventually(t, annotatorPropagation, func() error { return noExport(c, ns, name) })
	t.Logf("pod %s/%s carries no export after %s", ns, name, took.Round(time.Millisecond))
}

// wantHandWritten checks that a hand-annotated Pod still has exactly its own
// label and annotation.
func wantHandWritten(t *testing.T, c *harness.Cluster, ns, name, raw string) {
	t.Helper()
	label, _, got, _, err := podExport(c, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	if got != raw || label != "true" {
		t.Errorf("hand-annotated pod %s/%s: label %q annotation %q, want \"true\" and %q", ns, name, label, got, raw)
	}
}

// metric reads one sample; absent counts as 0.
func metric(t *testing.T, a *harness.Annotator, name string) float64 {
	t.Helper()
	v, _, err := a.Metric(name)
	if err != nil {
		t.Fatalf("annotator %s: %s: %v", a.Addr(), name, err)
	}
	return v
}

// eventuallyMetric waits until a sample satisfies ok.
func eventuallyMetric(t *testing.T, a *harness.Annotator, name, what string, ok func(float64) bool) {
	t.Helper()
	harness.Eventually(t, annotatorPropagation, func() error {
		v, found, err := a.Metric(name)
		if err != nil {
			return err
		}
		if !found || !ok(v) {
			return fmt.Errorf("annotator %s: %s = %v (found %v), want %s", a.Addr(), name, v, found, what)
		}
		return nil
	})
}

const (
	metricLeader    = `mcs_annotator_leader`
	metricWritesOK  = `mcs_annotator_pod_writes_total{result="ok"}`
	metricUnresolve = `mcs_annotator_skipped_total{reason="port_unresolved"}`
	metricExtName   = `mcs_annotator_skipped_total{reason="external_name"}`
	metricExported  = `mcs_annotator_exported_services`
	metricAnnotated = `mcs_annotator_annotated_pods`
)

// TestAnnotatorAnnotationExport: Services exported with the annotation
// multicluster.kubernetes.io/export: "true" (named and numeric targetPorts,
// a Pod selected by two exported Services, a Pod lacking the named port),
// Services not exported (no annotation, "false"), a terminal Pod, a
// hand-annotated Pod; CoreDNS answers from what the annotator wrote; taking
// the export annotation off a Service takes its Pods out, also while no
// annotator runs (a restarted one cleans up); the metrics.
func TestAnnotatorAnnotationExport(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	e := newEnv(t)
	c := e.c
	ns := c.NewNamespace(t)
	app := func(v string) map[string]string { return map[string]string{"app": v} }

	// backend: http 80 -> the container port named "web" (8080 on its Pods).
	c.CreateService(t, exportedService(ns, "backend", "true", app("backend"), tcpPort("http", 80, intstr.FromString("web"))))
	// api: http 80 -> "web" (8081 on api-1; api-2 has no port "web"), metrics 9100 (targetPort defaulted).
	c.CreateService(t, exportedService(ns, "api", "true", app("api"),
		tcpPort("http", 80, intstr.FromString("web")), corev1.ServicePort{Name: "metrics", Port: 9100}))
	// admin selects api-1 too (role=admin): api-1 backs two services.
	c.CreateService(t, exportedService(ns, "admin", "true", map[string]string{"role": "admin"}, tcpPort("admin", 8443, intstr.FromInt32(8443))))
	// Not exported: no annotation (selects the backend Pods), and "false" (selects "other").
	c.CreateService(t, exportedService(ns, "quiet", "", app("backend"), tcpPort("http", 80, intstr.FromInt32(8080))))
	c.CreateService(t, exportedService(ns, "off", "false", app("other"), tcpPort("http", 80, intstr.FromInt32(8080))))

	web := containerPort("web", 8080)
	plainPod(t, c, ns, "backend-1", "10.244.10.1", app("backend"), web)
	plainPod(t, c, ns, "api-1", "10.244.10.11", map[string]string{"app": "api", "role": "admin"}, containerPort("web", 8081))
	plainPod(t, c, ns, "api-2", "10.244.10.12", app("api")) // default container: "http" 8080, no "web"
	plainPod(t, c, ns, "other", "10.244.10.21", app("other"), web)
	// A terminal Pod the backend selector selects: never exported.
	done := harness.Pod{Name: "done", Labels: app("backend")}.Object(ns)
	done.Spec.Containers[0].Ports = []corev1.ContainerPort{web}
	c.CreatePodObject(t, done)
	c.SetPodStatus(t, ns, "done", harness.PodStatus{Phase: corev1.PodSucceeded, IPs: ips("10.244.10.41")})
	// Hand-annotated, selected by no exported Service.
	manualSvc := harness.ExportService{Name: "manual", Ports: []harness.ExportPort{{Name: "tcp", Port: 7000}}}
	manual := harness.ExporterPod("manual", "", manualSvc)
	manual.Labels["app"] = "manual"
	manualRaw := manual.Annotations[harness.ExportAnnotation]
	e.c.CreateReadyPods(t, ns, harness.ReadyPod{Pod: manual, IPs: ips("10.244.10.31")})
	e.eventuallyAddrs(t, svc("manual", ns), dns.TypeA, "10.244.10.31")

	a := startAnnotator(t, c, "--leader-elect=false")
	harness.Eventually(t, annotatorPropagation, func() error { _, err := a.Get("/readyz"); return err })
	// backend-2 comes after the annotator's start: a Pod added later.
	plainPod(t, c, ns, "backend-2", "10.244.10.2", app("backend"), web)

	wantBackend := export("backend", ns, port("http", 80, 8080))
	wantExports(t, c, ns, "backend-1", wantBackend)
	wantExports(t, c, ns, "backend-2", wantBackend)
	wantExports(t, c, ns, "api-1",
		export("admin", ns, port("admin", 8443, 8443)),
		export("api", ns, port("http", 80, 8081), port("metrics", 9100, 9100)))
	wantExports(t, c, ns, "api-2", export("api", ns, port("metrics", 9100, 9100)))
	for _, p := range []string{"other", "done"} {
		if err := noExport(c, ns, p); err != nil {
			t.Errorf("no exported Service selects it: %v", err)
		}
	}
	wantHandWritten(t, c, ns, "manual", manualRaw)

	// DNS, from what the annotator wrote.
	backendName := svc("backend", ns)
	e.eventuallyAddrs(t, backendName, dns.TypeA, "10.244.10.1", "10.244.10.2")
	// ClusterIP Services are exported as ClusterSetIP: with no ServiceImports
	// served, their names answer the endpoints' addresses and SRV in service
	// form (the port the endpoints listen on).
	e.eventually(t, harness.Query{Name: "_http._tcp." + backendName, Type: dns.TypeSRV}, hasSRVs("8080 "+backendName))
	apiName := svc("api", ns)
	e.eventuallyAddrs(t, apiName, dns.TypeA, "10.244.10.11", "10.244.10.12") // api-2 too, without its http port
	e.eventually(t, harness.Query{Name: "_http._tcp." + apiName, Type: dns.TypeSRV}, hasSRVs("8081 "+apiName))
	e.eventually(t, harness.Query{Name: "_metrics._tcp." + apiName, Type: dns.TypeSRV}, hasSRVs("9100 "+apiName))
	e.eventuallyAddrs(t, svc("admin", ns), dns.TypeA, "10.244.10.11")
	e.eventuallyAddrs(t, svc("quiet", ns), dns.TypeA)
	e.eventuallyAddrs(t, svc("off", ns), dns.TypeA)

	// The Pods nothing exports stay untouched a while longer.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		for _, p := range []string{"other", "done"} {
			if err := noExport(c, ns, p); err != nil {
				t.Fatalf("no exported Service selects it: %v", err)
			}
		}
	}

	// Metrics. Counters move just after the write they count returns, which
	// the API server may show first: wait for them.
	eventuallyMetric(t, a, metricWritesOK, "> 0", func(v float64) bool { return v > 0 })
	eventuallyMetric(t, a, metricUnresolve, "> 0 after api-2 (no container port \"web\")", func(v float64) bool { return v > 0 })
	eventuallyMetric(t, a, metricExported, "3 (backend, api, admin)", func(v float64) bool { return v == 3 })
	eventuallyMetric(t, a, metricAnnotated, "4 (backend-1, backend-2, api-1, api-2)", func(v float64) bool { return v == 4 })

	// Unexport backend: its Pods lose label and annotation, the name goes.
	c.PatchServiceAnnotations(t, ns, "backend", map[string]*string{harness.ServiceExportAnnotation: nil})
	wantNoExport(t, c, ns, "backend-1")
	wantNoExport(t, c, ns, "backend-2")
	e.eventuallyAddrs(t, backendName, dns.TypeA)
	e.eventually(t, harness.Query{Name: "_http._tcp." + backendName, Type: dns.TypeSRV}, isNXDOMAIN)
	// The others are as they were.
	wantExports(t, c, ns, "api-1",
		export("admin", ns, port("admin", 8443, 8443)),
		export("api", ns, port("http", 80, 8081), port("metrics", 9100, 9100)))
	wantExports(t, c, ns, "api-2", export("api", ns, port("metrics", 9100, 9100)))
	e.eventuallyAddrs(t, apiName, dns.TypeA, "10.244.10.11", "10.244.10.12")
	wantHandWritten(t, c, ns, "manual", manualRaw)
	e.eventuallyAddrs(t, svc("manual", ns), dns.TypeA, "10.244.10.31")
	eventuallyMetric(t, a, metricExported, "2 (api, admin)", func(v float64) bool { return v == 2 })
	eventuallyMetric(t, a, metricAnnotated, "2 (api-1, api-2)", func(v float64) bool { return v == 2 })

	// Exporting again brings them back (and a relabelled Pod follows its selector).
	c.PatchServiceAnnotations(t, ns, "backend", map[string]*string{harness.ServiceExportAnnotation: strPtr("true")})
	wantExports(t, c, ns, "backend-1", wantBackend)
	c.PatchPodMetadata(t, ns, "backend-2", nil, map[string]*string{"app": strPtr("elsewhere")})
	wantNoExport(t, c, ns, "backend-2")
	e.eventuallyAddrs(t, backendName, dns.TypeA, "10.244.10.1")
	wantHandWritten(t, c, ns, "manual", manualRaw)
	if !a.Running() {
		t.Errorf("annotator exited during the test")
	}

	// Unexported while no annotator runs: a new one finds what it wrote
	// before (its managed fields) and takes it off; the rest stays.
	a.Stop(t)
	c.PatchServiceAnnotations(t, ns, "api", map[string]*string{harness.ServiceExportAnnotation: nil})
	a = startAnnotator(t, c, "--leader-elect=false")
	wantNoExport(t, c, ns, "api-2")
	wantExports(t, c, ns, "api-1", export("admin", ns, port("admin", 8443, 8443)))
	wantExports(t, c, ns, "backend-1", wantBackend)
	e.eventuallyAddrs(t, apiName, dns.TypeA)
	e.eventuallyAddrs(t, svc("admin", ns), dns.TypeA, "10.244.10.11")
	wantHandWritten(t, c, ns, "manual", manualRaw)
	eventuallyMetric(t, a, metricExported, "2 (backend, admin)", func(v float64) bool { return v == 2 })
	eventuallyMetric(t, a, metricAnnotated, "2 (backend-1, api-1)", func(v float64) bool { return v == 2 })
}

func strPtr(s string) *string { return &s }

// ctxTimeout bounds one API request of the test itself.
func ctxTimeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// wantCondition checks one condition of a ServiceExport.
func wantCondition(conds []metav1.Condition, gen int64, typ string, status metav1.ConditionStatus, reason string) error {
	for _, c := range conds {
		if c.Type != typ {
			continue
		}
		if c.Status != status || c.Reason != reason {
			return fmt.Errorf("condition %s is %s/%s (%q), want %s/%s", typ, c.Status, c.Reason, c.Message, status, reason)
		}
		if c.ObservedGeneration != gen {
			return fmt.Errorf("condition %s: observedGeneration %d, want %d", typ, c.ObservedGeneration, gen)
		}
		return nil
	}
	return fmt.Errorf("no condition %s", typ)
}

// cond is one expected condition: type, status, reason.
type cond struct {
	typ    string
	status metav1.ConditionStatus
	reason string
}

// wantConditions waits until the ServiceExport has these conditions.
func wantConditions(t *testing.T, c *harness.Cluster, ns, name string, want ...cond) []metav1.Condition {
	t.Helper()
	var last []metav1.Condition
	took := harness.Eventually(t, annotatorPropagation, func() error {
		gen, conds, err := c.ServiceExportStatus(ns, name)
		if err != nil {
			return err
		}
		last = conds
		for _, w := range want {
			if err := wantCondition(conds, gen, w.typ, w.status, w.reason); err != nil {
				return fmt.Errorf("ServiceExport %s/%s: %w (conditions %+v)", ns, name, err, conds)
			}
		}
		return nil
	})
	t.Logf("ServiceExport %s/%s has the expected conditions after %s", ns, name, took.Round(time.Millisecond))
	return last
}

// TestAnnotatorServiceExport: ServiceExports (the mcs-api CRDs) of a
// ClusterIP Service (Pods exported, Valid/Ready/Conflict), of an
// ExternalName Service (refused: InvalidServiceType, no Pod exported) and
// of no Service (NoService, until the Service appears); deleting a
// ServiceExport takes its Pods out.
func TestAnnotatorServiceExport(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	e := newEnv(t)
	c := e.c
	c.InstallMCSCRDs(t)
	// CoreDNS looks for ServiceImports every 30 s: restarted, it sees them
	// served from the start.
	e.dns.Kill(t, syscall.SIGTERM)
	e.dns.Start(t)
	ns := c.NewNamespace(t)
	app := func(v string) map[string]string { return map[string]string{"app": v} }

	c.CreateService(t, exportedService(ns, "web", "", app("web"), tcpPort("http", 80, intstr.FromInt32(8080))))
	ext := exportedService(ns, "ext", "", app("ext"), tcpPort("http", 80, intstr.FromInt32(8080)))
	ext.Spec.Type = corev1.ServiceTypeExternalName
	ext.Spec.ExternalName = "backend.example.com"
	c.CreateService(t, ext)
	plainPod(t, c, ns, "web-1", "10.244.20.1", app("web"))
	plainPod(t, c, ns, "web-2", "10.244.20.2", app("web"))
	plainPod(t, c, ns, "ext-1", "10.244.20.11", app("ext"))
	plainPod(t, c, ns, "ghost-1", "10.244.20.21", app("ghost"))

	a := startAnnotator(t, c, "--leader-elect=false")
	c.CreateServiceExport(t, "v1beta1", ns, "web")
	c.CreateServiceExport(t, "v1alpha1", ns, "ext") // the same objects in either version
	c.CreateServiceExport(t, "v1beta1", ns, "ghost")

	wantWeb := export("web", ns, port("http", 80, 8080))
	wantExports(t, c, ns, "web-1", wantWeb)
	wantExports(t, c, ns, "web-2", wantWeb)
	conds := wantConditions(t, c, ns, "web",
		cond{"Valid", metav1.ConditionTrue, "Valid"},
		cond{"Ready", metav1.ConditionTrue, "Exported"},
		cond{"Conflict", metav1.ConditionFalse, "NoConflicts"})
	t.Logf("ServiceExport web: %+v", conds)
	for _, cd := range conds {
		if cd.Type == "Ready" && !strings.Contains(cd.Message, "2") {
			t.Errorf("ServiceExport web: Ready message %q does not say how many Pods (2)", cd.Message)
		}
	}
	wantConditions(t, c, ns, "ext",
		cond{"Valid", metav1.ConditionFalse, "InvalidServiceType"},
		cond{"Ready", metav1.ConditionFalse, "Failed"})
	wantConditions(t, c, ns, "ghost",
		cond{"Valid", metav1.ConditionFalse, "NoService"},
		cond{"Ready", metav1.ConditionFalse, "Failed"})
	// ServiceImports are served and no MCS controller runs: the ClusterSetIP
	// services wait for their ClusterSetIP (NODATA), never the Pods'
	// addresses; their endpoint names answer.
	e.eventually(t, harness.Query{Name: svc("web", ns), Type: dns.TypeA}, isPending)
	e.eventually(t, harness.Query{Name: "_http._tcp." + svc("web", ns), Type: dns.TypeSRV}, isPending)
	e.eventuallyAddrs(t, host(dashed("10.244.20.1"), "web", ns), dns.TypeA, "10.244.20.1")
	for _, p := range []string{"ext-1", "ghost-1"} {
		if err := noExport(c, ns, p); err != nil {
			t.Errorf("its ServiceExport is not valid: %v", err)
		}
	}
	e.eventuallyAddrs(t, svc("ext", ns), dns.TypeA)
	e.eventuallyAddrs(t, svc("ghost", ns), dns.TypeA)
	eventuallyMetric(t, a, metricExtName, "> 0", func(v float64) bool { return v > 0 })

	// The missing Service appears: the ServiceExport turns valid, its Pod exported.
	c.CreateService(t, exportedService(ns, "ghost", "", app("ghost"), tcpPort("grpc", 9090, intstr.FromInt32(9091))))
	wantExports(t, c, ns, "ghost-1", export("ghost", ns, port("grpc", 9090, 9091)))
	wantConditions(t, c, ns, "ghost",
		cond{"Valid", metav1.ConditionTrue, "Valid"},
		cond{"Ready", metav1.ConditionTrue, "Exported"},
		cond{"Conflict", metav1.ConditionFalse, "NoConflicts"})
	e.eventually(t, harness.Query{Name: svc("ghost", ns), Type: dns.TypeA}, isPending)
	if err := noExport(c, ns, "ext-1"); err != nil {
		t.Errorf("ExternalName: %v", err)
	}

	// A Service that turns ExternalName stops being exported.
	c.CreateService(t, exportedService(ns, "turn", "", app("turn"), tcpPort("http", 80, intstr.FromInt32(8080))))
	plainPod(t, c, ns, "turn-1", "10.244.20.31", app("turn"))
	c.CreateServiceExport(t, "v1beta1", ns, "turn")
	wantExports(t, c, ns, "turn-1", export("turn", ns, port("http", 80, 8080)))
	e.eventually(t, harness.Query{Name: svc("turn", ns), Type: dns.TypeA}, isPending)
	toExternalName(t, c, ns, "turn")
	wantNoExport(t, c, ns, "turn-1")
	wantConditions(t, c, ns, "turn",
		cond{"Valid", metav1.ConditionFalse, "InvalidServiceType"},
		cond{"Ready", metav1.ConditionFalse, "Failed"})
	e.eventuallyAddrs(t, svc("turn", ns), dns.TypeA)

	// Deleting the ServiceExport takes the Pods out.
	c.DeleteServiceExport(t, ns, "web")
	wantNoExport(t, c, ns, "web-1")
	wantNoExport(t, c, ns, "web-2")
	e.eventuallyAddrs(t, svc("web", ns), dns.TypeA)
	wantExports(t, c, ns, "ghost-1", export("ghost", ns, port("grpc", 9090, 9091)))
	e.eventually(t, harness.Query{Name: svc("ghost", ns), Type: dns.TypeA}, isPending)
	if !a.Running() {
		t.Errorf("annotator exited during the test")
	}
}

// toExternalName turns a ClusterIP Service into an ExternalName one.
func toExternalName(t *testing.T, c *harness.Cluster, ns, name string) {
	t.Helper()
	cx, cancel := ctxTimeout()
	defer cancel()
	s, err := c.Client.CoreV1().Services(ns).Get(cx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.Type = corev1.ServiceTypeExternalName
	s.Spec.ExternalName = "elsewhere.example.com"
	s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
	s.Spec.IPFamilies, s.Spec.IPFamilyPolicy, s.Spec.InternalTrafficPolicy = nil, nil, nil
	if _, err := c.Client.CoreV1().Services(ns).Update(cx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("turn service %s/%s into ExternalName: %v", ns, name, err)
	}
}

// TestAnnotatorServiceExportCRDLate: the CRDs installed after the annotator
// started; it finds them within --serviceexport-poll and honours a
// ServiceExport.
func TestAnnotatorServiceExportCRDLate(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	e := newEnv(t)
	c := e.c
	ns := c.NewNamespace(t)
	// No --cluster: the entries carry no "cluster"; the plugin defaults it to edge-a.
	a := harness.StartAnnotator(t, c.Kubeconfig, "--leader-elect=false", "--serviceexport-poll", "1s")
	c.CreateService(t, exportedService(ns, "late", "", map[string]string{"app": "late"}, tcpPort("http", 80, intstr.FromInt32(8080))))
	plainPod(t, c, ns, "late-1", "10.244.30.1", map[string]string{"app": "late"})
	time.Sleep(1500 * time.Millisecond) // a poll or more without the CRD
	c.InstallMCSCRDs(t)
	c.CreateServiceExport(t, "v1beta1", ns, "late")
	wantExportsBy(t, c, ns, "late-1", "", export("late", ns, port("http", 80, 8080)))
	wantConditions(t, c, ns, "late",
		cond{"Valid", metav1.ConditionTrue, "Valid"},
		cond{"Ready", metav1.ConditionTrue, "Exported"})
	e.eventually(t, harness.Query{Name: svc("late", ns), Type: dns.TypeA}, pendingOrAddrs("10.244.30.1"))
	if !a.Running() {
		t.Errorf("annotator exited during the test")
	}
}

// leaderState reads mcs_annotator_leader of each annotator (absent: -1).
func leaderState(as []*harness.Annotator) ([]float64, error) {
	out := make([]float64, len(as))
	for i, a := range as {
		v, found, err := a.Metric(metricLeader)
		if err != nil {
			return nil, err
		}
		if !found {
			v = -1
		}
		out[i] = v
	}
	return out, nil
}

// leaseHolder reads the annotator's Lease (kube-system/mcs-annotator, the defaults).
func leaseHolder(c *harness.Cluster) (string, error) {
	cx, cancel := ctxTimeout()
	defer cancel()
	l, err := c.Client.CoordinationV1().Leases("kube-system").Get(cx, "mcs-annotator", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if l.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

// TestAnnotatorLeaderElection: two annotators, one leader (metric, Lease,
// log); only the leader writes; the leader stopped with SIGTERM releases
// the Lease at once and the other takes over and exports a new Service.
func TestAnnotatorLeaderElection(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	e := newEnv(t)
	c := e.c
	ns := c.NewNamespace(t)
	ids := []string{"annotator-a", "annotator-b"}
	as := []*harness.Annotator{
		startAnnotator(t, c, append([]string{"--id", ids[0]}, fastLease...)...),
		startAnnotator(t, c, append([]string{"--id", ids[1]}, fastLease...)...),
	}

	var leader int
	took := harness.Eventually(t, annotatorPropagation, func() error {
		st, err := leaderState(as)
		if err != nil {
			return err
		}
		switch {
		case st[0] == 1 && st[1] == 0:
			leader = 0
		case st[0] == 0 && st[1] == 1:
			leader = 1
		default:
			return fmt.Errorf("%s = %v for %v (-1: absent), want exactly one 1 and one 0", metricLeader, st, ids)
		}
		holder, err := leaseHolder(c)
		if err != nil {
			return err
		}
		if holder != ids[leader] {
			return fmt.Errorf("Lease kube-system/mcs-annotator held by %q, metric says %q", holder, ids[leader])
		}
		return nil
	})
	follower := 1 - leader
	t.Logf("%s leads, %s follows, after %s", ids[leader], ids[follower], took.Round(time.Millisecond))
	if !strings.Contains(as[leader].Log(), "became leader") {
		t.Errorf("the leader's log has no \"became leader\"")
	}

	// Only the leader writes.
	app := map[string]string{"app": "one"}
	c.CreateService(t, exportedService(ns, "one", "true", app, tcpPort("http", 80, intstr.FromInt32(8080))))
	plainPod(t, c, ns, "one-1", "10.244.40.1", app)
	plainPod(t, c, ns, "one-2", "10.244.40.2", app)
	wantOne := export("one", ns, port("http", 80, 8080))
	wantExports(t, c, ns, "one-1", wantOne)
	wantExports(t, c, ns, "one-2", wantOne)
	e.eventuallyAddrs(t, svc("one", ns), dns.TypeA, "10.244.40.1", "10.244.40.2")
	eventuallyMetric(t, as[leader], metricWritesOK, ">= 2 (the leader's)", func(v float64) bool { return v >= 2 })
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if v := metric(t, as[follower], metricWritesOK); v != 0 {
			t.Fatalf("follower %s: %s = %v, want 0 or absent", ids[follower], metricWritesOK, v)
		}
		if v := metric(t, as[follower], metricLeader); v != 0 {
			t.Fatalf("follower %s: %s = %v, want 0", ids[follower], metricLeader, v)
		}
	}

	// SIGTERM the leader: it releases the Lease on the way out.
	start := time.Now()
	as[leader].Stop(t)
	stopped := time.Since(start)
	if _, err := as[leader].Process().Exited(); err != nil && strings.Contains(err.Error(), "killed") {
		t.Errorf("leader %s needed SIGKILL after SIGTERM (%v, %s)", ids[leader], err, stopped)
	}
	t.Logf("leader %s exited %s after SIGTERM", ids[leader], stopped.Round(time.Millisecond))
	if holder, err := leaseHolder(c); err != nil {
		t.Errorf("Lease: %v", err)
	} else if holder == ids[leader] {
		t.Errorf("Lease still held by %s right after it exited on SIGTERM: not released", holder)
	}
	if !strings.Contains(as[leader].Log(), "stopped leading") {
		t.Errorf("the old leader's log has no \"stopped leading\"")
	}

	took = harness.Eventually(t, annotatorPropagation, func() error {
		if v := metric(t, as[follower], metricLeader); v != 1 {
			return fmt.Errorf("%s of %s = %v, want 1", metricLeader, ids[follower], v)
		}
		if holder, err := leaseHolder(c); err != nil || holder != ids[follower] {
			return fmt.Errorf("Lease holder %q (%v), want %s", holder, err, ids[follower])
		}
		return nil
	})
	t.Logf("%s took over %s after the old leader exited", ids[follower], took.Round(time.Millisecond))
	if !strings.Contains(as[follower].Log(), "became leader") {
		t.Errorf("the new leader's log has no \"became leader\"")
	}

	// The new leader exports a new Service and keeps the old one.
	app2 := map[string]string{"app": "two"}
	c.CreateService(t, exportedService(ns, "two", "true", app2, tcpPort("grpc", 9090, intstr.FromInt32(9091))))
	plainPod(t, c, ns, "two-1", "10.244.40.11", app2)
	wantExports(t, c, ns, "two-1", export("two", ns, port("grpc", 9090, 9091)))
	e.eventuallyAddrs(t, svc("two", ns), dns.TypeA, "10.244.40.11")
	e.eventually(t, harness.Query{Name: "_grpc._tcp." + svc("two", ns), Type: dns.TypeSRV}, hasSRVs("9091 "+svc("two", ns)))
	eventuallyMetric(t, as[follower], metricWritesOK, "> 0 (the new leader's)", func(v float64) bool { return v > 0 })
	wantExports(t, c, ns, "one-1", wantOne)
	e.eventuallyAddrs(t, svc("one", ns), dns.TypeA, "10.244.40.1", "10.244.40.2")
	if !as[follower].Running() {
		t.Errorf("annotator %s exited", ids[follower])
	}
}

// importerCorefile serves clusterset.local for edge-a alone; without imports
// enforce, CoreDNS knows only the Pods with the importer label as clients.
const importerCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        ttl 5
    }
}
`

// A Pod that carries only an import annotation gets the importer label from
// the annotator, so CoreDNS answers its alias; when the annotation goes, the
// annotator removes the label it set and the alias stops answering.
func TestAnnotatorImporterLabel(t *testing.T) {
	harness.RequireTools(t)
	c := harness.StartCluster(t, clusterID)
	d := harness.StartCoreDNS(t, importerCorefile, map[string]string{"KUBECONFIG": c.Kubeconfig})
	nsA, ns := c.NewNamespace(t), c.NewNamespace(t)
	exporters(t, c, nsA, backend, "10.250.9.1")
	const me = "127.0.0.71"
	p := harness.ImporterPod("consumer", harness.ImportService{Name: "backend", Namespace: nsA, Alias: "be"})
	delete(p.Labels, harness.ImporterLabel) // the user writes only the annotation
	c.CreateReadyPods(t, ns, harness.ReadyPod{Pod: p, IPs: ips(me)})
	alias := from(me, svcIn("be", ns, zone), dns.TypeA)
	waitFor(t, d, from(me, svc("backend", nsA), dns.TypeA), hasAddrs("10.250.9.1"))
	expect(t, d, alias, isNXDOMAIN) // not a known client yet

	a := startAnnotator(t, c)
	labelled := func(want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for got := podLabel(t, c, ns, "consumer", harness.ImporterLabel); got != want; got = podLabel(t, c, ns, "consumer", harness.ImporterLabel) {
			if time.Now().After(deadline) {
				t.Fatalf("consumer's importer label = %q after 20 s, want %q", got, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	labelled("true")
	waitFor(t, d, alias, hasAddrs("10.250.9.1"))
	eventuallyMetric(t, a, "mcs_annotator_importer_pods", "one importing Pod", func(v float64) bool { return v == 1 })

	// The import annotation goes: so do the label and the alias.
	ctx, cancel := ctxTimeout()
	defer cancel()
	pod, err := c.Client.CoreV1().Pods(ns).Get(ctx, "consumer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(pod.Annotations, harness.ImportAnnotation)
	if _, err := c.Client.CoreV1().Pods(ns).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	labelled("")
	waitFor(t, d, alias, isNXDOMAIN)
}

// podLabel reads one label of a Pod ("" when absent).
func podLabel(t *testing.T, c *harness.Cluster, ns, name, key string) string {
	t.Helper()
	ctx, cancel := ctxTimeout()
	defer cancel()
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Labels[key]
}
