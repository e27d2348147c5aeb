package e2e

// Scoped peer credentials (issue 26 item 8): edge-a's CoreDNS reads its peer
// edge-b as the peer reader of manifests/peer, which may read Pods only in
// the namespaces edge-b's annotator (as its own ServiceAccount, with
// manifests/annotator's RBAC and admission policy) grants it: those with an
// exported Service, listed in the ConfigMap the peer follows.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

const scopeCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        peer edge-b {PEERB}
        ttl 5
    }
}
`

const (
	kubeSystem   = "kube-system"
	peerReaderSA = "mcsannotations-peer-reader"
	annotatorSA  = "mcs-annotator"
)

// scopeRBAC creates manifests/peer's and manifests/annotator's RBAC and
// admission policy in c (not the token Secret: no token controller runs
// here; the tests impersonate the ServiceAccounts).
func scopeRBAC(t *testing.T, c *harness.Cluster) {
	t.Helper()
	objs, err := harness.ReadManifests("../../manifests/peer/rbac.yaml", "../../manifests/annotator/rbac.yaml",
		"../../manifests/annotator/admission-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var keep []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() != "Secret" {
			keep = append(keep, o)
		}
	}
	harness.Eventually(t, 30*time.Second, func() error { // kube-system appears shortly after start
		_, err := c.CreateObjects(keep, false)
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
}

// kubeconfigVia rewrites kubeconfig (one of KubeconfigAs) to reach the API
// server through p.
func kubeconfigVia(t *testing.T, c *harness.Cluster, kubeconfig string, p *harness.Proxy) string {
	t.Helper()
	b, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	out := strings.Replace(string(b), strconv.Quote(c.Server()), strconv.Quote("https://"+p.Addr()), 1)
	if out == string(b) {
		t.Fatalf("no server %s in %s", c.Server(), kubeconfig)
	}
	path := filepath.Join(t.TempDir(), "peer-reader-via-proxy")
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestPeerScope(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	cs := harness.StartClusters(t, clusterID, peerID)
	a, b := cs[0], cs[1]
	scopeRBAC(t, b)
	groups := harness.ServiceAccountGroups(kubeSystem)
	harness.StartAnnotator(t, b.KubeconfigAs(t, harness.ServiceAccountUser(kubeSystem, annotatorSA), groups...),
		"--cluster", peerID, "--leader-elect=false")
	// CoreDNS starts once the annotator published its (empty) list, as it
	// would in a fleet: without the list it reads every namespace, which
	// the reader may not (Credential checks nothing of that is logged).
	harness.Eventually(t, annotatorPropagation, func() error {
		_, err := b.Client.CoreV1().ConfigMaps(source.ExportingNamespacesNamespace).Get(context.Background(), source.ExportingNamespacesName, metav1.GetOptions{})
		return err
	})
	readerKubeconfig := b.KubeconfigAs(t, harness.ServiceAccountUser(kubeSystem, peerReaderSA), groups...)
	reader := harness.NewClient(t, readerKubeconfig, 0)
	proxy := harness.StartProxy(t, b.APIServerAddr())
	d := harness.StartCoreDNS(t, scopeCorefile, map[string]string{
		"KUBECONFIG": a.Kubeconfig,
		"PEERB":      kubeconfigVia(t, b, readerKubeconfig, proxy),
	})

	// nsX exports backend (the annotator annotates its Pod); nsY has a
	// Service api that is not exported yet, and a Pod annotated by hand
	// (manual): what the exporter label and annotation alone no longer
	// give away; kube-system has one such Pod too.
	app := func(v string) map[string]string { return map[string]string{"app": v} }
	nsX, nsY := b.NewNamespace(t), b.NewNamespace(t)
	web := tcpPort("http", 80, intstr.FromInt32(8080))
	b.CreateService(t, exportedService(nsX, "backend", "true", app("backend"), web))
	plainPod(t, b, nsX, "backend-0", "10.2.0.1", app("backend"))
	b.CreateService(t, exportedService(nsY, "api", "", app("api"), web))
	plainPod(t, b, nsY, "api-0", "10.2.1.1", app("api"))
	manual := harness.ExportService{Name: "manual", Ports: []harness.ExportPort{{Name: "http", Port: 80, TargetPort: 8080}}}
	b.CreateReadyPods(t, nsY, exporter("manual-0", "", ips("10.2.1.2"), manual))
	b.CreateReadyPods(t, kubeSystem, exporter("sys-0", "", ips("10.2.9.1"), manual))

	q := func(name, ns string) harness.Query { return harness.Query{Name: svc(name, ns), Type: dns.TypeA} }
	waitPeers(t, d, annotatorPropagation+propagation, q("backend", nsX), hasAddrs("10.2.0.1"))

	t.Run("Credential", func(t *testing.T) {
		cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := reader.CoreV1().Pods(nsX).List(cx, metav1.ListOptions{}); err != nil {
			t.Errorf("the peer reader lists the Pods of exporting %s: %v", nsX, err)
		}
		for _, ns := range []string{kubeSystem, nsY, ""} {
			if _, err := reader.CoreV1().Pods(ns).List(cx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
				t.Errorf("the peer reader lists the Pods of %q: %v, want 403", ns, err)
			}
		}
		if _, err := reader.CoreV1().ConfigMaps(kubeSystem).List(cx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the peer reader lists kube-system's ConfigMaps: %v, want 403", err)
		}
		for _, name := range []string{"manual", "api"} {
			waitPeers(t, d, propagation, q(name, nsY), isNXDOMAIN)
		}
		waitPeers(t, d, propagation, q("manual", kubeSystem), isNXDOMAIN)
		if log := d.Log(); !strings.Contains(log, "cluster edge-b: reading Pods of its 1 exporting namespaces") ||
			strings.Contains(log, "broader than needed") || strings.Contains(log, "forbidden") {
			t.Errorf("CoreDNS log: want the scope of 1 namespace, no cluster-wide read, nothing forbidden:\n%s", log)
		}
	})

	// nsY starts exporting: the annotator grants it, the list names it,
	// CoreDNS reads it (the hand-annotated Pod included); then it stops,
	// and its Pods go, the hand-annotated one too (nothing removes its
	// annotation: the namespace left the list).
	t.Run("FollowsExports", func(t *testing.T) {
		exported := "true"
		b.PatchServiceAnnotations(t, nsY, "api", map[string]*string{harness.ServiceExportAnnotation: &exported})
		waitPeers(t, d, annotatorPropagation+propagation, q("api", nsY), hasAddrs("10.2.1.1"))
		waitPeers(t, d, propagation, q("manual", nsY), hasAddrs("10.2.1.2"))
		b.PatchServiceAnnotations(t, nsY, "api", map[string]*string{harness.ServiceExportAnnotation: nil})
		waitPeers(t, d, annotatorPropagation+propagation, q("manual", nsY), isNXDOMAIN)
		waitPeers(t, d, propagation, q("api", nsY), isNXDOMAIN)
		waitPeers(t, d, propagation, q("backend", nsX), hasAddrs("10.2.0.1"))
		cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		harness.Eventually(t, annotatorPropagation, func() error {
			_, err := reader.CoreV1().Pods(nsY).List(cx, metav1.ListOptions{})
			if !apierrors.IsForbidden(err) {
				return fmt.Errorf("the peer reader lists the Pods of %s after it stopped exporting: %v, want 403", nsY, err)
			}
			return nil
		})
	})

	// Cut off: CoreDNS keeps answering from what it holds; a namespace that
	// stops exporting meanwhile goes once the link is back, and a change
	// made then is followed.
	t.Run("CutOff", func(t *testing.T) {
		exported := "true"
		b.PatchServiceAnnotations(t, nsY, "api", map[string]*string{harness.ServiceExportAnnotation: &exported})
		waitPeers(t, d, annotatorPropagation+propagation, q("manual", nsY), hasAddrs("10.2.1.2"))
		proxy.Cut(t)
		b.PatchServiceAnnotations(t, nsY, "api", map[string]*string{harness.ServiceExportAnnotation: nil})
		consistentlyPeers(t, d, 3*time.Second, q("manual", nsY), hasAddrs("10.2.1.2"))
		consistentlyPeers(t, d, time.Second, q("backend", nsX), hasAddrs("10.2.0.1"))
		proxy.Restore(t)
		waitPeers(t, d, annotatorPropagation+propagation, q("manual", nsY), isNXDOMAIN)
		plainPod(t, b, nsX, "backend-1", "10.2.0.2", app("backend"))
		waitPeers(t, d, annotatorPropagation+propagation, q("backend", nsX), hasAddrs("10.2.0.1", "10.2.0.2"))
	})
}

// consistentlyPeers fails unless every answer to q on d passes check for d.
func consistentlyPeers(t *testing.T, d *harness.CoreDNS, dur time.Duration, q harness.Query, check func(*dns.Msg) error) {
	t.Helper()
	q.Timeout = peerQueryTimeout
	harness.Consistently(t, dur, 100*time.Millisecond, func() error {
		m, err := d.Exchange(q)
		if err == nil {
			err = check(m)
		}
		if err != nil {
			return fmt.Errorf("%s: %v", qstr(q), err)
		}
		return nil
	})
}
