package e2e

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// Signature verification (docs/DESIGN.md#security): bin/mcs-annotator signs
// what it writes with edge-a's key, and bin/coredns with `verify` answers only
// from Pods whose signature verifies with that cluster's public key.

// signingCorefile is the plugin on edge-a with `verify {KEYS}`, and its
// metrics on {METRICS}.
const signingCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    prometheus 127.0.0.1:{METRICS}
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        ttl 5
        verify {KEYS}
    }
}
`

// signingPropagation bounds how long the annotator may take to annotate
// (and sign) a Pod its Service selects.
const signingPropagation = 15 * time.Second

// signingKeyPair is an ed25519 key pair written as the annotator and the
// plugin read them: the private key (PEM PKCS #8 "PRIVATE KEY") at
// PrivatePath, the public one (PEM PKIX "PUBLIC KEY") as Dir/<cluster>.pub.
type signingKeyPair struct {
	Public      ed25519.PublicKey
	Private     ed25519.PrivateKey
	PrivatePath string
	Dir         string
}

func newSigningKeyPair(t *testing.T, cluster string) signingKeyPair {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	k := signingKeyPair{Public: pub, Private: priv, PrivatePath: filepath.Join(dir, "key.pem"), Dir: filepath.Join(dir, "keys")}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(k.PrivatePath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	der, err = x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(k.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(k.Dir, cluster+annotation.KeySuffix), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return k
}

// createSignedTestService creates a ClusterIP Service, port http 80 ->
// 8080/TCP, selecting selector, that asks the annotator to export it.
func createSignedTestService(t *testing.T, c *harness.Cluster, ns, name string, selector map[string]string) {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Annotations: map[string]string{annotation.ExportServiceAnnotation: "true"}},
		Spec: corev1.ServiceSpec{Selector: selector, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Client.CoreV1().Services(ns).Create(cx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service %s/%s: %v", ns, name, err)
	}
}

// createSigningPod creates a Pod with these labels and annotations and makes
// it Running and Ready with ip; it returns the Pod as created (with its UID).
func createSigningPod(t *testing.T, c *harness.Cluster, ns, name, ip string, labels, annos map[string]string) *corev1.Pod {
	t.Helper()
	p := c.CreatePodObject(t, harness.Pod{Name: name, Labels: labels, Annotations: annos}.Object(ns))
	c.SetPodReady(t, ns, name, true, ip)
	return p
}

// waitSigned waits until the annotator has annotated the Pod and signed the
// annotation with key, for edge-a, and returns both annotations.
func waitSigned(t *testing.T, c *harness.Cluster, ns, name string, key ed25519.PublicKey) (value, sig string) {
	t.Helper()
	took := harness.Eventually(t, signingPropagation, func() error {
		cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := c.Client.CoreV1().Pods(ns).Get(cx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		value, sig = p.Annotations[annotation.ExportAnnotation], p.Annotations[annotation.SignatureAnnotation]
		if value == "" || sig == "" {
			return fmt.Errorf("pod %s/%s: export annotation %q, signature %q: want both", ns, name, value, sig)
		}
		if r, ok := annotation.Verify(key, sig, clusterID, ns, name, string(p.UID), value); !ok {
			return fmt.Errorf("pod %s/%s: the annotator's signature does not verify: %v", ns, name, r)
		}
		return nil
	})
	t.Logf("pod %s/%s annotated and signed after %s", ns, name, took.Round(time.Millisecond))
	return value, sig
}

// rejectedMetric reads coredns_mcsannotations_rejected_annotations_total for
// edge-a and reason from the metrics on port.
func rejectedMetric(port int, reason string) (float64, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "coredns_mcsannotations_rejected_annotations_total{") &&
			strings.Contains(line, `cluster="`+clusterID+`"`) && strings.Contains(line, `reason="`+reason+`"`) {
			f := strings.Fields(line)
			return strconv.ParseFloat(f[len(f)-1], 64)
		}
	}
	return 0, sc.Err() // a label pair never counted is absent: 0
}

// answersExactly waits until name's A records are exactly want (sorted).
func answersExactly(t *testing.T, d *harness.CoreDNS, name string, want []string) {
	t.Helper()
	harness.Eventually(t, propagation, func() error {
		m, err := d.Exchange(harness.Query{Name: name, Type: dns.TypeA})
		if err != nil {
			return err
		}
		got := harness.Addrs(m)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s: %s %v, want %v", name, harness.Rcode(m), got, want)
		}
		return nil
	})
}

// Two Pods that the annotator exports and signs are answered; Pods in the
// same namespace that claim the same service by hand (unsigned, with a
// signature copied from a legitimate Pod, signed with a key that is not
// edge-a's) are not, and each is logged and counted by reason. The same
// Pods without `verify` all answer, so the hostile ones are no straw men.
func TestSigningAnswersOnlySignedPods(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	c := harness.StartCluster(t, clusterID)
	keys := newSigningKeyPair(t, clusterID)
	harness.StartAnnotator(t, c.Kubeconfig, "--cluster", clusterID, "--sign-key", keys.PrivatePath, "--leader-elect=false")

	ns := c.NewNamespace(t)
	web := map[string]string{"app": "web"}
	createSignedTestService(t, c, ns, "backend", web)
	const web1, web2 = "10.250.70.1", "10.250.70.2"
	createSigningPod(t, c, ns, "web-1", web1, web, nil)
	createSigningPod(t, c, ns, "web-2", web2, web, nil)
	value, sig := waitSigned(t, c, ns, "web-1", keys.Public)
	waitSigned(t, c, ns, "web-2", keys.Public)

	// The hostile Pods: not selected by the Service, exporter label set by
	// hand, the very annotation the annotator wrote.
	hostile := map[string]string{"app": "intruder", annotation.ExporterLabel: annotation.LabelValue}
	const unsignedIP, copiedIP, forgedIP = "10.250.70.66", "10.250.70.67", "10.250.70.68"
	createSigningPod(t, c, ns, "hostile-unsigned", unsignedIP, hostile, map[string]string{annotation.ExportAnnotation: value})
	createSigningPod(t, c, ns, "hostile-copied", copiedIP, hostile,
		map[string]string{annotation.ExportAnnotation: value, annotation.SignatureAnnotation: sig})
	// Signed for this very Pod (its name and UID) and edge-a, with a key
	// that is not edge-a's.
	forged := createSigningPod(t, c, ns, "hostile-forged", forgedIP, hostile, map[string]string{annotation.ExportAnnotation: value})
	_, other, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c.SetPodAnnotation(t, ns, forged.Name, annotation.SignatureAnnotation,
		annotation.Sign(other, clusterID, ns, forged.Name, string(forged.UID), value))

	metrics := harness.FreePort(t)
	d := harness.StartCoreDNS(t, signingCorefile, map[string]string{
		"KUBECONFIG": c.Kubeconfig, "KEYS": keys.Dir, "METRICS": strconv.Itoa(metrics)})
	name := "backend." + ns + ".svc." + zone
	answersExactly(t, d, name, []string{web1, web2})
	for _, ip := range []string{unsignedIP, copiedIP, forgedIP} {
		m, err := d.Exchange(harness.Query{Name: strings.ReplaceAll(ip, ".", "-") + "." + clusterID + "." + name, Type: dns.TypeA})
		if err != nil {
			t.Fatal(err)
		}
		if m.Rcode != dns.RcodeNameError {
			t.Errorf("the hostile Pod %s has an endpoint name: %s %v", ip, harness.Rcode(m), harness.Addrs(m))
		}
	}
	harness.Eventually(t, propagation, func() error {
		for reason, want := range map[annotation.Reason]float64{annotation.ReasonUnsigned: 1, annotation.ReasonBadSignature: 2} {
			got, err := rejectedMetric(metrics, string(reason))
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("rejected_annotations_total{cluster=%q,reason=%q} = %v, want %v", clusterID, reason, got, want)
			}
		}
		return nil
	})
	logs := d.Log()
	for _, want := range []string{
		"cluster edge-a: Pod " + ns + "/hostile-unsigned: annotation ignored as a whole: unsigned",
		"cluster edge-a: Pod " + ns + "/hostile-copied: annotation ignored as a whole: bad_signature",
		"cluster edge-a: Pod " + ns + "/hostile-forged: annotation ignored as a whole: bad_signature",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("no log line %q in CoreDNS's log:\n%s", want, d.LogTail(40))
		}
	}
	for _, p := range []string{"web-1", "web-2"} {
		if strings.Contains(logs, "Pod "+ns+"/"+p+":") {
			t.Errorf("the signed Pod %s was logged as rejected:\n%s", p, d.LogTail(40))
		}
	}

	// Live: a third Pod the Service selects is signed and joins.
	const web3 = "10.250.70.3"
	createSigningPod(t, c, ns, "web-3", web3, web, nil)
	waitSigned(t, c, ns, "web-3", keys.Public)
	answersExactly(t, d, name, []string{web1, web2, web3})

	// Without verify, the same Pods all answer.
	plain := harness.StartCoreDNS(t, corefile, map[string]string{"KUBECONFIG": c.Kubeconfig})
	answersExactly(t, plain, name, []string{web1, web2, web3, unsignedIP, copiedIP, forgedIP})
}

// A CoreDNS whose verify folder lacks the key of a cluster it watches, or
// holds a key that does not parse, does not start, and says why.
func TestSigningRefusesToStartWithoutKeys(t *testing.T) {
	tools := harness.RequireTools(t, harness.ToolCoreDNS)
	keys := newSigningKeyPair(t, "edge-b")
	garbage := t.TempDir()
	if err := os.WriteFile(filepath.Join(garbage, "edge-a.pub"), []byte("not a key\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, block, want string
	}{
		{"local", "cluster edge-a\n verify " + keys.Dir,
			"no public key for the local cluster edge-a: " + filepath.Join(keys.Dir, "edge-a.pub") + " is missing"},
		{"peer", "cluster edge-b\n peer edge-c /nonexistent\n verify " + keys.Dir,
			"no public key for peer edge-c: " + filepath.Join(keys.Dir, "edge-c.pub") + " is missing"},
		{"garbage", "cluster edge-a\n verify " + garbage,
			filepath.Join(garbage, "edge-a.pub") + `: no PEM "PUBLIC KEY" block`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := filepath.Join(t.TempDir(), "Corefile")
			body := "clusterset.local:0 {\n bind 127.0.0.1\n mcsannotations {\n kubeconfig /nonexistent\n " + tc.block + "\n }\n}\n"
			if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			cx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(cx, tools.CoreDNS, "-conf", conf).CombinedOutput()
			if err == nil || cx.Err() != nil {
				t.Fatalf("CoreDNS: %v (context %v), want a failed start:\n%s", err, cx.Err(), out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("CoreDNS said:\n%s\nwant %q", out, tc.want)
			}
		})
	}
}
