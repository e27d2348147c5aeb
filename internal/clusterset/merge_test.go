package clusterset

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func port(name string, p int32, proto corev1.Protocol) mcsv1beta1.ServicePort {
	return mcsv1beta1.ServicePort{Name: name, Port: p, Protocol: proto}
}

func export(cluster string, age time.Duration, ports ...mcsv1beta1.ServicePort) Export {
	return Export{Cluster: cluster, Created: t0.Add(-age), Type: mcsv1beta1.ClusterSetIP, Ports: ports}
}

func TestMerge(t *testing.T) {
	http := port("http", 80, corev1.ProtocolTCP)
	sctp := port("stcp", 142, corev1.ProtocolSCTP)
	tests := []struct {
		name      string
		exports   []Export
		edit      func([]Export)
		wantType  mcsv1beta1.ServiceImportType
		wantPorts []mcsv1beta1.ServicePort
		conflicts []mcsv1beta1.ServiceExportConditionReason
		oldest    string
		message   string // a part of the message
	}{{
		name:      "one cluster",
		exports:   []Export{export("a", 0, http)},
		wantType:  mcsv1beta1.ClusterSetIP,
		wantPorts: []mcsv1beta1.ServicePort{http},
		oldest:    "a",
		message:   "exported by cluster a without conflicts",
	}, {
		name:      "union of ports: a conflict naming what each lacks",
		exports:   []Export{export("a", time.Hour, http), export("b", 0, http, sctp)},
		wantType:  mcsv1beta1.ClusterSetIP,
		wantPorts: []mcsv1beta1.ServicePort{http, sctp},
		conflicts: []mcsv1beta1.ServiceExportConditionReason{mcsv1beta1.ServiceExportReasonPortConflict},
		oldest:    "a",
		message:   "PortConflict: the exports' ports differ and the ServiceImport has their union: cluster a does not export stcp 142/SCTP",
	}, {
		name: "union of three port sets",
		exports: []Export{export("a", time.Hour, http), export("b", 0, http, port("metrics", 9090, corev1.ProtocolTCP)),
			export("c", 0, http, port("grpc", 9000, corev1.ProtocolTCP))},
		wantType:  mcsv1beta1.ClusterSetIP,
		wantPorts: []mcsv1beta1.ServicePort{port("grpc", 9000, corev1.ProtocolTCP), http, port("metrics", 9090, corev1.ProtocolTCP)},
		conflicts: []mcsv1beta1.ServiceExportConditionReason{mcsv1beta1.ServiceExportReasonPortConflict},
		oldest:    "a",
		message:   "cluster a does not export grpc 9000/TCP, metrics 9090/TCP; cluster b does not export grpc 9000/TCP; cluster c does not export metrics 9090/TCP",
	}, {
		name:      "the same ports in another order: no conflict",
		exports:   []Export{export("a", time.Hour, http, sctp), export("b", 0, sctp, http)},
		wantType:  mcsv1beta1.ClusterSetIP,
		wantPorts: []mcsv1beta1.ServicePort{http, sctp},
		oldest:    "a",
		message:   "exported by clusters a, b without conflicts",
	}, {
		name:      "a port name with another number: the oldest's is kept",
		exports:   []Export{export("b", 0, port("http", 81, corev1.ProtocolTCP)), export("a", time.Hour, http)},
		wantType:  mcsv1beta1.ClusterSetIP,
		wantPorts: []mcsv1beta1.ServicePort{http},
		conflicts: []mcsv1beta1.ServiceExportConditionReason{mcsv1beta1.ServiceExportReasonPortConflict},
		oldest:    "a",
		message:   "PortConflict: cluster b differ from the oldest export (cluster a)",
	}, {
		name:      "the same port and protocol under two names",
		exports:   []Export{export("a", time.Hour, http), export("b", 0, port("web", 80, ""))},
		wantType:  mcsv1beta1.ClusterSetIP,
		wantPorts: []mcsv1beta1.ServicePort{http},
		conflicts: []mcsv1beta1.ServiceExportConditionReason{mcsv1beta1.ServiceExportReasonPortConflict},
		oldest:    "a",
		message:   "cluster b does not export http 80/TCP; cluster b give a port name another port",
	}, {
		name:      "an unset protocol is TCP",
		exports:   []Export{export("a", time.Hour, http), export("b", 0, port("http", 80, ""))},
		wantType:  mcsv1beta1.ClusterSetIP,
		wantPorts: []mcsv1beta1.ServicePort{http},
		oldest:    "a",
	}, {
		name:    "headlessness: the oldest decides",
		exports: []Export{export("a", time.Hour, http), export("b", 0, http)},
		edit: func(ex []Export) {
			ex[1].Type = mcsv1beta1.Headless
		},
		wantType:  mcsv1beta1.ClusterSetIP,
		wantPorts: []mcsv1beta1.ServicePort{http},
		conflicts: []mcsv1beta1.ServiceExportConditionReason{mcsv1beta1.ServiceExportReasonTypeConflict},
		oldest:    "a",
	}, {
		name:    "a tie in age goes to the cluster ID",
		exports: []Export{export("b", 0, http), export("a", 0, http)},
		edit: func(ex []Export) {
			ex[0].Type = mcsv1beta1.Headless
		},
		wantType:  mcsv1beta1.ClusterSetIP,
		wantPorts: []mcsv1beta1.ServicePort{http},
		conflicts: []mcsv1beta1.ServiceExportConditionReason{mcsv1beta1.ServiceExportReasonTypeConflict},
		oldest:    "a",
	}, {
		name:    "affinity, its config and traffic policies",
		exports: []Export{export("a", time.Hour, http), export("b", 0, http), export("c", 2*time.Hour, http)},
		edit: func(ex []Export) {
			ex[1].SessionAffinity = corev1.ServiceAffinityClientIP
			ex[1].SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
			ex[1].InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
			ex[1].TrafficDistribution = ptr.To("PreferClose")
			ex[2].SessionAffinity = corev1.ServiceAffinityNone                               // the default, said
			ex[2].InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyCluster) // the default, said
		},
		wantType:  mcsv1beta1.ClusterSetIP,
		wantPorts: []mcsv1beta1.ServicePort{http},
		conflicts: []mcsv1beta1.ServiceExportConditionReason{
			mcsv1beta1.ServiceExportReasonSessionAffinityConflict,
			mcsv1beta1.ServiceExportReasonSessionAffinityConfigConflict,
			mcsv1beta1.ServiceExportReasonInternalTrafficPolicyConflict,
			mcsv1beta1.ServiceExportReasonTrafficDistributionConflict,
		},
		oldest: "c",
	}, {
		name:    "labels and annotations",
		exports: []Export{export("a", time.Hour, http), export("b", 0, http)},
		edit: func(ex []Export) {
			ex[0].Labels = map[string]string{"dummy-label": "true"}
			ex[0].Annotations = map[string]string{"dummy-annotation": "true"}
			ex[1].Labels = map[string]string{"dummy-label2": "true"}
			ex[1].Annotations = map[string]string{"dummy-annotation2": "true"}
		},
		wantType:  mcsv1beta1.ClusterSetIP,
		wantPorts: []mcsv1beta1.ServicePort{http},
		conflicts: []mcsv1beta1.ServiceExportConditionReason{
			mcsv1beta1.ServiceExportReasonLabelsConflict,
			mcsv1beta1.ServiceExportReasonAnnotationsConflict,
		},
		oldest:  "a",
		message: "AnnotationsConflict: cluster b differ",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.edit != nil {
				tc.edit(tc.exports)
			}
			in := slices.Clone(tc.exports)
			im := Merge(tc.exports)
			if !slices.EqualFunc(in, tc.exports, func(a, b Export) bool { return a.Cluster == b.Cluster }) {
				t.Errorf("Merge reordered its argument")
			}
			if im.Spec.Type != tc.wantType {
				t.Errorf("type %q, want %q", im.Spec.Type, tc.wantType)
			}
			if !slices.Equal(im.Spec.Ports, tc.wantPorts) {
				t.Errorf("ports %v, want %v", im.Spec.Ports, tc.wantPorts)
			}
			if !slices.Equal(im.Conflicts, tc.conflicts) {
				t.Errorf("conflicts %v, want %v", im.Conflicts, tc.conflicts)
			}
			if im.Oldest != tc.oldest {
				t.Errorf("oldest %q, want %q", im.Oldest, tc.oldest)
			}
			if !strings.Contains(im.Message, tc.message) {
				t.Errorf("message %q, want it to contain %q", im.Message, tc.message)
			}
			var clusters []string
			for _, e := range tc.exports {
				clusters = append(clusters, e.Cluster)
			}
			slices.Sort(clusters)
			if !slices.Equal(im.Clusters, clusters) {
				t.Errorf("clusters %v, want %v", im.Clusters, clusters)
			}
			if want := len(tc.conflicts) > 0; im.Conflict() != want {
				t.Errorf("Conflict() = %v, want %v", im.Conflict(), want)
			}
		})
	}
}

func TestMergeOldestValuesWin(t *testing.T) {
	old := export("a", time.Hour, port("http", 80, corev1.ProtocolTCP))
	old.SessionAffinity = corev1.ServiceAffinityClientIP
	old.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](30)}}
	old.Labels = map[string]string{"tier": "db"}
	young := export("b", 0, port("http", 80, corev1.ProtocolTCP))
	young.Labels = map[string]string{"tier": "web"}
	im := Merge([]Export{young, old})
	if im.Spec.SessionAffinity != corev1.ServiceAffinityClientIP || *im.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds != 30 {
		t.Errorf("affinity %v %v, want the oldest's", im.Spec.SessionAffinity, im.Spec.SessionAffinityConfig)
	}
	if im.Labels["tier"] != "db" {
		t.Errorf("labels %v, want the oldest's", im.Labels)
	}
	im.Labels["tier"] = "changed"
	*im.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = 1
	if old.Labels["tier"] != "db" || *old.SessionAffinityConfig.ClientIP.TimeoutSeconds != 30 {
		t.Errorf("the import shares maps or pointers with the export it came from")
	}
	if got := im.Reason(); got != "SessionAffinityConflict,SessionAffinityConfigConflict,LabelsConflict" {
		t.Errorf("reason %q", got)
	}
}

func TestMergeNoConflictReason(t *testing.T) {
	im := Merge([]Export{export("a", 0)})
	if im.Reason() != string(mcsv1beta1.ServiceExportReasonNoConflicts) {
		t.Errorf("reason %q, want NoConflicts", im.Reason())
	}
	if im.Spec.SessionAffinity != corev1.ServiceAffinityNone {
		t.Errorf("affinity %q, want None (the API's default)", im.Spec.SessionAffinity)
	}
	// As the exported Service says it (the API server defaults it to
	// Cluster), which the upstream conformance suite compares.
	if p := im.Spec.InternalTrafficPolicy; p == nil || *p != corev1.ServiceInternalTrafficPolicyCluster {
		t.Errorf("internalTrafficPolicy %v, want Cluster (the API's default)", p)
	}
}

// A message names at most maxNamed clusters and ports of each, however
// many differ: a condition's message stays short.
func TestMergePortMessageBounded(t *testing.T) {
	var all []mcsv1beta1.ServicePort
	for i := range 40 {
		all = append(all, port(fmt.Sprintf("p%02d", i), int32(1000+i), corev1.ProtocolTCP))
	}
	ex := []Export{export("a", time.Hour, all...)}
	for i := range 30 {
		ex = append(ex, export(fmt.Sprintf("c%02d", i), 0, all[i]))
	}
	im := Merge(ex)
	if !slices.Equal(im.Conflicts, []mcsv1beta1.ServiceExportConditionReason{mcsv1beta1.ServiceExportReasonPortConflict}) {
		t.Fatalf("conflicts %v", im.Conflicts)
	}
	for _, want := range []string{"cluster c00 does not export p01 1001/TCP", "and 34 more", "and 25 more clusters"} {
		if !strings.Contains(im.Message, want) {
			t.Errorf("message %q lacks %q", im.Message, want)
		}
	}
	if len(im.Message) > 1024 {
		t.Errorf("message of %d bytes", len(im.Message))
	}
}
