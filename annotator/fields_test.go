package annotator

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/mcsannotations/mcsannotations/annotation"
)

func TestServiceFields(t *testing.T) {
	svcCreated := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	seCreated := svcCreated.Add(time.Hour)
	base := func() *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "backend", Namespace: "ns", CreationTimestamp: metav1.NewTime(svcCreated)},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", SessionAffinity: corev1.ServiceAffinityNone}}
	}
	se := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"exportedLabels":      map[string]any{"tier": "db"},
		"exportedAnnotations": map[string]any{"example.com/owner": "team-a"},
	}}}
	se.SetCreationTimestamp(metav1.NewTime(seCreated))

	tests := []struct {
		name string
		svc  func(*corev1.Service)
		se   *unstructured.Unstructured
		want annotation.Service
	}{
		{name: "ClusterIP by annotation: the defaults are left out", want: annotation.Service{Type: "ClusterSetIP", ExportedAt: "2026-01-02T03:04:05Z"}},
		{name: "headless", svc: func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone },
			want: annotation.Service{Type: "Headless", ExportedAt: "2026-01-02T03:04:05Z"}},
		{name: "headless, dual stack: its families in its order", svc: func(s *corev1.Service) {
			s.Spec.ClusterIP = corev1.ClusterIPNone
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
		}, want: annotation.Service{Type: "Headless", ExportedAt: "2026-01-02T03:04:05Z", IPFamilies: annotation.NewIPFamilies("IPv6", "IPv4")}},
		{name: "ClusterIP: its families are the derived Service's, not written", svc: func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol} },
			want: annotation.Service{Type: "ClusterSetIP", ExportedAt: "2026-01-02T03:04:05Z"}},
		{name: "affinity, policies", svc: func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}}
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
			s.Spec.TrafficDistribution = ptr.To("PreferClose")
		}, want: annotation.Service{Type: "ClusterSetIP", ExportedAt: "2026-01-02T03:04:05Z", SessionAffinity: "ClientIP",
			SessionAffinityTimeoutSeconds: 600, InternalTrafficPolicy: "Local", TrafficDistribution: "PreferClose"}},
		{name: "by a ServiceExport: its time, labels and annotations", se: se,
			want: annotation.Service{Type: "ClusterSetIP", ExportedAt: "2026-01-02T04:04:05Z",
				Labels: map[string]string{"tier": "db"}, Annotations: map[string]string{"example.com/owner": "team-a"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			if tc.svc != nil {
				tc.svc(s)
			}
			got := serviceFields(s, tc.se)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			// The Service informer stores slimmed Services: they must keep
			// what serviceFields reads.
			slim, _ := slimService(s)
			if fromSlim := serviceFields(slim.(*corev1.Service), tc.se); !reflect.DeepEqual(fromSlim, got) {
				t.Errorf("from the slimmed Service: %+v\nfrom the Service:         %+v", fromSlim, got)
			}
			// What the annotator writes, a reader accepts.
			if _, err := annotation.FormatExports([]annotation.Export{{Name: "backend", Namespace: "ns", Service: got}}, "ns", "c"); err != nil {
				t.Errorf("a reader would refuse it: %v", err)
			}
		})
	}
}
