package reuse

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// slim stands for a transform's result: metadata and one kept field.
type slim struct {
	metav1.ObjectMeta
	ip string
}

func (s *slim) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (s *slim) DeepCopyObject() runtime.Object   { c := *s; return &c }

func pod(name, uid, rv, ip string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: k8stypes.UID("uid-" + uid), ResourceVersion: rv},
		Status:     v1.PodStatus{PodIP: ip},
	}
}

// A Pod the store holds at the same UID and resource version gets the stored
// object back without the transform; any other version, another UID, no
// version, another Pod or a raw Pod in the store goes through the transform.
func TestUnchanged(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	calls := 0
	f := Unchanged(store, func(obj any) (any, error) {
		p, ok := obj.(*v1.Pod)
		if !ok {
			return obj, nil
		}
		calls++
		return &slim{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion}, ip: p.Status.PodIP}, nil
	})
	first, _ := f(pod("a", "a", "5", "10.0.0.1"))
	if err := store.Add(first); err != nil {
		t.Fatal(err)
	}
	if again, _ := f(pod("a", "a", "5", "10.0.0.1")); again != first || calls != 1 {
		t.Fatalf("the same version went through the transform again (calls %d)", calls)
	}
	for name, p := range map[string]*v1.Pod{
		"new version": pod("a", "a", "6", "10.0.0.9"),
		"new UID":     pod("a", "a2", "5", "10.0.0.9"),
		"no version":  pod("a", "a", "", "10.0.0.9"),
		"another Pod": pod("b", "a", "5", "10.0.0.9"),
	} {
		before := calls
		got, _ := f(p)
		if got == first || got.(*slim).ip != "10.0.0.9" || calls != before+1 {
			t.Errorf("%s: got the stored object or skipped the transform: %+v", name, got)
		}
	}
	// Objects that are not Pods (tombstones, already slim) pass to the transform.
	if got, _ := f("x"); got != "x" {
		t.Errorf("passthrough: %v", got)
	}
	// A raw Pod in the store is never handed back in place of the transform.
	raw := cache.NewStore(cache.MetaNamespaceKeyFunc)
	p := pod("a", "a", "5", "10.0.0.1")
	if err := raw.Add(p); err != nil {
		t.Fatal(err)
	}
	g := Unchanged(raw, func(obj any) (any, error) { return "transformed", nil })
	if got, _ := g(pod("a", "a", "5", "10.0.0.1")); got != "transformed" {
		t.Errorf("a raw stored Pod came back: %v", got)
	}
	// No store: the transform alone.
	h := Unchanged(nil, func(obj any) (any, error) { return "transformed", nil })
	if got, _ := h(pod("a", "a", "5", "10.0.0.1")); got != "transformed" {
		t.Errorf("nil store: %v", got)
	}
}
