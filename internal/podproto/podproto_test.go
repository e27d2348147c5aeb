package podproto

import (
	"bytes"
	"errors"
	"math/rand"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	"k8s.io/apimachinery/pkg/api/resource"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
)

var keep = Keep{Labels: []string{"l"}, Annotations: []string{"a", "b"}}

// standard is client-go's own decoder for typed clients, in protobuf.
func standard(t testing.TB) runtime.Decoder { return standardFor(t, runtime.ContentTypeProtobuf) }

func standardFor(t testing.TB, mediaType string) runtime.Decoder {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), mediaType)
	if !ok {
		t.Fatalf("no %s serializer", mediaType)
	}
	return scheme.Codecs.WithoutConversion().DecoderToVersion(info.Serializer, v1.SchemeGroupVersion)
}

func encode(t testing.TB, obj runtime.Object) []byte {
	t.Helper()
	var buf bytes.Buffer
	s := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	if err := scheme.Codecs.EncoderForVersion(s, v1.SchemeGroupVersion).Encode(obj, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// project is what the Decoder promises to keep of pod.
func project(pod *v1.Pod) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
		DeletionTimestamp: pod.DeletionTimestamp,
	}}
	pick := func(m map[string]string, keys ...string) map[string]string {
		var out map[string]string
		for _, k := range keys {
			if v, ok := m[k]; ok {
				if out == nil {
					out = map[string]string{}
				}
				out[k] = v
			}
		}
		return out
	}
	p.Labels = pick(pod.Labels, keep.Labels...)
	p.Annotations = pick(pod.Annotations, append(keep.Annotations, metav1.InitialEventsAnnotationKey)...)
	p.Spec.Hostname, p.Spec.HostNetwork = pod.Spec.Hostname, pod.Spec.HostNetwork
	p.Status.Phase, p.Status.PodIP, p.Status.PodIPs = pod.Status.Phase, pod.Status.PodIP, pod.Status.PodIPs
	for _, c := range pod.Status.Conditions {
		p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: c.Type, Status: c.Status})
	}
	return p
}

// realistic is a Pod as the API server returns one made by a Deployment and
// run by a kubelet.
func realistic() *v1.Pod {
	now := metav1.Unix(1790000000, 0)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web-7d4b9c-x2x9q", GenerateName: "web-7d4b9c-", Namespace: "shop", UID: "6f1c0f5e-1b7e-4c57-9a86-3f0f4d7f1a11",
			ResourceVersion: "123456", CreationTimestamp: now,
			Labels:          map[string]string{"app": "web", "l": "true", "pod-template-hash": "7d4b9c"},
			Annotations:     map[string]string{"a": `[{"name":"web"}]`, "kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d4b9c", UID: "u"}},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(strings.Repeat(`{"f:metadata":{}}`, 40))}},
				{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(strings.Repeat(`{"f:status":{}}`, 40))}, Subresource: "status"},
			},
		},
		Spec: v1.PodSpec{
			Hostname: "web-0",
			Containers: []v1.Container{{
				Name: "web", Image: "registry.example/web:1.2.3", Ports: []v1.ContainerPort{{ContainerPort: 8080, Protocol: v1.ProtocolTCP}},
				Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}},
			}},
			Tolerations: []v1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute}},
		},
		Status: v1.PodStatus{
			Phase: v1.PodRunning,
			Conditions: []v1.PodCondition{
				{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: now},
				{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: now},
			},
			PodIP: "10.1.2.3", PodIPs: []v1.PodIP{{IP: "10.1.2.3"}, {IP: "fd00::3"}},
			ContainerStatuses: []v1.ContainerStatus{{Name: "web", Ready: true, Image: "registry.example/web:1.2.3", ImageID: "sha256:abc"}},
		},
	}
}

func TestDecodeRealistic(t *testing.T) {
	pod := realistic()
	gone := metav1.Unix(1790000100, 5000)
	pod.DeletionTimestamp = &gone
	data := encode(t, pod)
	std, _, err := standard(t).Decode(data, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &Decoder{Keep: keep, Fallback: standard(t)}
	obj, gvk, err := d.Decode(data, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := v1.SchemeGroupVersion.WithKind("Pod"); *gvk != want {
		t.Errorf("gvk %v, want %v", gvk, want)
	}
	got := obj.(*v1.Pod)
	want := project(std.(*v1.Pod)) // protobuf keeps whole seconds
	if got.DeletionTimestamp == nil || !got.DeletionTimestamp.Equal(want.DeletionTimestamp) {
		t.Errorf("deletionTimestamp %v, want %v", got.DeletionTimestamp, want.DeletionTimestamp)
	}
	got.DeletionTimestamp, want.DeletionTimestamp = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%+v\nwant\n%+v", got, want)
	}
	if got.Labels["app"] != "" || got.Annotations["kubectl.kubernetes.io/restartedAt"] != "" || got.ManagedFields != nil || got.Spec.Containers != nil {
		t.Error("kept a field it should drop")
	}
}

// TestDecodeLikeClientGo compares the Decoder with client-go's decoder, cut
// down to the kept fields, on random Pods and PodLists.
func TestDecodeLikeClientGo(t *testing.T) {
	f := fuzzer.FuzzerFor(metafuzzer.Funcs, rand.NewSource(1), scheme.Codecs).NilChance(0.3).NumElements(0, 3)
	std := standard(t)
	d := &Decoder{Keep: keep, Fallback: std}
	for i := 0; i < 300; i++ {
		var pod v1.Pod
		f.Fill(&pod)
		// Some kept keys, so the filter has something to keep.
		if i%2 == 0 {
			if pod.Labels == nil {
				pod.Labels = map[string]string{}
			}
			if pod.Annotations == nil {
				pod.Annotations = map[string]string{}
			}
			pod.Labels["l"], pod.Annotations["a"], pod.Annotations[metav1.InitialEventsAnnotationKey] = "true", "x", "true"
		}
		data := encode(t, &pod)
		want, _, err := std.Decode(data, nil, nil)
		if err != nil {
			t.Fatalf("pod %d: client-go: %v", i, err)
		}
		got, _, err := d.Decode(data, nil, nil)
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		comparePods(t, i, got.(*v1.Pod), project(want.(*v1.Pod)))
	}
	for i := 0; i < 20; i++ {
		var list v1.PodList
		f.Fill(&list)
		data := encode(t, &list)
		want := &v1.PodList{}
		if err := runtime.DecodeInto(std, data, want); err != nil {
			t.Fatal(err)
		}
		got := &v1.PodList{Items: []v1.Pod{{}}} // Decode resets into
		if err := runtime.DecodeInto(d, data, got); err != nil {
			t.Fatal(err)
		}
		if got.ResourceVersion != want.ResourceVersion || got.Continue != want.Continue ||
			!reflect.DeepEqual(got.RemainingItemCount, want.RemainingItemCount) || len(got.Items) != len(want.Items) {
			t.Fatalf("list %d: got %+v, want %+v", i, got.ListMeta, want.ListMeta)
		}
		for j := range got.Items {
			comparePods(t, i, &got.Items[j], project(&want.Items[j]))
		}
	}
}

func comparePods(t *testing.T, i int, got, want *v1.Pod) {
	t.Helper()
	if (got.DeletionTimestamp == nil) != (want.DeletionTimestamp == nil) ||
		got.DeletionTimestamp != nil && !got.DeletionTimestamp.Equal(want.DeletionTimestamp) {
		t.Fatalf("%d: deletionTimestamp %v, want %v", i, got.DeletionTimestamp, want.DeletionTimestamp)
	}
	g, w := *got, *want
	g.DeletionTimestamp, w.DeletionTimestamp = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("%d: got\n%+v\nwant\n%+v", i, g, w)
	}
}

func TestDecodeInto(t *testing.T) {
	d := &Decoder{Keep: keep, Fallback: standard(t)}
	into := &v1.Pod{Spec: v1.PodSpec{NodeName: "stale"}}
	obj, _, err := d.Decode(encode(t, realistic()), nil, into)
	if err != nil {
		t.Fatal(err)
	}
	if obj != into || into.Name != "web-7d4b9c-x2x9q" || into.Spec.NodeName != "" {
		t.Errorf("into not reset and filled: %+v", into)
	}
}

// TestFallback: what is not a protobuf Pod goes to client-go's decoder.
func TestFallback(t *testing.T) {
	d := &Decoder{Keep: keep, Fallback: standard(t)}
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Annotations: map[string]string{"other": "kept"}}}
	obj, _, err := d.Decode(encode(t, cm), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := obj.(*v1.ConfigMap); got.Annotations["other"] != "kept" {
		t.Errorf("ConfigMap decoded as %+v", got)
	}
	d.Fallback = standardFor(t, runtime.ContentTypeJSON)
	obj, _, err = d.Decode([]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"j","annotations":{"other":"kept"}}}`), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := obj.(*v1.Pod); got.Annotations["other"] != "kept" {
		t.Errorf("JSON Pod decoded as %+v", got)
	}
	// A Pod decoded into something else is client-go's to refuse.
	d.Fallback = standard(t)
	if err := runtime.DecodeInto(d, encode(t, realistic()), &v1.ConfigMap{}); err == nil {
		t.Error("a Pod decoded into a ConfigMap")
	}
}

// TestMalformed: cuts of a Pod and a few corruptions give an error where
// client-go's decoder gives one, and never a panic.
func TestMalformed(t *testing.T) {
	d := &Decoder{Keep: keep, Fallback: standard(t)}
	data := encode(t, realistic())
	env, err := decodeEnvelope(data[len(prefix):])
	if err != nil {
		t.Fatal(err)
	}
	// Every cut, decoded by both: where client-go fails, so does this
	// decoder (within the Pod's bytes the lengths run past the end); where
	// client-go decodes (a cut between the envelope's fields), this gives
	// the same Pod, cut down.
	std := standard(t)
	for n := len(prefix); n < len(data); n++ {
		obj, _, err := d.Decode(data[:n], nil, nil)
		want, _, stdErr := std.Decode(data[:n], nil, nil)
		if (err == nil) != (stdErr == nil) {
			t.Fatalf("cut at %d of %d: error %v, client-go's %v", n, len(data), err, stdErr)
		}
		if err == nil {
			comparePods(t, n, obj.(*v1.Pod), project(want.(*v1.Pod)))
		}
	}
	// A kept field with the wrong wire type: the Pod's metadata (field 1,
	// length-delimited) as a varint (tag 0x08, value 1).
	_, _, err = d.Decode(rebuild(t, env, []byte{0x08, 0x01}), nil, nil)
	if !errors.Is(err, errWireType) {
		t.Errorf("wrong wire type: err %v", err)
	}
	// A length that runs past the end.
	_, _, err = d.Decode(rebuild(t, env, []byte{0x0a, 0x7f, 0x01}), nil, nil)
	if err == nil {
		t.Error("a field longer than the message decoded")
	}
}

// rebuild encodes env with raw as its content.
func rebuild(t *testing.T, env envelope, raw []byte) []byte {
	t.Helper()
	u := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: env.apiVersion, Kind: env.kind}, Raw: raw}
	b, err := u.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return append(append([]byte(nil), prefix...), b...)
}

func FuzzDecode(f *testing.F) {
	f.Add(encode(f, realistic()))
	f.Add(encode(f, &v1.PodList{Items: []v1.Pod{*realistic(), *realistic()}}))
	std := standard(f)
	d := &Decoder{Keep: keep, Fallback: std}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, _, err := d.Decode(data, nil, nil)
		want, _, stdErr := std.Decode(data, nil, nil)
		pod, ok := want.(*v1.Pod)
		if stdErr != nil || !ok {
			return // client-go refuses it or it is no Pod; ours may differ on bytes it skips
		}
		if err != nil {
			// Ours reads less, so it may accept what client-go refuses,
			// never the other way round.
			t.Fatalf("client-go decodes it, ours fails: %v", err)
		}
		comparePods(t, 0, got.(*v1.Pod), project(pod))
	})
}

func BenchmarkDecode(b *testing.B) {
	data := encode(b, realistic())
	b.Logf("%d bytes", len(data))
	for _, c := range []struct {
		name string
		d    runtime.Decoder
	}{
		{"client-go", standard(b)},
		{"podproto", &Decoder{Keep: keep, Fallback: standard(b)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := c.d.Decode(data, nil, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
