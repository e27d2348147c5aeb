package e2e

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// Endpoint statements (annotator --sign-endpoints, for relay hubs): the
// real bin/mcs-annotator states an exported Pod's addresses, hostname and
// readiness, signed with edge-a's key; a readiness flip set through the API,
// as the kubelet sets it, gets a new statement with a larger seq.

// waitStatement waits until Pod ns/name carries a statement that verifies
// with key over its export annotation and says ready with ips and the
// hostname, with a seq above after; it returns the statement.
func waitStatement(t *testing.T, c *harness.Cluster, ns, name, hostname string, key ed25519.PublicKey, ready bool, after uint64, ips ...string) annotation.Endpoint {
	t.Helper()
	var e annotation.Endpoint
	took := harness.Eventually(t, signingPropagation, func() error {
		cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := c.Client.CoreV1().Pods(ns).Get(cx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		raw, sig := p.Annotations[annotation.EndpointAnnotation], p.Annotations[annotation.EndpointSignatureAnnotation]
		if e, _, err = annotation.ParseEndpoint(raw); err != nil {
			return fmt.Errorf("pod %s/%s: %v", ns, name, err)
		}
		if r, ok := annotation.VerifyEndpoint(key, sig, clusterID, ns, name, string(p.UID), p.Annotations[annotation.ExportAnnotation], raw); !ok {
			return fmt.Errorf("pod %s/%s: statement %s: %v", ns, name, raw, r)
		}
		if e.Ready != ready || e.Hostname != hostname || !slices.Equal(e.IPs, ips) || e.Seq <= after {
			return fmt.Errorf("pod %s/%s: statement %s; want ready %v, addresses %v, hostname %s, seq above %d", ns, name, raw, ready, ips, hostname, after)
		}
		return nil
	})
	t.Logf("pod %s/%s: statement ready=%v seq %d after %s", ns, name, ready, e.Seq, took.Round(time.Millisecond))
	return e
}

func TestEndpointStatementFollowsReadiness(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	c := harness.StartCluster(t, clusterID)
	keys := newSigningKeyPair(t, clusterID)
	a := harness.StartAnnotator(t, c.Kubeconfig, "--cluster", clusterID, "--sign-key", keys.PrivatePath, "--sign-endpoints", "--leader-elect=false")

	ns := c.NewNamespace(t)
	web := map[string]string{"app": "web"}
	createSignedTestService(t, c, ns, "backend", web)
	c.CreatePod(t, ns, harness.Pod{Name: "web-0", Hostname: "web-0", Labels: web})
	waitSigned(t, c, ns, "web-0", keys.Public)
	// Pending, no address yet: stated as such.
	pending := waitStatement(t, c, ns, "web-0", "web-0", keys.Public, false, 0)

	const v4, v6 = "10.250.71.1", "fd00:71::1"
	c.SetPodReady(t, ns, "web-0", true, v4, v6)
	ready := waitStatement(t, c, ns, "web-0", "web-0", keys.Public, true, pending.Seq, v4, v6)

	c.SetPodReady(t, ns, "web-0", false)
	waitStatement(t, c, ns, "web-0", "web-0", keys.Public, false, ready.Seq, v4, v6)

	harness.Eventually(t, signingPropagation, func() error {
		n, _, err := a.Metric("mcs_annotator_endpoint_statements_total")
		if err != nil {
			return err
		}
		if n < 3 {
			return fmt.Errorf("mcs_annotator_endpoint_statements_total %v, want at least 3 (pending, ready, not ready)", n)
		}
		return nil
	})
}
