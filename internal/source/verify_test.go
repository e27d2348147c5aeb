package source

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"slices"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/podproto"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

func genKey(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// signPod signs p's export annotation as cluster's annotator would.
func signPod(p *v1.Pod, key ed25519.PrivateKey, cluster string) *v1.Pod {
	p.Annotations[annotation.SignatureAnnotation] = annotation.Sign(key, cluster, p.Namespace, p.Name, string(p.UID), p.Annotations[annotation.ExportAnnotation])
	return p
}

// A source with a key exports only the Pods whose signature verifies with
// it, over this cluster, the Pod's namespace, name and UID and the
// annotation; the others export nothing and are reported once, with the
// reason. Without a key nothing is verified.
func TestSourceVerifiesSignatures(t *testing.T) {
	pubA, privA := genKey(t)
	_, privB := genKey(t)
	signed := signPod(newPod("signed", "10.0.0.1", backend, true), privA, "edge-a")
	pods := []struct {
		pod    *v1.Pod
		reason annotation.Reason // with verification; "" exports
	}{
		{signed, ""},
		{signPod(newPod("signed-2", "10.0.0.2", backend, true), privA, "edge-a"), ""},
		{newPod("unsigned", "10.0.0.3", backend, true), annotation.ReasonUnsigned},
		// The signature of another Pod (another name and UID), copied.
		{func() *v1.Pod {
			p := newPod("copied", "10.0.0.4", backend, true)
			p.Annotations[annotation.SignatureAnnotation] = signed.Annotations[annotation.SignatureAnnotation]
			return p
		}(), annotation.ReasonBadSignature},
		// Signed by another cluster's annotator, with its key and its ID.
		{signPod(newPod("edge-b-signed", "10.0.0.5", backend, true), privB, "edge-b"), annotation.ReasonBadSignature},
		// Another cluster's key, naming this cluster.
		{signPod(newPod("edge-b-key", "10.0.0.6", backend, true), privB, "edge-a"), annotation.ReasonBadSignature},
		// Signed for edge-b by edge-a's key: the cluster is part of the message.
		{signPod(newPod("for-edge-b", "10.0.0.7", backend, true), privA, "edge-b"), annotation.ReasonBadSignature},
		// The annotation changed after signing.
		{func() *v1.Pod {
			p := signPod(newPod("changed", "10.0.0.8", backend, true), privA, "edge-a")
			p.Annotations[annotation.ExportAnnotation] = `{"services":[{"name":"backend"},{"name":"admin"}]}`
			return p
		}(), annotation.ReasonBadSignature},
		{func() *v1.Pod {
			p := newPod("garbage", "10.0.0.9", backend, true)
			p.Annotations[annotation.SignatureAnnotation] = "ed25519:not-base64!"
			return p
		}(), annotation.ReasonBadSignature},
	}
	for _, tc := range []struct {
		name string
		key  ed25519.PublicKey
	}{{"verify", pubA}, {"no verify", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			var objs []runtime.Object
			var want []string
			for _, p := range pods {
				objs = append(objs, p.pod.DeepCopy())
				if tc.key == nil || p.reason == "" {
					want = append(want, p.pod.Status.PodIP)
				}
			}
			slices.Sort(want)
			rec := &recorder{rejected: map[string][]annotation.Reason{}}
			tb := newTable()
			s := New("edge-a", fake.NewClientset(objs...), tb.Store, rec.events(), Options{Key: tc.key})
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			defer s.Stop()
			eventually(t, "first sync", s.HasSynced)
			if got := answer(tb, "backend.default.svc."); !slices.Equal(got, want) {
				t.Errorf("backend: %v, want %v", got, want)
			}
			if got := answer(tb, "admin.default.svc."); got != nil && tc.key != nil {
				t.Errorf("admin, from an annotation changed after signing: %v", got)
			}
			for _, p := range pods {
				var wantRej []annotation.Reason
				if tc.key != nil && p.reason != "" {
					wantRej = []annotation.Reason{p.reason}
				}
				if got := rec.get(p.pod.Name); !slices.Equal(got, wantRej) {
					t.Errorf("rejections of %s: %v, want %v", p.pod.Name, got, wantRej)
				}
			}
			if n := tb.Len()["edge-a"]; n != len(pods) {
				t.Errorf("edge-a records: %d, want %d (refused Pods keep a record with no export)", n, len(pods))
			}
		})
	}
}

// A change of the signature alone (the annotation unchanged) is reported
// once, and a Pod whose signature comes to verify joins its service.
func TestSourceSignatureChanges(t *testing.T) {
	ctx := context.Background()
	pub, priv := genKey(t)
	_, other := genKey(t)
	client := fake.NewClientset(newPod("a", "10.0.0.1", backend, true))
	rec := &recorder{rejected: map[string][]annotation.Reason{}}
	tb := newTable()
	s := New("edge-a", client, tb.Store, rec.events(), Options{Key: pub})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	eventually(t, "first sync", s.HasSynced)
	pods := client.CoreV1().Pods("default")
	update := func(rv string, change func(*v1.Pod)) {
		t.Helper()
		p := newPod("a", "10.0.0.1", backend, true)
		p.ResourceVersion = rv
		change(p)
		if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		change func(*v1.Pod)
		want   []string
		rej    []annotation.Reason // every rejection of a so far
	}{
		{func(*v1.Pod) {}, nil, []annotation.Reason{annotation.ReasonUnsigned}},
		// Unsigned again, only the IP changed: not reported again.
		{func(p *v1.Pod) { p.Status.PodIP, p.Status.PodIPs = "10.0.0.2", []v1.PodIP{{IP: "10.0.0.2"}} }, nil,
			[]annotation.Reason{annotation.ReasonUnsigned}},
		{func(p *v1.Pod) { signPod(p, priv, "edge-a") }, []string{"10.0.0.1"}, []annotation.Reason{annotation.ReasonUnsigned}},
		// Same annotation, another key's signature: reported.
		{func(p *v1.Pod) { signPod(p, other, "edge-a") }, nil,
			[]annotation.Reason{annotation.ReasonUnsigned, annotation.ReasonBadSignature}},
		{func(p *v1.Pod) { signPod(p, priv, "edge-a") }, []string{"10.0.0.1"},
			[]annotation.Reason{annotation.ReasonUnsigned, annotation.ReasonBadSignature}},
	}
	for i, st := range steps {
		if i > 0 {
			update(strconv.Itoa(i+1), st.change)
		}
		eventually(t, "step "+strconv.Itoa(i), func() bool {
			return slices.Equal(answer(tb, "backend.default.svc."), st.want) && slices.Equal(rec.get("a"), st.rej)
		})
	}
}

// The signature reaches the transform through the plugin's decoder
// (podproto.Plugin keeps its annotation), and verified Pods with one
// annotation still share one parse.
func TestToSlimVerifies(t *testing.T) {
	pub, priv := genKey(t)
	f := toSlim("edge-a", pub)
	var commons []*store.Common
	for _, name := range []string{"a", "b"} {
		whole := signPod(newPod(name, "10.0.0.1", backend, true), priv, "edge-a")
		trimmed, err := podproto.Trim(whole, podproto.Plugin)
		if err != nil {
			t.Fatal(err)
		}
		s := mustSlim(t, f, trimmed)
		if len(s.rec.Exports) != 1 || s.rejected != nil {
			t.Fatalf("%s: exports %+v, rejected %v", name, s.rec.Exports, s.rejected)
		}
		commons = append(commons, s.rec.Common)
	}
	if commons[0] != commons[1] {
		t.Error("verified Pods with one annotation do not share their parse")
	}
	// Refused Pods export nothing, whatever their annotation parses to.
	s := mustSlim(t, f, newPod("c", "10.0.0.3", backend, true))
	if len(s.rec.Exports) != 0 || s.rec.Cluster != "edge-a" || s.rec.Namespace != "default" ||
		len(s.rejected) != 1 || s.rejected[0].Reason != annotation.ReasonUnsigned || s.rejected[0].Index != -1 {
		t.Fatalf("unsigned: %+v, rejected %v", s.rec, s.rejected)
	}
	// A Pod with no export annotation has nothing to verify (as without a key).
	p := newPod("d", "10.0.0.4", backend, true)
	delete(p.Annotations, annotation.ExportAnnotation)
	if got, want := mustSlim(t, f, p).rejected, mustSlim(t, toSlim("edge-a", nil), p).rejected; !slices.Equal(got, want) {
		t.Errorf("no annotation: rejected %v, want %v as without verification", got, want)
	}
	// The hash that reports changes once covers the signature.
	u := newPod("e", "10.0.0.5", backend, true)
	h1 := mustSlim(t, f, u).annoHash
	h2 := mustSlim(t, f, signPod(u, priv, "edge-a")).annoHash
	if h1 == h2 {
		t.Error("a signature change leaves the annotation hash unchanged")
	}
}
