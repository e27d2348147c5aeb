package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// TestRelayHub: an origin cluster (edge-b) whose real annotator signs its
// exports, and a hub (edge-a) running the real MCS controller with --relay,
// reading edge-b through a link the test cuts. The hub's EndpointSlices of
// edge-b carry, for each Pod, the origin's own bytes: its name, UID and
// export annotation; for the Pod with a signed endpoint statement (written
// here with the origin's key, as an origin annotator with --sign-endpoints
// would), that statement and signature, which verify with edge-b's key; for
// the Pod without one, an unsigned statement of its addresses and
// readiness. The hub keeps a Lease per cluster it reads, which says
// connected, then, once the link is cut, disconnected with the last contact.
func TestRelayHub(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	const ns, hubNS, origin, hub = "relay", "hub-system", "edge-b", "edge-a"
	cs := mcsClusters(t, ns, hub, origin)
	a, b := cs[0], cs[1]
	a.CreateNamespace(t, hubNS)
	keys := newSigningKeyPair(t, origin)
	web := map[string]string{"app": "web"}
	createSignedTestService(t, b, ns, "web", web)
	plainPod(t, b, ns, "web-1", "10.244.2.1", web)
	plainPod(t, b, ns, "web-2", "10.244.2.2", web)
	harness.StartAnnotator(t, b.Kubeconfig, "--cluster", origin, "--sign-key", keys.PrivatePath, "--leader-elect=false")

	// The origin's annotator has signed both Pods' exports; web-1 also
	// states its endpoint, signed.
	pods := map[string]*corev1.Pod{}
	harness.Eventually(t, signingPropagation, func() error {
		for _, name := range []string{"web-1", "web-2"} {
			cx, cancel := ctxTimeout()
			p, err := b.Client.CoreV1().Pods(ns).Get(cx, name, metav1.GetOptions{})
			cancel()
			if err != nil {
				return err
			}
			if r, ok := annotation.Verify(keys.Public, p.Annotations[annotation.SignatureAnnotation], origin, ns, name, string(p.UID), p.Annotations[annotation.ExportAnnotation]); !ok {
				return fmt.Errorf("pod %s: export not signed yet: %v", name, r)
			}
			pods[name] = p
		}
		return nil
	})
	stmt := annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{"10.244.2.1"}, Ready: true, Seq: 1700000000000})
	p1 := pods["web-1"]
	sig := annotation.SignEndpoint(keys.Private, origin, ns, p1.Name, string(p1.UID), p1.Annotations[annotation.ExportAnnotation], stmt)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		annotation.EndpointAnnotation: stmt, annotation.EndpointSignatureAnnotation: sig}}})
	cx, cancel := ctxTimeout()
	if _, err := b.Client.CoreV1().Pods(ns).Patch(cx, p1.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	cancel()

	link := harness.StartProxy(t, b.APIServerAddr())
	ctl := harness.StartAnnotator(t, a.Kubeconfig, "--cluster", hub, "--leader-elect=false", "--lease-namespace", hubNS,
		"-mcs-controller", "--relay", "-peer", origin+"="+b.KubeconfigVia(t, link))

	// The hub's slices of edge-b relay both Pods.
	eventuallyMCS(t, a, ns, "web", "edge-b's Pods relayed", func(v mcsView) error {
		var got []relay.Pod
		var exports []string
		for _, s := range v.slices {
			if s.Labels[mcsv1beta1.LabelSourceCluster] != origin {
				continue
			}
			raw, ok := s.Annotations[relay.SliceAnnotation]
			if !ok {
				return fmt.Errorf("slice %s: no relay annotation", s.Name)
			}
			rs, err := relay.Parse(raw)
			if err != nil {
				return err
			}
			for _, p := range rs.Pods {
				got = append(got, p)
				exports = append(exports, rs.Exports[p.Export])
			}
		}
		if len(got) != 2 {
			return fmt.Errorf("relayed %+v, want web-1 and web-2", got)
		}
		for i, rp := range got {
			op := pods[rp.Name]
			if op == nil || rp.UID != string(op.UID) || exports[i] != op.Annotations[annotation.ExportAnnotation] {
				return fmt.Errorf("relayed %+v with export %q: not the origin Pod's name, UID and export bytes", rp, exports[i])
			}
			_, verified := annotation.VerifyEndpoint(keys.Public, rp.Signature, origin, ns, rp.Name, rp.UID, exports[i], rp.Endpoint)
			switch rp.Name {
			case "web-1":
				if rp.Endpoint != stmt || rp.Signature != sig || !verified {
					return fmt.Errorf("web-1: statement %q, signature %q (verifies %v): want the origin's, verifying", rp.Endpoint, rp.Signature, verified)
				}
			case "web-2":
				e, ips, err := annotation.ParseEndpoint(rp.Endpoint)
				if err != nil || len(ips) != 1 || ips[0].String() != "10.244.2.2" || !e.Ready || e.Seq != 1 || rp.Signature != "" || verified {
					return fmt.Errorf("web-2: statement %q (%v), signature %q: want the hub's own, of 10.244.2.2 ready, seq 1, unsigned", rp.Endpoint, err, rp.Signature)
				}
			}
		}
		return nil
	})

	// One Lease per cluster the hub reads.
	lease := func(cluster string) (*coordinationv1.Lease, error) {
		cx, cancel := ctxTimeout()
		defer cancel()
		return a.Client.CoordinationV1().Leases(hubNS).Get(cx, relay.LeasePrefix+cluster, metav1.GetOptions{})
	}
	says := func(cluster, state string) func() error {
		return func() error {
			l, err := lease(cluster)
			if err != nil {
				return err
			}
			if got := l.Annotations[relay.OriginStateAnnotation]; got != state || l.Labels[relay.OriginLabel] != cluster ||
				l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != hub || l.Spec.RenewTime == nil {
				return fmt.Errorf("Lease of %s: state %q, labels %v, spec %+v: want %s, held by %s, with a renewTime", cluster, got, l.Labels, l.Spec, state, hub)
			}
			return nil
		}
	}
	for _, cl := range []string{hub, origin} {
		harness.Eventually(t, mcsPropagation, says(cl, "connected"))
	}

	// Cut: the Lease says disconnected, renewed when the hub last heard
	// from the origin (before the cut, within a probe interval of it).
	cut := time.Now()
	link.Cut(t)
	harness.Eventually(t, mcsPropagation, says(origin, "disconnected"))
	l, err := lease(origin)
	if err != nil {
		t.Fatal(err)
	}
	if rt := l.Spec.RenewTime.Time; rt.After(cut.Add(time.Second)) || rt.Before(cut.Add(-10*time.Second)) {
		t.Errorf("Lease of %s: renewTime %v, want the last contact before the cut at %v", origin, rt, cut)
	}
	if err := says(hub, "connected")(); err != nil {
		t.Error(err)
	}
	// The relayed records stay as last written while the origin is cut.
	v, err := readMCS(a, ns, "web")
	if err != nil {
		t.Fatal(err)
	}
	if got := v.addrsBy()[origin]; !slices.Equal(got, []string{"10.244.2.1", "10.244.2.2"}) {
		t.Errorf("edge-b's endpoints at the hub after the cut: %v", got)
	}
	if n, _, err := ctl.Metric(`mcs_controller_writes_total{kind="lease",result="error"}`); err != nil || n != 0 {
		t.Errorf("Lease write errors %v (%v), want 0", n, err)
	}
}
