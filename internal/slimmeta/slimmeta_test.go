package slimmeta

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// stored is an informer's object with a Meta, as the plugin's are.
type stored struct {
	Meta
}

func (s *stored) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (s *stored) DeepCopyObject() runtime.Object   { c := *s; return &c }

func TestMeta(t *testing.T) {
	now := metav1.Now()
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "shop", UID: "u-1", ResourceVersion: "42",
		Labels: map[string]string{"a": "b"}, DeletionTimestamp: &now, Finalizers: []string{"f"}}}
	s := &stored{Meta: Of(pod)}
	if s.Meta != (Meta{Name: "web-0", Namespace: "shop", UID: "u-1", ResourceVersion: "42"}) {
		t.Errorf("Of: %+v", s.Meta)
	}
	// What the informer's store and reflector use.
	if key, err := cache.MetaNamespaceKeyFunc(s); err != nil || key != "shop/web-0" {
		t.Errorf("key %q, %v", key, err)
	}
	m, err := meta.Accessor(s)
	if err != nil {
		t.Fatal(err)
	}
	if m.GetResourceVersion() != "42" || m.GetUID() != "u-1" {
		t.Errorf("accessor: %s %s", m.GetResourceVersion(), m.GetUID())
	}
	m.SetResourceVersion("43")
	m.SetName("web-1")
	if s.ResourceVersion != "43" || s.Name != "web-1" {
		t.Errorf("setters: %+v", s.Meta)
	}
	// Fields it does not hold read as empty, and setting them does nothing.
	m.SetLabels(map[string]string{"x": "y"})
	m.SetDeletionTimestamp(&now)
	if m.GetLabels() != nil || m.GetDeletionTimestamp() != nil || m.GetFinalizers() != nil || m.GetGeneration() != 0 {
		t.Error("an unheld field reads as set")
	}
	if c := s.DeepCopyObject().(*stored); c.Meta != s.Meta {
		t.Error("copy")
	}
}
