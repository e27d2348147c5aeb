package clients

import (
	"fmt"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// BenchmarkSlimClientMemory reports the heap that the all-Pods watch of
// imports enforce keeps per Pod: the store's slim object plus the index
// entry. Full Pods (with a container spec, labels, status) go through the
// transform, as they do in the store.
func BenchmarkSlimClientMemory(b *testing.B) {
	const n = 10000
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		x := NewIndex()
		kept := make([]any, n) // what the store would hold
		for i := range kept {
			p := &v1.Pod{ // a full Pod arrives, is cut down, and is dropped
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app-%d-7c9f8d6b5-x2x9z", i), Namespace: fmt.Sprintf("ns-%d", i%50),
					UID: types.UID(fmt.Sprintf("8f0c1b2e-0000-4000-8000-%012d", i)), ResourceVersion: "123456",
					Labels: map[string]string{"app": "app", "pod-template-hash": "7c9f8d6b5"}},
				Spec:   v1.PodSpec{Containers: []v1.Container{{Name: "app", Image: "registry.example/app:1.2.3"}}},
				Status: v1.PodStatus{Phase: v1.PodRunning, PodIPs: []v1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}}},
			}
			s := toSlim(p)
			kept[i] = s
			x.Set(s.client, s.ips)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/n, "B/pod")
		runtime.KeepAlive(kept)
		runtime.KeepAlive(x)
	}
}
