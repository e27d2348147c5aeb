package annotator

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/mcsannotations/mcsannotations/annotation"
)

func svc(name string, selector map[string]string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Annotations: map[string]string{annotation.ExportServiceAnnotation: "true"}},
		Spec:       corev1.ServiceSpec{Selector: selector, Ports: ports},
	}
}

func sport(name string, port int32, target intstr.IntOrString, proto corev1.Protocol) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, TargetPort: target, Protocol: proto}
}

func pod(name string, lbls map[string]string, ports ...corev1.ContainerPort) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name), Labels: lbls},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Ports: ports}}},
	}
}

var app = map[string]string{"app": "backend"}

// byAnnotation is svc prepared as exported by its annotation.
func byAnnotation(svc *corev1.Service) exported {
	e, _ := newExported(svc, nil)
	return e
}

func TestIsExported(t *testing.T) {
	annotated := svc("s", app)
	plain := svc("s", app)
	plain.Annotations = nil
	off := svc("s", app)
	off.Annotations[annotation.ExportServiceAnnotation] = "false"
	extName := svc("s", nil)
	extName.Spec.Type = corev1.ServiceTypeExternalName
	for _, tc := range []struct {
		name              string
		svc               *corev1.Service
		byServiceExport   bool
		wantOK, wantRefus bool
	}{
		{"annotated", annotated, false, true, false},
		{"annotated and a ServiceExport", annotated, true, true, false},
		{"a ServiceExport alone", plain, true, true, false},
		{"neither", plain, false, false, false},
		{"annotated other than true", off, false, false, false},
		{"ExternalName, annotated", extName, false, false, true},
		{"ExternalName, a ServiceExport", extName, true, false, true},
	} {
		if ok, refused := isExported(tc.svc, tc.byServiceExport); ok != tc.wantOK || refused != tc.wantRefus {
			t.Errorf("%s: exported %v, refused %v; want %v, %v", tc.name, ok, refused, tc.wantOK, tc.wantRefus)
		}
	}
}

// The allowed namespaces of an export: the ServiceExport's annotation when
// it has one (even empty), else the Service's; one that does not parse
// leaves the own namespace only, and says so.
func TestNewExportedAllowed(t *testing.T) {
	withAllowed := func(s *corev1.Service, v string) *corev1.Service {
		s.Annotations[annotation.AllowedNamespacesAnnotation] = v
		return s
	}
	se := func(annos map[string]string) *unstructured.Unstructured {
		u := serviceExport("s")
		u.SetAnnotations(annos)
		return u
	}
	for _, tc := range []struct {
		name    string
		svc     *corev1.Service
		se      *unstructured.Unstructured
		want    []string
		skipped bool
	}{
		{"neither", svc("s", app), nil, nil, false},
		{"the Service's", withAllowed(svc("s", app), "web, api"), nil, []string{"api", "web"}, false},
		{"the Service's under a ServiceExport without one", withAllowed(svc("s", app), "web"), se(nil), []string{"web"}, false},
		{"the ServiceExport's over the Service's", withAllowed(svc("s", app), "web"), se(map[string]string{annotation.AllowedNamespacesAnnotation: "api"}), []string{"api"}, false},
		{"the ServiceExport's, empty, over the Service's", withAllowed(svc("s", app), "web"), se(map[string]string{annotation.AllowedNamespacesAnnotation: ""}), nil, false},
		{"the ServiceExport's, everyone", svc("s", app), se(map[string]string{annotation.AllowedNamespacesAnnotation: "*"}), []string{"*"}, false},
		{"the Service's does not parse", withAllowed(svc("s", app), "Web"), nil, nil, true},
		{"the ServiceExport's does not parse", withAllowed(svc("s", app), "web"), se(map[string]string{annotation.AllowedNamespacesAnnotation: "a b"}), nil, true},
	} {
		e, ks := newExported(tc.svc, tc.se)
		if !reflect.DeepEqual(e.allowed, tc.want) {
			t.Errorf("%s: allowed %q, want %q", tc.name, e.allowed, tc.want)
		}
		if (len(ks) > 0) != tc.skipped {
			t.Errorf("%s: skips %+v, want one: %v", tc.name, ks, tc.skipped)
		}
		for _, k := range ks {
			if k.reason != skipAllowed || k.key != "s" || k.detail == "" {
				t.Errorf("%s: skip %+v, want %s for s with a detail", tc.name, k, skipAllowed)
			}
		}
	}
}

func TestDesired(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	sidecar := pod("p", app)
	sidecar.Spec.InitContainers = []corev1.Container{
		{Name: "init", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 1111}}},                          // runs once: not a server
		{Name: "proxy", RestartPolicy: &always, Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9901}}}, // a sidecar
	}
	cases := []struct {
		name     string
		pod      *corev1.Pod
		services []*corev1.Service
		cluster  string
		want     string
		skipped  []string // reasons
	}{
		{
			name:     "named targetPort resolved against the container",
			pod:      pod("p", app, corev1.ContainerPort{Name: "web", ContainerPort: 8080}),
			services: []*corev1.Service{svc("backend", app, sport("http", 80, intstr.FromString("web"), corev1.ProtocolTCP))},
			want:     `{"services":[{"name":"backend","namespace":"ns","ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}],"type":"ClusterSetIP"}]}`,
		},
		{
			name:     "numeric and unset targetPort, default protocol, cluster written",
			pod:      pod("p", app),
			services: []*corev1.Service{svc("backend", app, sport("a", 80, intstr.FromInt32(8080), ""), sport("b", 53, intstr.IntOrString{}, corev1.ProtocolUDP))},
			cluster:  "edge-a",
			want:     `{"services":[{"name":"backend","namespace":"ns","cluster":"edge-a","ports":[{"name":"a","port":80,"targetPort":8080,"protocol":"TCP"},{"name":"b","port":53,"targetPort":53,"protocol":"UDP"}],"type":"ClusterSetIP"}]}`,
		},
		{
			name: "a named targetPort the Pod lacks (or has for another protocol) is left out, the rest stays",
			pod:  pod("p", app, corev1.ContainerPort{Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolTCP}),
			services: []*corev1.Service{svc("backend", app,
				sport("http", 80, intstr.FromString("web"), corev1.ProtocolTCP),
				sport("dns", 53, intstr.FromString("dns"), corev1.ProtocolUDP),
				sport("plain", 81, intstr.FromInt32(81), corev1.ProtocolTCP))},
			want:    `{"services":[{"name":"backend","namespace":"ns","ports":[{"name":"plain","port":81,"targetPort":81,"protocol":"TCP"}],"type":"ClusterSetIP"}]}`,
			skipped: []string{skipPortUnresolved, skipPortUnresolved},
		},
		{
			name: "Service port names that are no IANA service name go unnamed",
			pod:  pod("p", app),
			services: []*corev1.Service{svc("backend", app,
				sport("123", 80, intstr.FromInt32(80), corev1.ProtocolTCP),
				sport("a-very-long-port-name", 81, intstr.FromInt32(81), corev1.ProtocolTCP),
				sport("http", 82, intstr.FromInt32(82), corev1.ProtocolTCP))},
			want:    `{"services":[{"name":"backend","namespace":"ns","ports":[{"port":80,"targetPort":80,"protocol":"TCP"},{"port":81,"targetPort":81,"protocol":"TCP"},{"name":"http","port":82,"targetPort":82,"protocol":"TCP"}],"type":"ClusterSetIP"}]}`,
			skipped: []string{skipPortName, skipPortName},
		},
		{
			name: "allowed namespaces travel in the entry, sorted",
			pod:  pod("p", app),
			services: []*corev1.Service{func() *corev1.Service {
				s := svc("backend", app)
				s.Annotations[annotation.AllowedNamespacesAnnotation] = "web, api"
				return s
			}()},
			want: `{"services":[{"name":"backend","namespace":"ns","allowedNamespaces":["api","web"],"type":"ClusterSetIP"}]}`,
		},
		{
			name:     "sidecar ports resolve, ports of init containers that end do not",
			pod:      sidecar,
			services: []*corev1.Service{svc("backend", app, sport("metrics", 9901, intstr.FromString("metrics"), corev1.ProtocolTCP))},
			want:     `{"services":[{"name":"backend","namespace":"ns","ports":[{"name":"metrics","port":9901,"targetPort":9901,"protocol":"TCP"}],"type":"ClusterSetIP"}]}`,
		},
		{
			name: "several Services, sorted by name; others' selectors do not match",
			pod:  pod("p", map[string]string{"app": "backend", "tier": "db"}),
			services: []*corev1.Service{
				svc("zeta", map[string]string{"tier": "db"}), svc("alpha", app),
				svc("other", map[string]string{"app": "frontend"}), svc("no-selector", nil),
			},
			want: `{"services":[{"name":"alpha","namespace":"ns","type":"ClusterSetIP"},{"name":"zeta","namespace":"ns","type":"ClusterSetIP"}]}`,
		},
		{
			name:     "selected by nothing",
			pod:      pod("p", map[string]string{"app": "x"}),
			services: []*corev1.Service{svc("backend", app)},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ex []exported
			for _, s := range tc.services {
				ex = append(ex, byAnnotation(s))
			}
			sortServices(ex)
			got, names, skips := desired(tc.pod, ex, tc.cluster, newChecker("ns", tc.cluster))
			if got != tc.want {
				t.Errorf("annotation\n got %s\nwant %s", got, tc.want)
			}
			var reasons []string
			for _, s := range skips {
				reasons = append(reasons, s.reason)
				if s.detail == "" || s.key == "" {
					t.Errorf("skip %+v: no key or detail", s)
				}
			}
			if !reflect.DeepEqual(reasons, tc.skipped) {
				t.Errorf("skipped %v, want %v", reasons, tc.skipped)
			}
			if got == "" {
				if names != nil {
					t.Errorf("names %v with no annotation", names)
				}
				return
			}
			// What is written reads back, with the plugin's own parser, as
			// the names reported, in the source cluster.
			read, rej := annotation.ParseExports(got, "ns", "edge-a")
			if len(rej) > 0 {
				t.Fatalf("the plugin rejects it: %v", rej)
			}
			var readNames []string
			for _, e := range read {
				readNames = append(readNames, e.Name)
				if e.Cluster != "edge-a" {
					t.Errorf("entry %s reads as cluster %q", e.Name, e.Cluster)
				}
			}
			if !reflect.DeepEqual(readNames, names) {
				t.Errorf("reads back as %v, reported %v", readNames, names)
			}
		})
	}
}

// More exported Services select a Pod than an annotation may list: the
// first MaxServices by name are written, each other one is a skip.
func TestDesiredTooManyServices(t *testing.T) {
	var ex []exported
	for i := range annotation.MaxServices + 3 {
		ex = append(ex, byAnnotation(svc(fmt.Sprintf("s%03d", i), app)))
	}
	got, names, skips := desired(pod("p", app), ex, "", newChecker("ns", ""))
	if len(names) != annotation.MaxServices || names[0] != "s000" {
		t.Fatalf("%d names from %v, want the first %d", len(names), names[:1], annotation.MaxServices)
	}
	if len(skips) != 3 || skips[0].reason != skipTooManyServices || !strings.Contains(skips[0].detail, "s064") {
		t.Errorf("skips %+v, want 3 too_many_services from s064", skips)
	}
	if _, rej := annotation.ParseExports(got, "ns", "c"); len(rej) > 0 {
		t.Errorf("rejected: %v", rej)
	}
}

// An annotation that would pass the readers' size limit loses Services from
// the end until it fits.
func TestDesiredTooLarge(t *testing.T) {
	var ports []corev1.ServicePort
	for i := range annotation.MaxPortsPerExport {
		ports = append(ports, sport(fmt.Sprintf("port-name-%05d", i), int32(1000+i), intstr.FromInt32(int32(2000+i)), corev1.ProtocolTCP))
	}
	var ex []exported
	for i := range 12 {
		ex = append(ex, byAnnotation(svc(fmt.Sprintf("s%02d", i), app, ports...)))
	}
	got, names, skips := desired(pod("p", app), ex, "edge-a", newChecker("ns", "edge-a"))
	if got == "" || len(got) > annotation.MaxBytes {
		t.Fatalf("annotation of %d bytes, want some, at most %d", len(got), annotation.MaxBytes)
	}
	if len(names)+len(skips) != 12 || len(skips) == 0 {
		t.Fatalf("%d written, %d skipped, want 12 in all and some skipped", len(names), len(skips))
	}
	for _, s := range skips {
		if s.reason != skipTooLarge {
			t.Errorf("skip %+v, want too_large", s)
		}
	}
	if names[len(names)-1] >= skips[0].key[len("p/"):] {
		t.Errorf("kept %v and dropped %s: want the last ones dropped", names, skips[0].key)
	}
}

// A Service with more ports than an entry may list: the first
// MaxPortsPerExport are written, the rest is one skip.
func TestDesiredTooManyPorts(t *testing.T) {
	var ports []corev1.ServicePort
	for i := range annotation.MaxPortsPerExport + 5 {
		ports = append(ports, sport(fmt.Sprintf("p%d", i), int32(1000+i), intstr.IntOrString{}, corev1.ProtocolTCP))
	}
	ex := []exported{byAnnotation(svc("backend", app, ports...))}
	got, _, skips := desired(pod("p", app), ex, "", newChecker("ns", ""))
	read, rej := annotation.ParseExports(got, "ns", "c")
	if len(rej) > 0 || len(read) != 1 || len(read[0].Ports) != annotation.MaxPortsPerExport {
		t.Fatalf("read %d entries (%v), want 1 with %d ports", len(read), rej, annotation.MaxPortsPerExport)
	}
	if len(skips) != 1 || skips[0].reason != skipTooManyPorts {
		t.Errorf("skips %+v, want one too_many_ports", skips)
	}
}

func TestWritable(t *testing.T) {
	now := metav1.Now()
	for _, tc := range []struct {
		mod  func(*corev1.Pod)
		want bool
	}{
		{func(*corev1.Pod) {}, true},
		{func(p *corev1.Pod) { p.Status.Phase = corev1.PodRunning }, true},
		{func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, false},
		{func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }, false},
		{func(p *corev1.Pod) { p.DeletionTimestamp = &now }, false},
	} {
		p := pod("p", app)
		tc.mod(p)
		if got := writable(p); got != tc.want {
			t.Errorf("writable(phase %q, deleting %v) = %v", p.Status.Phase, p.DeletionTimestamp != nil, got)
		}
	}
}

func TestParseAllowed(t *testing.T) {
	for raw, want := range map[string][]string{
		"": nil, "web": {"web"}, " web , api,web ": {"api", "web"}, "*": {"*"}, "web,*": {"*"}, ",,": nil,
	} {
		if got, err := parseAllowed(raw); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%q: %v, %v; want %v", raw, got, err, want)
		}
	}
	for _, raw := range []string{"Web", "a b", "web;api"} {
		if got, err := parseAllowed(raw); err == nil {
			t.Errorf("%q accepted as %v", raw, got)
		}
	}
}
