package mcsannotations

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coretest "github.com/coredns/coredns/test"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// signedExporter is an exporter Pod whose annotation cluster's annotator
// signed with key (nil: unsigned).
func signedExporter(name, ip, anno, cluster string, key ed25519.PrivateKey) *v1.Pod {
	p := exporter(name, ip, anno)
	p.UID = types.UID("uid-" + name)
	if key != nil {
		p.Annotations[annotation.SignatureAnnotation] = annotation.Sign(key, cluster, p.Namespace, p.Name, string(p.UID), anno)
	}
	return p
}

// With verify, a real server answers from the Pods whose signature verifies
// with the key of the cluster they were read from, and logs and counts the
// others by cluster and reason.
func TestServerVerifiesSignatures(t *testing.T) {
	keys := t.TempDir()
	a, b := writeKey(t, keys, "edge-a"), writeKey(t, keys, "edge-b")
	c := writeKey(t, keys, "edge-c")
	copied := signedExporter("b2", "10.1.0.2", backendAnno, "edge-b", b)
	copied.Name = "b-copy" // the same signature on another Pod
	withClient(t, byKubeconfig(map[string]kubernetes.Interface{
		"/edge-a": fake.NewClientset(signedExporter("a1", "10.0.0.1", backendAnno, "edge-a", a),
			signedExporter("a-unsigned", "10.0.0.66", backendAnno, "edge-a", nil)),
		"/edge-b": fake.NewClientset(signedExporter("b1", "10.1.0.1", backendAnno, "edge-b", b), copied,
			// Signed with edge-a's key, read from edge-b.
			signedExporter("b-forged", "10.1.0.66", backendAnno, "edge-b", a)),
		"/edge-c": fake.NewClientset(signedExporter("c1", "10.2.0.1", backendAnno, "edge-c", c)),
	}))
	counts := map[[2]string]float64{
		{"edge-a", "unsigned"}: 1, {"edge-b", "bad_signature"}: 2, {"edge-c", "bad_signature"}: 0, {"edge-a", "bad_signature"}: 0,
	}
	before := map[[2]string]float64{}
	for k := range counts {
		before[k] = testutil.ToFloat64(rejectedAnnotations.WithLabelValues(k[0], k[1]))
	}
	logs := captureLog(t)

	i, udp, _, err := coretest.CoreDNSServerAndPorts(peersCorefile("locality any\nverify " + keys))
	if err != nil {
		t.Fatal(err)
	}
	defer stopServer(i)
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1", "10.1.0.1", "10.2.0.1"})
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		done := true
		for k, want := range counts {
			if testutil.ToFloat64(rejectedAnnotations.WithLabelValues(k[0], k[1]))-before[k] != want {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			for k, want := range counts {
				t.Errorf("rejections %v: %v, want %v", k, testutil.ToFloat64(rejectedAnnotations.WithLabelValues(k[0], k[1]))-before[k], want)
			}
			t.FailNow()
		}
	}
	for _, want := range []string{
		"cluster edge-a: Pod default/a-unsigned: annotation ignored as a whole: unsigned: no multicluster.kubernetes.io/export-signature annotation",
		"cluster edge-b: Pod default/b-copy: annotation ignored as a whole: bad_signature: does not verify with cluster edge-b's key",
		"cluster edge-b: Pod default/b-forged: annotation ignored as a whole: bad_signature",
	} {
		if !strings.Contains(logs(), want) {
			t.Errorf("no log line %q", want)
		}
	}
}

// A local cluster ID that is not in the Corefile is known only in newMCS:
// its key is checked there, and CoreDNS does not start without it.
func TestVerifyDiscoveredClusterID(t *testing.T) {
	oldTimeout := discoverTimeout
	discoverTimeout = 500 * time.Millisecond
	t.Cleanup(func() { discoverTimeout = oldTimeout })
	withClusterProperty(t, "edge-z")
	keys := t.TempDir()
	writeKey(t, keys, "edge-b")
	snap := filepath.Join(t.TempDir(), "table.db")
	corefile := "mcsannotations {\n snapshot " + snap + "\n peer edge-b /b\n verify " + keys + "\n}"

	_, err := newMCS(parsed(t, corefile))
	want := "verify " + keys + ": no public key for the local cluster edge-z: " + filepath.Join(keys, "edge-z.pub") +
		" is missing (the cluster ID is not in the Corefile; it was read from the ClusterProperty)"
	if err == nil || err.Error() != want {
		t.Fatalf("error %v, want %q", err, want)
	}
	// Remembered beside the snapshot (by the failed start), offline.
	withClient(t, deadAPI)
	_, err = newMCS(parsed(t, corefile))
	if err == nil || !strings.Contains(err.Error(), "no public key for the local cluster edge-z") ||
		!strings.Contains(err.Error(), "it was remembered in "+snap+clusterIDSuffix) {
		t.Fatalf("remembered: error %v", err)
	}
	// With the key it starts.
	writeKey(t, keys, "edge-z")
	if _, err := newMCS(parsed(t, corefile)); err != nil {
		t.Fatal(err)
	}
	// Through setup, the error stops CoreDNS.
	os.Remove(filepath.Join(keys, "edge-z.pub"))
	if _, err := coretest.CoreDNSServer("clusterset.local:0 {\n bind 127.0.0.1\n" + corefile + "\n}"); err == nil ||
		!strings.Contains(err.Error(), "plugin/mcsannotations: verify "+keys+": no public key for the local cluster edge-z") {
		t.Fatalf("CoreDNS start: %v", err)
	}
}
