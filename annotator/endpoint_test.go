package annotator

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// readyPod is pod(name, app) Running with these addresses and readiness.
func readyPod(name string, ready bool, ips ...string) *corev1.Pod {
	p := pod(name, app)
	p.Spec.Hostname = name + "-host"
	p.Status.Phase = corev1.PodRunning
	setStatus(p, ready, ips...)
	return p
}

func setStatus(p *corev1.Pod, ready bool, ips ...string) {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.ContainersReady, Status: status},
		{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now(), Message: "probe"},
	}
	p.Status.PodIPs, p.Status.PodIP = nil, ""
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
}

// endpointKey is a signing key and the Config that states endpoints with it.
func endpointKey(t *testing.T) (ed25519.PublicKey, Config) {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return pub, Config{Cluster: "edge-a", SignKey: key, SignEndpoints: true, ServiceExportPoll: time.Hour}
}

const backendExport = `{"services":[{"name":"backend","namespace":"ns","cluster":"edge-a","type":"ClusterSetIP"}]}`

// stated checks that Pod name carries a statement that verifies with pub
// over its export annotation and says ips, ready and hostname name-host,
// with a seq above after; it returns the statement.
func (f *fixture) stated(name string, pub ed25519.PublicKey, ready bool, after uint64, ips ...string) (annotation.Endpoint, error) {
	p := f.pod(name)
	raw, sig := p.Annotations[annotation.EndpointAnnotation], p.Annotations[annotation.EndpointSignatureAnnotation]
	e, _, err := annotation.ParseEndpoint(raw)
	if err != nil {
		return e, fmt.Errorf("Pod %s: %v", name, err)
	}
	if r, ok := annotation.VerifyEndpoint(pub, sig, "edge-a", "ns", name, string(p.UID), p.Annotations[annotation.ExportAnnotation], raw); !ok {
		return e, fmt.Errorf("Pod %s: %s: %v", name, raw, r)
	}
	if e.Ready != ready || e.Hostname != name+"-host" || fmt.Sprint(e.IPs) != fmt.Sprint(ips) || e.Seq <= after {
		return e, fmt.Errorf("Pod %s: statement %s, want ready %v, addresses %v, hostname %s-host, seq above %d", name, raw, ready, ips, name, after)
	}
	return e, nil
}

// cached waits until the annotator's informer holds Pod name with the
// statement it carries in the API, so that a reconcile reads what was
// written.
func (f *fixture) cached(name string) {
	f.t.Helper()
	want := f.pod(name).Annotations[annotation.EndpointAnnotation]
	f.eventually("informer caught up", func() error {
		p, err := f.ctl.pods.Pods("ns").Get(name)
		if err != nil {
			return err
		}
		if got := p.Annotations[annotation.EndpointAnnotation]; got != want {
			return fmt.Errorf("cached statement %q, want %q", got, want)
		}
		return nil
	})
}

// With --sign-endpoints, an exported Pod gets a signed statement of its
// addresses, hostname and readiness; a settled Pod is not written again
// (nor by a new leader, which verifies what is there); a readiness flip, a
// new address and termination each get one new statement with a larger
// seq; a Pod no longer exported loses both annotations.
func TestControllerStatesEndpoints(t *testing.T) {
	pub, cfg := endpointKey(t)
	f := startWith(t, cfg, false, []runtime.Object{svc("backend", app), readyPod("p", true, "10.0.0.1", "fd00::1"), readyPod("idle", false)})
	var first annotation.Endpoint
	f.eventually("stated", func() (err error) {
		first, err = f.stated("p", pub, true, 0, "10.0.0.1", "fd00::1")
		return err
	})
	if now := uint64(time.Now().UnixMilli()); first.Seq > now || first.Seq < now-60_000 {
		t.Errorf("seq %d, want the time in ms (now %d)", first.Seq, now)
	}
	f.eventually("a Pod without addresses stated too", func() error {
		_, err := f.stated("idle", pub, false, 0)
		return err
	})
	if err := f.podHas("p", backendExport)(); err != nil {
		t.Error(err)
	}

	// Settled: a reconcile writes nothing (once a worker's reconcile that
	// read the Pods before the informer saw the writes has re-applied them).
	f.cached("p")
	f.cached("idle")
	f.eventually("settled", func() error {
		writes := testutil.ToFloat64(f.m.PodWrites.WithLabelValues("ok"))
		if err := f.ctl.Reconcile(context.Background(), "ns"); err != nil {
			return err
		}
		if got := testutil.ToFloat64(f.m.PodWrites.WithLabelValues("ok")); got != writes {
			return fmt.Errorf("a settled namespace's reconcile wrote %v Pods", got-writes)
		}
		return nil
	})
	f.eventually("two statements counted", func() error {
		if got := testutil.ToFloat64(f.m.EndpointStatements); got != 2 {
			return fmt.Errorf("endpoint_statements_total = %v, want 2", got)
		}
		return nil
	})

	// A new leader (no memory) over the same Pods writes nothing: the
	// statements verify with its key. One with another key states anew.
	settled := []runtime.Object{svc("backend", app), f.pod("p"), f.pod("idle")}
	for _, s := range settled[1:] {
		s.(*corev1.Pod).ResourceVersion = ""
	}
	g := startWith(t, cfg, false, settled)
	if err := g.ctl.Reconcile(context.Background(), "ns"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(g.m.PodWrites.WithLabelValues("ok")); got != 0 {
		t.Errorf("a new leader rewrote %v settled Pods", got)
	}
	_, other := endpointKey(t)
	h := startWith(t, other, false, settled)
	h.eventually("restated with another key", func() error {
		_, err := h.stated("p", other.SignKey.Public().(ed25519.PublicKey), true, first.Seq, "10.0.0.1", "fd00::1")
		return err
	})

	// The readiness flips: one new statement, a larger seq.
	p := f.pod("p")
	setStatus(p, false, "10.0.0.1", "fd00::1")
	if _, err := f.client.CoreV1().Pods("ns").UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var second annotation.Endpoint
	f.eventually("not ready stated", func() (err error) {
		second, err = f.stated("p", pub, false, first.Seq, "10.0.0.1", "fd00::1")
		return err
	})
	// A new address.
	p = f.pod("p")
	setStatus(p, false, "10.0.0.2")
	if _, err := f.client.CoreV1().Pods("ns").UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("new address stated", func() error {
		_, err := f.stated("p", pub, false, second.Seq, "10.0.0.2")
		return err
	})
	f.cached("p")
	// The writer counts a statement after its write returns, so the test
	// may see the annotation first: wait (bounded) for the count.
	f.eventually("one statement per change", func() error {
		if got := testutil.ToFloat64(f.m.EndpointStatements); got != 4 {
			return fmt.Errorf("endpoint_statements_total = %v, want 4 (one per change)", got)
		}
		return nil
	})

	// The flag dropped: the statements the annotator wrote go, the export
	// annotation and its signature stay.
	unflagged := cfg
	unflagged.SignEndpoints = false
	u := startWith(t, unflagged, false, []runtime.Object{svc("backend", app), f.pod("p")})
	u.eventually("statement removed", func() error {
		p := u.pod("p")
		if v, ok := p.Annotations[annotation.EndpointAnnotation]; ok {
			return fmt.Errorf("Pod p still carries %s", v)
		}
		if _, ok := p.Annotations[annotation.EndpointSignatureAnnotation]; ok {
			return fmt.Errorf("Pod p still carries its statement's signature")
		}
		if p.Annotations[annotation.SignatureAnnotation] == "" {
			return fmt.Errorf("Pod p lost its export signature")
		}
		return u.podHas("p", backendExport)()
	})

	// Nothing exports backend any more: the statement and its signature go
	// with the export annotation.
	if err := f.client.CoreV1().Services("ns").Delete(context.Background(), "backend", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("unexported", func() error {
		if err := f.podHas("p", "")(); err != nil {
			return err
		}
		for _, k := range []string{annotation.EndpointAnnotation, annotation.EndpointSignatureAnnotation, annotation.SignatureAnnotation} {
			if v, ok := f.pod("p").Annotations[k]; ok {
				return fmt.Errorf("Pod p still carries %s=%s", k, v)
			}
		}
		return nil
	})
}

// A statement's seq grows past the last one even when the clock is behind
// it (another replica's clock ahead); a statement the annotator did not
// sign is replaced and its seq ignored.
func TestEndpointSeqGrows(t *testing.T) {
	pub, cfg := endpointKey(t)
	ahead := uint64(time.Now().Add(time.Hour).UnixMilli())
	signed := func(name string, seq uint64, key ed25519.PrivateKey) *corev1.Pod {
		p := readyPod(name, true, "10.0.0.1")
		stmt := annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{"10.0.0.1"}, Hostname: name + "-host", Seq: seq}) // not ready
		p.Annotations = map[string]string{
			annotation.ExportAnnotation:            backendExport,
			annotation.EndpointAnnotation:          stmt,
			annotation.EndpointSignatureAnnotation: annotation.SignEndpoint(key, "edge-a", "ns", name, string(p.UID), backendExport, stmt),
		}
		return p
	}
	_, stranger, _ := ed25519.GenerateKey(nil)
	f := startWith(t, cfg, false, []runtime.Object{svc("backend", app), signed("ours", ahead, cfg.SignKey), signed("forged", 1<<63, stranger)})
	f.eventually("ours restated", func() error {
		e, err := f.stated("ours", pub, true, 0, "10.0.0.1")
		if err == nil && e.Seq != ahead+1 {
			return fmt.Errorf("seq %d, want %d (the last one + 1)", e.Seq, ahead+1)
		}
		return err
	})
	f.eventually("forged replaced", func() error {
		e, err := f.stated("forged", pub, true, 0, "10.0.0.1")
		if err == nil && e.Seq > ahead {
			return fmt.Errorf("seq %d: the forged statement's seq was taken", e.Seq)
		}
		return err
	})
}

// A Pod being deleted gets one last statement that says not ready, its
// export annotation kept; a Pod whose statement someone else wrote and no
// exported Service selects keeps it.
func TestEndpointTerminating(t *testing.T) {
	pub, cfg := endpointKey(t)
	hand := readyPod("hand", true, "10.0.0.9")
	hand.Labels = map[string]string{"app": "other"}
	hand.Annotations = map[string]string{annotation.EndpointAnnotation: `{"seq":1}`}
	f := startWith(t, cfg, false, []runtime.Object{svc("backend", app), readyPod("p", true, "10.0.0.1"), hand})
	var first annotation.Endpoint
	f.eventually("stated", func() (err error) {
		first, err = f.stated("p", pub, true, 0, "10.0.0.1")
		return err
	})
	p := f.pod("p")
	now := metav1.Now()
	p.DeletionTimestamp = &now
	if _, err := f.client.CoreV1().Pods("ns").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("not ready stated", func() error {
		_, err := f.stated("p", pub, false, first.Seq, "10.0.0.1")
		return err
	})
	if err := f.podHas("p", backendExport)(); err != nil {
		t.Error(err)
	}
	if got := f.pod("hand").Annotations[annotation.EndpointAnnotation]; got != `{"seq":1}` {
		t.Errorf("a hand-written statement was touched: %q", got)
	}
}

// slimPodEndpoint keeps what a statement says, and only the Ready
// condition's status of the conditions; a second pass keeps what it kept.
// Without --sign-endpoints, a readiness flip is no change at all.
func TestSlimPodEndpoint(t *testing.T) {
	p := readyPod("p", true, "10.0.0.1", "fd00::1")
	p.Spec.NodeName = "n"
	p.Annotations = map[string]string{annotation.EndpointAnnotation: `{"seq":1}`, annotation.EndpointSignatureAnnotation: "ed25519:x", "big": "y"}
	once, _ := slimPodEndpoint(p)
	s := once.(*corev1.Pod)
	if s.Spec.Hostname != "p-host" || s.Status.PodIP != "10.0.0.1" || len(s.Status.PodIPs) != 2 || s.Spec.NodeName != "" || s.Annotations["big"] != "" {
		t.Errorf("kept too much or too little: %+v", s)
	}
	if want := []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}; !reflect.DeepEqual(s.Status.Conditions, want) {
		t.Errorf("conditions %+v, want %+v", s.Status.Conditions, want)
	}
	if len(s.Annotations) != 2 {
		t.Errorf("annotations %v: want the statement and its signature", s.Annotations)
	}
	if twice, _ := slimPodEndpoint(once); !reflect.DeepEqual(once, twice) {
		t.Errorf("a second pass changed the slim Pod:\n%+v\n%+v", once, twice)
	}

	flipped := p.DeepCopy()
	flipped.ResourceVersion = "2"
	setStatus(flipped, false, "10.0.0.1", "fd00::1")
	a, _ := slimPodEndpoint(p)
	b, _ := slimPodEndpoint(flipped)
	if sameButVersion(a, b) {
		t.Error("--sign-endpoints: a readiness flip is no change")
	}
	a, _ = slimPod(p)
	b, _ = slimPod(flipped)
	if !sameButVersion(a, b) {
		t.Error("without --sign-endpoints: a readiness flip queues a reconcile")
	}
}
