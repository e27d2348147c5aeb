package annotator

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// The stale policy of an export: the ServiceExport's stale-endpoints
// annotation when it has one, else the Service's; a value that does not
// parse leaves the entry without a policy (serve) and is a skip naming the
// Service, the annotation and what is expected.
func TestNewExportedStale(t *testing.T) {
	withStale := func(s *corev1.Service, v string) *corev1.Service {
		s.Annotations[annotation.StaleEndpointsAnnotation] = v
		return s
	}
	se := func(v string) *unstructured.Unstructured {
		u := serviceExport("s")
		u.SetAnnotations(map[string]string{annotation.StaleEndpointsAnnotation: v})
		return u
	}
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		se     *unstructured.Unstructured
		policy string
		grace  int32
		skips  []string // reasons
	}{
		{name: "neither", svc: svc("s", app)},
		{name: "the Service's serve", svc: withStale(svc("s", app), "serve")},
		{name: "the Service's drop-after", svc: withStale(svc("s", app), "drop-after=30s"), policy: annotation.StaleDrop, grace: 30},
		{name: "the Service's under a ServiceExport without one", svc: withStale(svc("s", app), "drop-after=1m"), se: serviceExport("s"), policy: annotation.StaleDrop, grace: 60},
		{name: "the ServiceExport's over the Service's", svc: withStale(svc("s", app), "drop-after=30s"), se: se("drop-if-local-after=10s"), policy: annotation.StaleDropIfLocal, grace: 10},
		{name: "the ServiceExport's serve over the Service's drop", svc: withStale(svc("s", app), "drop-after=30s"), se: se("serve")},
		{name: "the Service's does not parse", svc: withStale(svc("s", app), "drop-after=30"), skips: []string{skipStale}},
		{name: "the Service's is empty", svc: withStale(svc("s", app), ""), skips: []string{skipStale}},
		{name: "the Service's is a word of the entry, not of the annotation", svc: withStale(svc("s", app), "Drop"), skips: []string{skipStale}},
		{name: "the ServiceExport's does not parse, over a good Service's", svc: withStale(svc("s", app), "drop-after=30s"), se: se("drop-after=8d"), skips: []string{skipStale}},
		{name: "both annotations bad", svc: withStale(withAllowedNS(svc("s", app), "Web"), "keep"), skips: []string{skipAllowed, skipStale}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, skips := newExported(tc.svc, tc.se)
			if e.fields.StaleEndpoints != tc.policy || e.fields.StaleGraceSeconds != tc.grace {
				t.Errorf("policy %q %ds, want %q %ds", e.fields.StaleEndpoints, e.fields.StaleGraceSeconds, tc.policy, tc.grace)
			}
			var reasons []string
			for _, k := range skips {
				reasons = append(reasons, k.reason)
				if k.key != "s" || !strings.Contains(k.detail, "Service ns/s") {
					t.Errorf("skip %+v: want one about Service ns/s", k)
				}
				if k.reason == skipStale && (!strings.Contains(k.detail, annotation.StaleEndpointsAnnotation) || !strings.Contains(k.detail, "want serve, drop-after=DURATION") && !strings.Contains(k.detail, "duration")) {
					t.Errorf("skip %q: want the annotation's name and what is expected", k.detail)
				}
			}
			if fmt.Sprint(reasons) != fmt.Sprint(tc.skips) {
				t.Errorf("skips %v, want %v", reasons, tc.skips)
			}
			// What the annotator writes, a reader accepts, with the policy.
			raw, err := annotation.FormatExports([]annotation.Export{{Name: "s", Namespace: "ns", Service: e.fields}}, "ns", "c")
			if err != nil {
				t.Fatalf("a reader would refuse it: %v", err)
			}
			got, rej := annotation.ParseExports(raw, "ns", "c")
			if len(rej) > 0 || len(got) != 1 || got[0].StaleEndpoints != tc.policy || got[0].StaleGraceSeconds != tc.grace {
				t.Errorf("a reader reads %+v, %v", got, rej)
			}
		})
	}
}

func withAllowedNS(s *corev1.Service, v string) *corev1.Service {
	s.Annotations[annotation.AllowedNamespacesAnnotation] = v
	return s
}

// The Service informer keeps the stale-endpoints annotation; a change of a
// ServiceExport's is a change (its generation does not move).
func TestStaleAnnotationWatched(t *testing.T) {
	s := svc("s", app)
	s.Annotations[annotation.StaleEndpointsAnnotation] = "drop-after=30s"
	s.Annotations["unrelated"] = "x"
	slim, _ := slimService(s)
	if got := slim.(*corev1.Service).Annotations; got[annotation.StaleEndpointsAnnotation] != "drop-after=30s" || got["unrelated"] != "" {
		t.Errorf("slimmed Service's annotations %v", got)
	}
	e1, e2 := serviceExport("s"), serviceExport("s")
	e1.SetResourceVersion("1")
	e2.SetResourceVersion("2")
	e2.SetAnnotations(map[string]string{annotation.StaleEndpointsAnnotation: "drop-after=30s"})
	if sameButVersion(e1, e2) {
		t.Error("a ServiceExport given a stale-endpoints annotation: want different")
	}
	e1.SetAnnotations(map[string]string{annotation.StaleEndpointsAnnotation: "drop-after=30s", "unrelated": "y"})
	if !sameButVersion(e1, e2) {
		t.Error("a ServiceExport whose other annotations alone changed: want same")
	}
}

// The annotator writes the Service's stale policy into each entry, signed
// with the rest; a ServiceExport's annotation overrides it; an unknown value
// exports without a policy, logged and counted once; a good value again
// brings the policy back.
func TestControllerWritesStalePolicy(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	backend := svc("backend", app)
	backend.Annotations[annotation.StaleEndpointsAnnotation] = "drop-after=30s"
	db := svc("db", map[string]string{"app": "db"})
	delete(db.Annotations, annotation.ExportServiceAnnotation)
	db.Annotations[annotation.StaleEndpointsAnnotation] = "drop-after=30s"
	dbExport := serviceExport("db")
	dbExport.SetAnnotations(map[string]string{annotation.StaleEndpointsAnnotation: "drop-if-local-after=1m"})
	f := startWith(t, Config{Cluster: "edge-a", SignKey: key, ServiceExportPoll: 3600e9}, true,
		[]runtime.Object{backend, db, pod("p", app), pod("db-0", map[string]string{"app": "db"})}, dbExport)

	entry := func(name, stale string) string {
		return `{"services":[{"name":"` + name + `","namespace":"ns","cluster":"edge-a","type":"ClusterSetIP"` + stale + `}]}`
	}
	signed := func(name, want string) func() error {
		return func() error {
			if err := f.podHas(name, want)(); err != nil {
				return err
			}
			p := f.pod(name)
			if r, ok := annotation.Verify(pub, p.Annotations[annotation.SignatureAnnotation], "edge-a", "ns", name, string(p.UID), want); !ok {
				return fmt.Errorf("Pod %s: signature: %v", name, r)
			}
			return nil
		}
	}
	f.eventually("the Service's policy, signed", signed("p", entry("backend", `,"staleEndpoints":"Drop","staleGraceSeconds":30`)))
	f.eventually("the ServiceExport's policy, signed", signed("db-0", entry("db", `,"staleEndpoints":"DropIfLocal","staleGraceSeconds":60`)))

	// The ServiceExport's value becomes one that does not parse: db is
	// exported without a policy (not with the Service's), logged and
	// counted once however often it is reconciled.
	setExportAnnotation := func(v string) {
		u, err := f.dyn.Resource(seGVR).Namespace("ns").Get(context.Background(), "db", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		u.SetAnnotations(map[string]string{annotation.StaleEndpointsAnnotation: v})
		if _, err := f.dyn.Resource(seGVR).Namespace("ns").Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setExportAnnotation("drop-after=soon")
	f.eventually("a bad value: no policy", signed("db-0", entry("db", "")))
	for range 3 {
		if err := f.ctl.Reconcile(context.Background(), "ns"); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(f.m.Skipped.WithLabelValues(skipStale)); got != 1 {
		t.Errorf("skipped_total{reason=%q} = %v, want 1", skipStale, got)
	}
	if err := f.podHas("p", entry("backend", `,"staleEndpoints":"Drop","staleGraceSeconds":30`))(); err != nil {
		t.Errorf("another Service's policy changed: %v", err)
	}

	setExportAnnotation("serve")
	f.eventually("serve: the default, written as no policy", signed("db-0", entry("db", "")))
	setExportAnnotation("drop-after=45s")
	f.eventually("a good value again", signed("db-0", entry("db", `,"staleEndpoints":"Drop","staleGraceSeconds":45`)))
}
