package e2e

// Relay hubs end to end: edge-o's real annotator signs its Pods' exports and
// endpoint statements (--sign-endpoints); hub-1 and hub-2 each run the real
// MCS controller with --relay, reading edge-o as a peer; edge-e's real
// CoreDNS (verify on) reads only the two hubs, never edge-o. The origin's
// export answers at edge-e, changes at the origin arrive through the hubs,
// killing one hub's API server loses no answer, and a hostile hub (hub-2,
// its controller stopped and its API server then written by the test) that
// forges, alters, moves and replays records changes no answer: each is
// refused and counted. Last, CoreDNS restarts with both hubs unreachable
// and answers the origin's records from its snapshot; mcsctl names the path.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

const relayCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-e
        kubeconfig {KUBECONFIG}
        hub hub-1 {HUB1}
        hub hub-2 {HUB2}
        snapshot {SNAPSHOT}
        verify {KEYS}
        ttl 5
    }
    prometheus 127.0.0.1:{METRICS}
}
`

// relayPropagation bounds origin -> hub -> edge: the hub's watch of the
// origin, its controller's write, the edge's watch of the hub, the index.
const relayPropagation = 30 * time.Second

func TestRelayThroughTwoHubs(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	ns := "relay"
	// The origin: a headless Service exported, two ready Pods.
	rs := startRelaySet(t, ns, "hub-1", "hub-2")
	o, h1, h2, e, keysO, keysE := rs.o, rs.hubs[0], rs.hubs[1], rs.e, rs.keysO, rs.keysE
	rs.exportBackend(t, ns, 2)
	sel := map[string]string{"app": "backend"}

	// The hubs: each reads edge-o directly and relays it.
	hubCtl := map[string]*harness.Annotator{}
	for _, h := range []*harness.Cluster{h1, h2} {
		hubCtl[h.Name] = harness.StartAnnotator(t, h.Kubeconfig, "--cluster", h.Name, "--leader-elect=false",
			"-mcs-controller", "--relay", "-peer", "edge-o="+o.Kubeconfig)
	}

	// The edge reads the hubs only, hub-1 through a link the test can cut.
	link1, link2 := harness.StartProxy(t, h1.APIServerAddr()), harness.StartProxy(t, h2.APIServerAddr())
	metrics := harness.FreePort(t)
	snap := snapshotPath(t)
	d := harness.StartCoreDNS(t, relayCorefile, map[string]string{
		"KUBECONFIG": e.Kubeconfig,
		"HUB1":       h1.KubeconfigVia(t, link1),
		"HUB2":       h2.KubeconfigVia(t, link2),
		"SNAPSHOT":   snap,
		"KEYS":       keysE.Dir,
		"METRICS":    strconv.Itoa(metrics),
	})
	t.Cleanup(func() {
		if !d.Running() {
			_, err := d.Process().Exited()
			t.Errorf("CoreDNS exited during the test (%v)", err)
		}
	})
	name := svc("backend", ns)
	q := harness.Query{Name: name, Type: dns.TypeA, Timeout: peerQueryTimeout}
	took := waitPeers(t, d, relayPropagation, q, hasAddrs("10.7.0.1", "10.7.0.2"))
	t.Logf("edge-o's export answered at edge-e through the hubs after %s", took.Round(time.Millisecond))
	// The endpoint name carries the origin, not a hub.
	waitPeers(t, d, propagation, harness.Query{Name: dashed("10.7.0.1") + ".edge-o." + name, Type: dns.TypeA, Timeout: peerQueryTimeout}, hasAddrs("10.7.0.1"))
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_origin_via{cluster="edge-o",hub="hub-1"}`, func(v float64) bool { return v == 1 })
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_origin_via{cluster="edge-o",hub="hub-2"}`, func(v float64) bool { return v == 1 })

	// A change at the origin: backend-1 not ready, backend-3 new.
	o.SetPodReady(t, ns, "backend-1", false, "10.7.0.1")
	plainPod(t, o, ns, "backend-3", "10.7.0.3", sel)
	notReady := waitSignedStatement(t, o, ns, "backend-1", keysO, func(e annotation.Endpoint) bool { return !e.Ready })
	took = waitPeers(t, d, relayPropagation, q, hasAddrs("10.7.0.2", "10.7.0.3"))
	t.Logf("a readiness flip and a new Pod at edge-o answered at edge-e after %s", took.Round(time.Millisecond))

	// hub-1's API server dies: every answer stays whole meanwhile, and a
	// change at the origin still arrives through hub-2.
	stop := watchAnswers(t, d, q, []string{"10.7.0.2", "10.7.0.3"})
	h1.KillAPIServer(t, 9)
	time.Sleep(3 * time.Second)
	if n, bad := stop(); len(bad) > 0 {
		t.Fatalf("with hub-1 killed, %d of %d answers were not the origin's endpoints: first %s", len(bad), n, bad[0])
	} else {
		t.Logf("hub-1 killed: %d answers, all whole", n)
	}
	o.SetPodReady(t, ns, "backend-1", true, "10.7.0.1")
	waitPeers(t, d, relayPropagation, q, hasAddrs("10.7.0.1", "10.7.0.2", "10.7.0.3"))
	// The next steps cut hub-2 too. Until the edge has seen hub-1 go (its
	// proxy still accepts connections, so that takes its contact check's
	// timeouts), hub-1 counts as current and its last view decides which
	// Pods exist: a second failure inside that window can lose what hub-1
	// had not relayed yet (plugin README, Bugs).
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_hub_state{hub="hub-1",state="disconnected"}`, func(v float64) bool { return v == 1 })

	// hub-2 turns hostile: its controller stops, and whoever holds its API
	// server writes slices of their own.
	hubCtl["hub-2"].Stop(t)
	now := waitSignedStatement(t, o, ns, "backend-1", keysO, func(e annotation.Endpoint) bool { return e.Ready })
	forge := newSigningKeyPair(t, "edge-o") // the right name, the wrong key
	evil := annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{"10.66.0.66"}, Ready: true, Seq: uint64(time.Now().UnixMilli())})
	altered := annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{"10.66.0.1"}, Ready: true, Seq: now.endpoint.Seq})
	hostile := []struct {
		slice, namespace, why string
		pod                   relay.Pod
		export                string
	}{
		{"forged", ns, "signed with another key", relay.Pod{Name: "evil", UID: "u-evil", Endpoint: evil,
			Signature: annotation.SignEndpoint(forge.Private, "edge-o", ns, "evil", "u-evil", now.export, evil)}, now.export},
		{"altered", ns, "the address changed under the origin's signature", relay.Pod{Name: "backend-1", UID: now.uid, Endpoint: altered, Signature: now.sig}, now.export},
		{"moved", "other", "the origin's signed record in another namespace", relay.Pod{Name: "backend-1", UID: now.uid, Endpoint: now.raw, Signature: now.sig}, now.export},
		{"replayed", ns, "the origin's older statement, backend-1 not ready", relay.Pod{Name: "backend-1", UID: notReady.uid, Endpoint: notReady.raw, Signature: notReady.sig}, notReady.export},
	}
	h2.CreateNamespace(t, "other")
	for _, hs := range hostile {
		writeRelaySlice(t, h2, hs.namespace, "backend-"+hs.slice, "edge-o", relay.Slice{Exports: []string{hs.export}, Pods: []relay.Pod{hs.pod}})
	}
	// None of it answers, and each is refused and counted.
	stop = watchAnswers(t, d, q, []string{"10.7.0.1", "10.7.0.2", "10.7.0.3"})
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_relay_refused_total{hub="hub-2",reason="bad_signature"}`, func(v float64) bool { return v == 3 })
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_relay_refused_total{hub="hub-2",reason="replayed"}`, func(v float64) bool { return v == 1 })
	time.Sleep(2 * time.Second)
	if n, bad := stop(); len(bad) > 0 {
		t.Fatalf("with hub-2 hostile, %d of %d answers were not the origin's endpoints: first %s", len(bad), n, bad[0])
	}
	waitPeers(t, d, propagation, harness.Query{Name: svc("backend", "other"), Type: dns.TypeA, Timeout: peerQueryTimeout}, isNXDOMAIN)
	t.Logf("CoreDNS on the hostile hub: %s", strings.Join(grepLog(d, "relayed record refused"), "\n"))

	// Both hubs unreachable, CoreDNS restarts: the origin's records come
	// from the snapshot, and the snapshot names the path.
	link2.Cut(t)
	stop = watchAnswers(t, d, q, []string{"10.7.0.1", "10.7.0.2", "10.7.0.3"})
	time.Sleep(3 * time.Second)
	if n, bad := stop(); len(bad) > 0 {
		t.Fatalf("with both hubs unreachable, %d of %d answers were not the origin's endpoints: first %s\nCoreDNS:\n%s", len(bad), n, bad[0], strings.Join(grepLog(d, "plugin/mcsannotations"), "\n"))
	}
	d.Restart(t)
	waitPeers(t, d, initialSync, q, hasAddrs("10.7.0.1", "10.7.0.2", "10.7.0.3"))
	checkMcsctlVia(t, snap, "edge-o", "via hub-1,hub-2")
}

// relaySet is a relay test's clusters: the origin edge-o, the hubs and
// the edge edge-e, which trusts edge-o's key.
type relaySet struct {
	o, e         *harness.Cluster
	hubs         []*harness.Cluster
	keysO, keysE signingKeyPair
}

// startRelaySet starts edge-o, the hubs named and edge-e, with namespace
// ns in the origin and the hubs, and the MCS CRDs in the hubs.
func startRelaySet(t *testing.T, ns string, hubs ...string) relaySet {
	t.Helper()
	cs := harness.StartClusters(t, append(append([]string{"edge-o"}, hubs...), "edge-e")...)
	s := relaySet{o: cs[0], hubs: cs[1 : len(cs)-1], e: cs[len(cs)-1]}
	for _, h := range s.hubs {
		h.InstallMCSCRDs(t)
		h.CreateNamespace(t, ns)
	}
	s.o.CreateNamespace(t, ns)
	s.keysO, s.keysE = newSigningKeyPair(t, "edge-o"), newSigningKeyPair(t, "edge-e")
	trustKey(t, s.keysO, "edge-o", s.keysE) // and edge-e's own, for its local Pods
	return s
}

// exportBackend exports the origin's headless Service backend of ns with
// ready Pods backend-1..n at 10.7.0.1..n, and starts the origin's annotator
// signing endpoint statements (with args more). It returns each Pod's
// ready statement, in order, once all are written.
func (s relaySet) exportBackend(t *testing.T, ns string, n int, args ...string) []statement {
	t.Helper()
	sel := map[string]string{"app": "backend"}
	obj := harness.ServiceObject(ns, "backend", sel, corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP})
	obj.Spec.ClusterIP = corev1.ClusterIPNone
	obj.Annotations = map[string]string{annotation.ExportServiceAnnotation: "true"}
	s.o.CreateService(t, obj)
	for i := 1; i <= n; i++ {
		plainPod(t, s.o, ns, fmt.Sprintf("backend-%d", i), fmt.Sprintf("10.7.0.%d", i), sel)
	}
	harness.StartAnnotator(t, s.o.Kubeconfig, append([]string{"--cluster", "edge-o", "--sign-key", s.keysO.PrivatePath, "--sign-endpoints", "--leader-elect=false"}, args...)...)
	var out []statement
	for i := 1; i <= n; i++ {
		out = append(out, waitSignedStatement(t, s.o, ns, fmt.Sprintf("backend-%d", i), s.keysO, func(e annotation.Endpoint) bool { return e.Ready }))
	}
	return out
}

// trustKey copies cluster's public key from its pair's folder into the
// verify folder of to.
func trustKey(t *testing.T, from signingKeyPair, cluster string, to signingKeyPair) {
	t.Helper()
	pub, err := os.ReadFile(filepath.Join(from.Dir, cluster+annotation.KeySuffix))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(to.Dir, cluster+annotation.KeySuffix), pub, 0o644); err != nil {
		t.Fatal(err)
	}
}

// statement is an origin Pod's signed bytes as the annotator wrote them.
type statement struct {
	uid, export, raw, sig string
	endpoint              annotation.Endpoint
}

// waitSignedStatement waits until the origin's annotator has written an endpoint
// statement on ns/name that verifies with keys and that ok accepts.
func waitSignedStatement(t *testing.T, c *harness.Cluster, ns, name string, keys signingKeyPair, ok func(annotation.Endpoint) bool) statement {
	t.Helper()
	var s statement
	harness.Eventually(t, signingPropagation, func() error {
		cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := c.Client.CoreV1().Pods(ns).Get(cx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s = statement{uid: string(p.UID), export: p.Annotations[annotation.ExportAnnotation],
			raw: p.Annotations[annotation.EndpointAnnotation], sig: p.Annotations[annotation.EndpointSignatureAnnotation]}
		if r, ok := annotation.VerifyEndpoint(keys.Public, s.sig, c.Name, ns, name, s.uid, s.export, s.raw); !ok {
			return fmt.Errorf("pod %s/%s: statement %q: %v", ns, name, s.raw, r)
		}
		if s.endpoint, _, err = annotation.ParseEndpoint(s.raw); err != nil {
			return err
		}
		if !ok(s.endpoint) {
			return fmt.Errorf("pod %s/%s: statement %q not yet as wanted", ns, name, s.raw)
		}
		return nil
	})
	return s
}

// writeRelaySlice writes, as a hostile hub's owner could, an EndpointSlice
// that looks like one of the hub's controller's, carrying sl.
func writeRelaySlice(t *testing.T, c *harness.Cluster, ns, name, origin string, sl relay.Slice) {
	t.Helper()
	obj := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{
				discoveryv1.LabelManagedBy:    clusterset.ManagedBy,
				mcsv1beta1.LabelServiceName:   "backend",
				mcsv1beta1.LabelSourceCluster: origin,
			},
			Annotations: map[string]string{relay.SliceAnnotation: relay.Format(sl)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.66.0.66"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Client.DiscoveryV1().EndpointSlices(ns).Create(cx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("%s: slice %s/%s: %v", c.Name, ns, name, err)
	}
}

// watchAnswers queries q every 100 ms until the returned stop is called,
// which returns how many answers came and those that were not exactly want.
func watchAnswers(t *testing.T, d *harness.CoreDNS, q harness.Query, want []string) func() (int, []string) {
	t.Helper()
	done := make(chan struct{})
	type result struct {
		n   int
		bad []string
	}
	out := make(chan result, 1)
	go func() {
		var r result
		defer func() { out <- r }()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			m, err := d.Exchange(q)
			r.n++
			if err != nil {
				r.bad = append(r.bad, err.Error())
				continue
			}
			got := harness.Addrs(m)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				r.bad = append(r.bad, fmt.Sprintf("%s %v", harness.Rcode(m), got))
			}
		}
	}()
	stopped := false
	return func() (int, []string) {
		if !stopped {
			stopped = true
			close(done)
		}
		r := <-out
		return r.n, r.bad
	}
}

// eventuallyRelayMetric waits until the series (name and labels exactly as
// exposed) has a value ok accepts.
func eventuallyRelayMetric(t *testing.T, port int, series string, ok func(float64) bool) {
	t.Helper()
	harness.Eventually(t, relayPropagation, func() error {
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if v, found := strings.CutPrefix(sc.Text(), series+" "); found {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return err
				}
				if !ok(f) {
					return fmt.Errorf("%s = %v", series, f)
				}
				return nil
			}
		}
		return fmt.Errorf("%s: no such series", series)
	})
}

// grepLog returns CoreDNS's log lines holding s.
func grepLog(d *harness.CoreDNS, s string) []string { return grepLines(d.Log(), s) }

// checkMcsctlVia runs mcsctl snapshot -o json on snap and checks cluster's
// path.
func checkMcsctlVia(t *testing.T, snap, cluster, want string) {
	t.Helper()
	cmd := exec.Command(mcsctlBinary(t), "snapshot", snap, "-o", "json")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("mcsctl snapshot: %v\n%s", err, errb.String())
	}
	out := string(b)
	var s struct {
		Sources []struct {
			Cluster string   `json:"cluster"`
			Via     []string `json:"via"`
		} `json:"sources"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("mcsctl snapshot: %v\n%s", err, out)
	}
	for _, src := range s.Sources {
		if src.Cluster == cluster {
			if got := "via " + strings.Join(src.Via, ","); got != want {
				t.Errorf("mcsctl snapshot: %s %s, want %s", cluster, got, want)
			}
			return
		}
	}
	t.Errorf("mcsctl snapshot: no source %s:\n%s", cluster, out)
}
