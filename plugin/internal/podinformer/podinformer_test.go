package podinformer

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

type cut struct{ v1.Pod }

func TestNew(t *testing.T) {
	pod := func(name string, labels map[string]string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Labels: labels, ResourceVersion: "1"}}
	}
	client := fake.NewClientset(pod("in", map[string]string{"export": "true"}), pod("out", nil))
	var transformed atomic.Int32
	factory, inf, err := New(client, "export=true", func(obj any) (any, error) {
		p, ok := obj.(*v1.Pod)
		if !ok {
			return obj, nil
		}
		transformed.Add(1)
		return &cut{Pod: v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, ResourceVersion: p.ResourceVersion}}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer func() { close(stop); factory.Shutdown() }()
	factory.Start(stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("no sync")
	}
	keys := inf.GetStore().ListKeys()
	if len(keys) != 1 || keys[0] != "shop/in" {
		t.Errorf("stored %v, want the selected Pod only", keys)
	}
	if obj, _, _ := inf.GetStore().GetByKey("shop/in"); obj == nil || transformed.Load() != 1 {
		t.Errorf("stored %T after %d transforms", obj, transformed.Load())
	} else if _, ok := obj.(*cut); !ok {
		t.Errorf("stored %T, want the transform's object", obj)
	}
	if ix := inf.GetIndexer().GetIndexers(); len(ix) != 0 {
		t.Errorf("indexers %v, want none", ix)
	}
}
