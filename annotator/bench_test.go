package annotator

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// BenchmarkReconcileSettled is what each event in a namespace costs the
// leader once its Pods carry what they should: a reconcile of the whole
// namespace (every Pod against every exported Service's selector, the
// annotation computed and compared) that writes nothing. Pods are spread
// evenly over the Services; a tenth are selected by none.
func BenchmarkReconcileSettled(b *testing.B) {
	_, key, _ := ed25519.GenerateKey(nil)
	for _, size := range []struct {
		pods, services int
		signed         bool
	}{{1000, 10, false}, {1000, 100, false}, {10000, 10, false}, {1000, 10, true}} {
		name := fmt.Sprintf("pods=%d/services=%d", size.pods, size.services)
		cfg := Config{Cluster: "edge-a"}
		if size.signed {
			name = "signed/" + name
			cfg.SignKey = key
		}
		b.Run(name, func(b *testing.B) {
			var svcs []exported
			var objs []runtime.Object
			for i := range size.services {
				s := svc(fmt.Sprintf("s%03d", i), map[string]string{"app": fmt.Sprintf("a%03d", i)})
				svcs = append(svcs, byAnnotation(s))
				objs = append(objs, s)
			}
			sortServices(svcs)
			for i := range size.pods {
				app := "none"
				if i%10 != 0 {
					app = fmt.Sprintf("a%03d", i%size.services)
				}
				p := pod(fmt.Sprintf("p%05d", i), map[string]string{"app": app}, corev1.ContainerPort{Name: "web", ContainerPort: 8080})
				p.Status.Phase = corev1.PodRunning
				if want, _, _ := desired(p, svcs, "edge-a", newChecker("ns", "edge-a")); want != "" {
					p.Labels[annotation.ExporterLabel] = annotation.LabelValue
					p.Annotations = map[string]string{annotation.ExportAnnotation: want}
					if size.signed {
						p.Annotations[annotation.SignatureAnnotation] = annotation.Sign(key, "edge-a", "ns", p.Name, string(p.UID), want)
					}
				}
				objs = append(objs, p)
			}
			client := fake.NewClientset(objs...)
			m := NewMetrics(nil)
			c := New(client, nil, client.Discovery(), cfg, m)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := c.Start(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Reconcile(ctx, "ns"); err != nil {
					b.Fatal(err)
				}
			}
			if w := testutil.ToFloat64(m.PodWrites.WithLabelValues("ok")); w != 0 {
				b.Fatalf("a settled namespace was written to %v times", w)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(size.pods), "ns/pod")
		})
	}
}
