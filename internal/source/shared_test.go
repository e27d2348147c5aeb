package source

import (
	"context"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/internal/store"
)

// A source with Options.Shared reads the exported Pods from another
// component's informer of every Pod: the first list, then each change, a
// Pod that loses the exporter label and one deleted; the Pods without the
// label never become records; Expire starts over from the informer.
func TestSharedInformer(t *testing.T) {
	unlabelled := newPod("plain", "10.0.0.9", backend, true)
	unlabelled.Labels = nil
	client := fake.NewClientset(newPod("a", "10.0.0.1", backend, true), unlabelled)
	f := informers.NewSharedInformerFactory(client, 0)
	inf := f.Core().V1().Pods().Informer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())

	records := store.New()
	s := New("c1", client, records, Events{}, Options{Shared: inf})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Stop() }()
	names := func() []string {
		var out []string
		for _, p := range records.Pods("c1") {
			out = append(out, p.Name)
		}
		slices.Sort(out)
		return out
	}
	eventually(t, "the first list", func() bool { return s.HasSynced() && slices.Equal(names(), []string{"a"}) })

	pods := client.CoreV1().Pods("default")
	b := newPod("b", "10.0.0.2", backend, false)
	if _, err := pods.Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b added", func() bool { return slices.Equal(names(), []string{"a", "b"}) })
	b = b.DeepCopy()
	b.ResourceVersion = "2"
	b.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}
	if _, err := pods.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b ready", func() bool {
		for _, p := range records.Pods("c1") {
			if p.Name == "b" {
				return p.Ready
			}
		}
		return false
	})
	b = b.DeepCopy()
	b.ResourceVersion, b.Labels = "3", nil
	if _, err := pods.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b without the label gone", func() bool { return slices.Equal(names(), []string{"a"}) })
	if err := pods.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a deleted", func() bool { return len(names()) == 0 })

	if _, err := pods.Create(ctx, newPod("c", "10.0.0.3", backend, true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c added", func() bool { return slices.Equal(names(), []string{"c"}) })
	if err := s.Expire(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c back after Expire", func() bool { return !s.Expired() && slices.Equal(names(), []string{"c"}) })
}
