package e2e

// The exporter's stale policy end to end: edge-b's real annotator writes
// each Service's multicluster.kubernetes.io/stale-endpoints into the export
// entries it signs; edge-a's CoreDNS (verify on) reads edge-b through a
// harness proxy whose link is cut. While cut, a client with EDNS0 (miekg/dns,
// and dig, with and without +ednsopt) sees EDE 3 naming edge-b; the service
// exported with drop-after stops answering edge-b's endpoints after its
// grace, the one with the default keeps answering them, those with
// drop-if-local-after drop them only where edge-a has endpoints of its own;
// mcsctl reads the states and policies from the snapshot; and all of it
// holds after CoreDNS restarts while still cut (the policy comes from the
// snapshot).

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
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

// stalePolicyCorefile is staleCorefile with verify.
const stalePolicyCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        peer edge-b {PEERB}
        snapshot {SNAPSHOT}
        locality any
        verify {KEYS}
        ttl 5
    }
    prometheus 127.0.0.1:{METRICS}
}
`

// stalePolicyGrace is the grace of the drop policies of the test: short,
// to keep the test short; the rule is the same for any grace.
const stalePolicyGrace = 10 * time.Second

// staleGrace is the plugin's: records count as current for this long after
// the last contact, or after a start.
const staleGrace = 5 * time.Second

func TestStalePolicyThroughAnnotator(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	cs := harness.StartClusters(t, clusterID, peerID)
	a, b := cs[0], cs[1]
	keysB := newSigningKeyPair(t, peerID)
	keysA := newSigningKeyPair(t, clusterID)
	pubA, err := os.ReadFile(filepath.Join(keysA.Dir, clusterID+annotation.KeySuffix))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(keysB.Dir, clusterID+annotation.KeySuffix), pubA, 0o644); err != nil {
		t.Fatal(err)
	}
	harness.StartAnnotator(t, b.Kubeconfig, "--cluster", peerID, "--sign-key", keysB.PrivatePath, "--leader-elect=false")

	ns := a.NewNamespace(t)
	b.CreateNamespace(t, ns)
	grace := "=" + stalePolicyGrace.String()
	services := []struct {
		name, stale string // the Service's annotation; "": none
		policy      string // what the annotator must write
		peerIP      string
		localIP     string // edge-a's endpoint; "": none
	}{
		{"kept", "", "", "10.2.41.1", "10.1.41.1"},
		{"dropped", "drop-after" + grace, annotation.StaleDrop, "10.2.41.2", ""},
		{"local", "drop-if-local-after" + grace, annotation.StaleDropIfLocal, "10.2.41.3", "10.1.41.3"},
		{"lonely", "drop-if-local-after" + grace, annotation.StaleDropIfLocal, "10.2.41.4", ""},
	}
	port := harness.ExportPort{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}
	for _, s := range services {
		sel := map[string]string{"app": s.name}
		obj := harness.ServiceObject(ns, s.name, sel, corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP})
		obj.Annotations = map[string]string{annotation.ExportServiceAnnotation: "true"}
		if s.stale != "" {
			obj.Annotations[annotation.StaleEndpointsAnnotation] = s.stale
		}
		b.CreateService(t, obj)
		createSigningPod(t, b, ns, s.name+"-b", s.peerIP, sel, nil)
		if s.localIP != "" {
			// edge-a's own endpoint, its annotation signed with edge-a's key.
			value := harness.ExportJSON(harness.ExportService{Name: s.name, Ports: []harness.ExportPort{port}})
			p := createSigningPod(t, a, ns, s.name+"-a", s.localIP, map[string]string{annotation.ExporterLabel: annotation.LabelValue},
				map[string]string{annotation.ExportAnnotation: value})
			a.SetPodAnnotation(t, ns, p.Name, annotation.SignatureAnnotation, annotation.Sign(keysA.Private, clusterID, ns, p.Name, string(p.UID), value))
		}
	}
	// The annotator writes each Service's policy into the entries it signs.
	for _, s := range services {
		value := waitSignedBy(t, b, peerID, ns, s.name+"-b", keysB.Public)
		exps, rej := annotation.ParseExports(value, ns, peerID)
		if len(rej) > 0 || len(exps) != 1 || exps[0].StaleEndpoints != s.policy ||
			(s.policy != "" && time.Duration(exps[0].StaleGraceSeconds)*time.Second != stalePolicyGrace) {
			t.Fatalf("%s: the annotator wrote %s (%v), want the policy %q with the grace %s", s.name, value, rej, s.policy, stalePolicyGrace)
		}
	}

	p := harness.StartProxy(t, b.APIServerAddr())
	metrics := harness.FreePort(t)
	snap := snapshotPath(t)
	d := harness.StartCoreDNS(t, stalePolicyCorefile, map[string]string{
		"KUBECONFIG": a.Kubeconfig,
		"PEERB":      b.KubeconfigVia(t, p),
		"SNAPSHOT":   snap,
		"KEYS":       keysB.Dir,
		"METRICS":    strconv.Itoa(metrics),
	})
	t.Cleanup(func() {
		if !d.Running() {
			_, err := d.Process().Exited()
			t.Errorf("CoreDNS exited during the test (%v)", err)
		}
	})
	query := func(name string) harness.Query {
		return harness.Query{Name: svc(name, ns), Type: dns.TypeA, UDPSize: 1232, Timeout: peerQueryTimeout}
	}
	connected := func() {
		for _, s := range services {
			want := []string{s.peerIP}
			if s.localIP != "" {
				want = append(want, s.localIP)
			}
			waitPeers(t, d, initialSync, query(s.name), marked(false, "", want...))
		}
	}
	connected()

	p.Cut(t)
	cut := time.Now()
	// While cut, past the grace: what each policy says.
	whileCut := func(when string) {
		t.Helper()
		for _, c := range []struct {
			name  string
			check func(*dns.Msg) error
		}{
			{"kept", marked(true, peerID, "10.1.41.1", "10.2.41.1")}, // serve: edge-b's endpoint, marked
			{"dropped", isNXDOMAIN},                                  // drop-after: its only endpoint is gone
			{"local", marked(false, "", "10.1.41.3")},                // drop-if-local-after, with a local endpoint: only that one
			{"lonely", marked(true, peerID, "10.2.41.4")},            // drop-if-local-after, none local: kept, marked
		} {
			waitPeers(t, d, staleMark+stalePolicyGrace, query(c.name), c.check)
			t.Logf("%s: %s answers as its policy says, %s after the cut", when, c.name, time.Since(cut).Round(time.Millisecond))
		}
	}
	whileCut("cut")
	kept := svc("kept", ns)
	checkStale(t, d, harness.Query{Name: kept, Type: dns.TypeA, Timeout: peerQueryTimeout},
		harness.Query{Name: dashed("10.2.41.1") + "." + peerID + "." + kept, Type: dns.TypeA, UDPSize: 1232, Timeout: peerQueryTimeout},
		harness.Query{Name: dashed("10.1.41.1") + "." + clusterID + "." + kept, Type: dns.TypeA, UDPSize: 1232, Timeout: peerQueryTimeout},
		query("kept"), []string{"10.1.41.1", "10.2.41.1"})
	digEDNSOpt(t, d, kept)
	// The policy is visible in the tools: mcsctl reads CoreDNS's snapshot.
	checkMcsctlStale(t, snap, ns)

	// CoreDNS restarts while the link is still cut: the records and each
	// entry's policy come from the snapshot.
	// From the first answer on: the snapshot recorded edge-b out of
	// contact, so the policies apply without the 5 s grace after a start
	// (which would answer dropped's endpoint again meanwhile).
	d.Restart(t)
	restarted := time.Now()
	for time.Since(restarted) < 2*staleGrace {
		m, err := d.Exchange(query("dropped"))
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(harness.Addrs(m), "10.2.41.2") {
			t.Fatalf("dropped %s after the restart while cut: %s %v, want edge-b's endpoint left out", time.Since(restarted).Round(time.Millisecond), harness.Rcode(m), harness.Addrs(m))
		}
		time.Sleep(250 * time.Millisecond)
	}
	whileCut("after the restart while cut")
	checkMcsctlStale(t, snap, ns)
	logPluginLines(t, d, "out of contact", "snapshot")

	p.Restore(t)
	connected()
}

// waitSignedBy waits until the annotator of cluster has annotated the Pod
// and signed the annotation with key, and returns the annotation.
func waitSignedBy(t *testing.T, c *harness.Cluster, cluster, ns, name string, key ed25519.PublicKey) string {
	t.Helper()
	var value string
	harness.Eventually(t, signingPropagation, func() error {
		cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := c.Client.CoreV1().Pods(ns).Get(cx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var sig string
		value, sig = p.Annotations[annotation.ExportAnnotation], p.Annotations[annotation.SignatureAnnotation]
		if value == "" || sig == "" {
			return fmt.Errorf("pod %s/%s: export annotation %q, signature %q: want both", ns, name, value, sig)
		}
		if r, ok := annotation.Verify(key, sig, cluster, ns, name, string(p.UID), value); !ok {
			return fmt.Errorf("pod %s/%s: the annotator's signature does not verify: %v", ns, name, r)
		}
		return nil
	})
	return value
}

// digEDNSOpt: dig with an EDNS option of its own in the query (+ednsopt)
// gets the stale mark as well.
func digEDNSOpt(t *testing.T, d *harness.CoreDNS, name string) {
	t.Helper()
	dig, err := exec.LookPath("dig")
	if err != nil {
		t.Logf("no dig installed: +ednsopt is not checked")
		return
	}
	// 65001: an option code of the local/experimental range, empty and
	// with data.
	for _, opt := range []string{"65001", "65001:beef"} {
		args := []string{"@127.0.0.1", "-p", strconv.Itoa(d.Port), "+tries=1", "+time=2", "+ednsopt=" + opt, name, "A"}
		out, err := exec.Command(dig, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("dig %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if !strings.Contains(string(out), "EDE: 3 (Stale Answer)") || !strings.Contains(string(out), "stale: "+peerID) {
			t.Errorf("dig %s: no stale mark naming %s:\n%s", strings.Join(args, " "), peerID, out)
		}
	}
}

// checkMcsctlStale runs `mcsctl snapshot -o json` on CoreDNS's snapshot
// (held by the running CoreDNS: read through a copy) and checks each
// service's edge-b cluster: stale, out of contact, with its policy.
func checkMcsctlStale(t *testing.T, snap, ns string) {
	t.Helper()
	cmd := exec.Command(mcsctlBinary(t), "snapshot", snap, "-o", "json", "--local", clusterID)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("mcsctl snapshot: %v\n%s", err, errb.String())
	}
	var got struct {
		Services []struct {
			Namespace, Name string
			Clusters        []struct {
				Cluster, State string
				Age            string
				Stale          struct{ Policy, Applies string }
			}
		}
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("mcsctl snapshot: %v\n%s", err, out.String())
	}
	want := map[string]string{"kept": "serve", "dropped": "drop-after=" + stalePolicyGrace.String(),
		"local": "drop-if-local-after=" + stalePolicyGrace.String(), "lonely": "drop-if-local-after=" + stalePolicyGrace.String()}
	seen := 0
	for _, s := range got.Services {
		if s.Namespace != ns {
			continue
		}
		for _, c := range s.Clusters {
			if c.Cluster != peerID {
				continue
			}
			seen++
			age, err := time.ParseDuration(c.Age)
			if c.State != "stale" || err != nil || age <= 0 || c.Stale.Policy != want[s.Name] {
				t.Errorf("mcsctl: %s/%s in %s: state %q, age %q, policy %q; want stale, an age, %q", ns, s.Name, c.Cluster, c.State, c.Age, c.Stale.Policy, want[s.Name])
			}
			t.Logf("mcsctl: %s in %s: %s, %s; %s", s.Name, c.Cluster, c.State, c.Age, c.Stale.Applies)
		}
	}
	if seen != len(want) {
		t.Errorf("mcsctl shows %d services of %s in %s, want %d:\n%s", seen, ns, peerID, len(want), out.String())
	}
}
