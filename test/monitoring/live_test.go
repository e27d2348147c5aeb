package monitoring

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// liveCorefile is edge-a with peer edge-b (locality any: an answer holds
// both clusters' endpoints), a snapshot, imports enforce
// (127.0.0.1 allowed, so that other loopback sources are refused), health
// probes of every asked service (nothing listens on the test's Pod IPs, so
// every endpoint is down and answers fail open), a per-namespace record cap
// that one namespace of the test exceeds, and the prometheus plugin on
// {METRICS}.
const liveCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    prometheus 127.0.0.1:{METRICS}
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        peer edge-b {PEERB}
        snapshot {DIR}/snapshot.db
        locality any
        expire 1h
        imports enforce allow 127.0.0.1/32
        ttl 5
        records_per_namespace 12
        probe all interval 1s timeout 1s fails 1 passes 1 allow 127.88.0.0/16
    }
}
`

// liveWait bounds each wait for the processes to reach the state scraped.
const liveWait = 30 * time.Second

// Every series the alerting rules and the dashboard select exists in a live
// scrape of bin/coredns (against real kube-apiservers: its own cluster and a
// peer, with a snapshot) and of bin/mcs-annotator running the MCS
// controller (--mcs-controller, edge-b its peer): counters before any of the
// events they count has happened; the gauges that have a series only while
// something is wrong (capped_records, probe_endpoints_down) because the
// scenario makes it so. A selector that matches nothing would be an alert
// that never fires or a panel that stays empty.
func TestLiveScrapeHasEverySeries(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	sels := selectors(t, allQueries(t))
	if t.Failed() {
		t.FailNow()
	}
	cs := harness.StartClusters(t, "edge-a", "edge-b")
	a, b := cs[0], cs[1]
	// The endpoints are loopback addresses on a port nothing listens on:
	// the probes fail for certain (a sandbox may accept any other connect).
	closed := int32(harness.FreePort(t))
	backend := harness.ExportService{Name: "backend", Ports: []harness.ExportPort{{Name: "http", Port: 80, TargetPort: closed, Protocol: "TCP"}}}
	ns := a.NewNamespace(t)
	b.CreateNamespace(t, ns)
	a.CreateReadyPods(t, ns, harness.ReadyPod{Pod: harness.ExporterPod("backend-a", "", backend), IPs: []string{"127.88.0.1"}})
	b.CreateReadyPods(t, ns, harness.ReadyPod{Pod: harness.ExporterPod("backend-b", "", backend), IPs: []string{"127.88.0.2"}})
	// A namespace over records_per_namespace (12): 5 endpoints with a named
	// port are 15 records (addresses, SRV under the bare name and the
	// port's); backend's 2 are 6.
	big := a.NewNamespace(t)
	var bigPods []harness.ReadyPod
	for i := range 5 {
		bigPods = append(bigPods, harness.ReadyPod{Pod: harness.ExporterPod(fmt.Sprintf("big-%d", i), "", backend), IPs: []string{fmt.Sprintf("127.88.1.%d", i+1)}})
	}
	a.CreateReadyPods(t, big, bigPods...)

	metrics := harness.FreePort(t)
	d := harness.StartCoreDNS(t, liveCorefile, map[string]string{
		"KUBECONFIG": a.Kubeconfig, "PEERB": b.Kubeconfig, "METRICS": strconv.Itoa(metrics)})
	ann := harness.StartAnnotator(t, a.Kubeconfig, "--cluster", "edge-a",
		"--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms",
		"--mcs-controller", "--peer", "edge-b="+b.Kubeconfig)

	// Answers (service, nxdomain) and a refusal, so that the query counters
	// have series; both sources connected and a snapshot commit made.
	name := "backend." + ns + ".svc.clusterset.local."
	harness.Eventually(t, liveWait, func() error {
		m, err := d.Exchange(harness.Query{Name: name, Type: dns.TypeA})
		if err != nil {
			return err
		}
		if got := harness.Addrs(m); len(got) != 2 {
			return fmt.Errorf("%s: %v, want an address from each cluster", name, got)
		}
		return nil
	})
	if _, err := d.Exchange(harness.Query{Name: "nothing." + ns + ".svc.clusterset.local.", Type: dns.TypeA}); err != nil {
		t.Fatal(err)
	}
	if m, err := d.Exchange(harness.Query{Name: name, Type: dns.TypeA, Source: "127.0.0.2"}); err != nil || m.Rcode != dns.RcodeNameError {
		t.Fatalf("a query from 127.0.0.2 under imports enforce: %v %v, want NXDOMAIN", m, err)
	}
	var coredns, annotator []labels.Labels
	harness.Eventually(t, liveWait, func() error {
		var err error
		if coredns, err = scrape("http://127.0.0.1:"+strconv.Itoa(metrics)+"/metrics", "coredns"); err != nil {
			return err
		}
		// Asked again each time: the prober probes the services asked
		// lately, and a down endpoint's answer is the fail-open one.
		if _, err := d.Exchange(harness.Query{Name: name, Type: dns.TypeA}); err != nil {
			return err
		}
		for _, want := range []string{
			`coredns_mcsannotations_source_state{cluster="edge-a",state="connected"} 1`,
			`coredns_mcsannotations_source_state{cluster="edge-b",state="connected"} 1`,
			`coredns_mcsannotations_snapshot_last_write_timestamp_seconds`,
			`coredns_mcsannotations_capped_records{namespace="` + big + `"}`,
			`coredns_mcsannotations_probe_endpoints_down{cluster="edge-b"}`,
		} {
			if !has(coredns, want) {
				return fmt.Errorf("CoreDNS: no %s yet", want)
			}
		}
		if annotator, err = scrape("http://"+ann.Addr()+"/metrics", "mcs-annotator"); err != nil {
			return err
		}
		if !has(annotator, "mcs_annotator_leader 1") {
			return fmt.Errorf("the annotator does not lead yet")
		}
		if !has(annotator, `mcs_controller_cluster_last_contact_seconds{cluster="edge-b"}`) {
			return fmt.Errorf("the MCS controller has no series of edge-b yet")
		}
		return nil
	})
	all := append(coredns, annotator...)
	for _, s := range sels {
		if !matchesAny(s.matchers, all) {
			t.Errorf("%s: %s matches no series of the live scrape", s.where, s)
		}
	}
	if t.Failed() {
		t.Logf("the scrape of CoreDNS:\n%s\nof the annotator:\n%s", dump(coredns), dump(annotator))
	}

	// The Operator's objects pass the API server's validation against the
	// Operator's own CRDs (server-side dry run).
	crds := operatorCRDs(t, "prometheusrules", "podmonitors")
	if _, err := a.CreateObjects(crds, false); err != nil {
		t.Fatalf("prometheus-operator CRDs: %v", err)
	}
	waitServed(t, a, schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "prometheusrules"})
	waitServed(t, a, schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "podmonitors"})
	objs := rendered(t)
	extra, err := harness.ReadManifests(filepath.Join(dir(t), "podmonitor-coredns.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateObjects(append(objs, extra...), true); err != nil {
		t.Errorf("server-side dry run of manifests/monitoring: %v", err)
	}
}

// scrape reads a /metrics page into series: one per sample, histograms and
// summaries as Prometheus stores them (_bucket with le, _sum, _count), with
// the job and instance labels a scrape adds and the value as label "__value".
func scrape(url, job string) ([]labels.Labels, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	instance := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/metrics")
	var out []labels.Labels
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			add := func(n string, v float64, extra ...string) {
				b := labels.NewBuilder(labels.EmptyLabels())
				b.Set(labels.MetricName, n)
				b.Set("job", job)
				b.Set("instance", instance)
				for _, l := range m.GetLabel() {
					b.Set(l.GetName(), l.GetValue())
				}
				for i := 0; i+1 < len(extra); i += 2 {
					b.Set(extra[i], extra[i+1])
				}
				b.Set("__value", strconv.FormatFloat(v, 'g', -1, 64))
				out = append(out, b.Labels())
			}
			switch mf.GetType() {
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, bk := range h.GetBucket() {
					add(name+"_bucket", float64(bk.GetCumulativeCount()), "le", strconv.FormatFloat(bk.GetUpperBound(), 'g', -1, 64))
				}
				add(name+"_bucket", float64(h.GetSampleCount()), "le", "+Inf")
				add(name+"_sum", h.GetSampleSum())
				add(name+"_count", float64(h.GetSampleCount()))
			case dto.MetricType_SUMMARY:
				s := m.GetSummary()
				for _, q := range s.GetQuantile() {
					add(name, q.GetValue(), "quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64))
				}
				add(name+"_sum", s.GetSampleSum())
				add(name+"_count", float64(s.GetSampleCount()))
			case dto.MetricType_COUNTER:
				add(name, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, m.GetGauge().GetValue())
			default:
				add(name, m.GetUntyped().GetValue())
			}
		}
	}
	return out, nil
}

// sample is a series as the exposition format writes it, without job and
// instance: `name{a="b"} value`.
func sample(l labels.Labels) string {
	var b strings.Builder
	b.WriteString(l.Get(labels.MetricName))
	var ls []string
	l.Range(func(lb labels.Label) {
		switch lb.Name {
		case labels.MetricName, "job", "instance", "__value":
		default:
			ls = append(ls, lb.Name+"="+strconv.Quote(lb.Value))
		}
	})
	if len(ls) > 0 {
		b.WriteString("{" + strings.Join(ls, ",") + "}")
	}
	b.WriteString(" " + l.Get("__value"))
	return b.String()
}

// has reports whether a series' sample line starts with prefix.
func has(series []labels.Labels, prefix string) bool {
	for _, l := range series {
		if strings.HasPrefix(sample(l), prefix) {
			return true
		}
	}
	return false
}

func dump(series []labels.Labels) string {
	var b strings.Builder
	for _, l := range series {
		b.WriteString(sample(l) + "\n")
	}
	return b.String()
}

// matchesAny reports whether some series satisfies every matcher.
func matchesAny(ms []*labels.Matcher, series []labels.Labels) bool {
	for _, l := range series {
		ok := true
		for _, m := range ms {
			if !m.Matches(l.Get(m.Name)) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// operatorVersion is the prometheus-operator release whose CRDs the
// manifests are checked against.
const operatorVersion = "v0.85.0"

// operatorCRDs reads the named CRDs of the Prometheus Operator from its Go
// module (the module cache, or the Go module proxy).
func operatorCRDs(t *testing.T, names ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/prometheus-operator/prometheus-operator@"+operatorVersion).Output()
	if err != nil {
		t.Fatalf("go mod download prometheus-operator %s: %v", operatorVersion, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download prometheus-operator: %v %s", err, out)
	}
	var paths []string
	for _, n := range names {
		paths = append(paths, filepath.Join(mod.Dir, "example", "prometheus-operator-crd", "monitoring.coreos.com_"+n+".yaml"))
	}
	objs, err := harness.ReadManifests(paths...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// waitServed waits until the API server lists gvr (a new CRD is established).
func waitServed(t *testing.T, c *harness.Cluster, gvr schema.GroupVersionResource) {
	t.Helper()
	dyn := c.Dynamic(t)
	harness.Eventually(t, liveWait, func() error {
		_, err := dyn.Resource(gvr).Namespace("kube-system").List(t.Context(), metav1.ListOptions{Limit: 1})
		return err
	})
}

// rendered is the kustomize output of manifests/monitoring as objects.
func rendered(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, b := range render(t) {
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}
