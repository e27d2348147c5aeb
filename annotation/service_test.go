package annotation

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"
)

func TestParseServiceFields(t *testing.T) {
	full := Service{
		Type: TypeClusterSetIP, ExportedAt: "2026-11-25T12:00:00Z",
		SessionAffinity: "ClientIP", SessionAffinityTimeoutSeconds: 600,
		InternalTrafficPolicy: "Local", TrafficDistribution: "PreferClose",
		Labels:      map[string]string{"tier": "db", "example.com/team": "a"},
		Annotations: map[string]string{"example.com/Note": "anything at all: 5 €"},
	}
	tests := []struct {
		name   string
		entry  string // the fields after "name"
		want   Service
		reason Reason
	}{
		{name: "absent: an entry written before the fields existed", entry: ``, want: Service{}},
		{name: "every field", entry: `,"type":"ClusterSetIP","exportedAt":"2026-11-25T12:00:00Z","sessionAffinity":"ClientIP",
			"sessionAffinityTimeoutSeconds":600,"internalTrafficPolicy":"Local","trafficDistribution":"PreferClose",
			"labels":{"tier":"db","example.com/team":"a"},"annotations":{"example.com/Note":"anything at all: 5 €"}`, want: full},
		{name: "headless", entry: `,"type":"Headless"`, want: Service{Type: TypeHeadless}},
		{name: "bad type", entry: `,"type":"ExternalName"`, reason: ReasonService},
		{name: "bad time", entry: `,"exportedAt":"yesterday"`, reason: ReasonService},
		{name: "bad affinity", entry: `,"sessionAffinity":"Cookie"`, reason: ReasonService},
		{name: "timeout without ClientIP", entry: `,"sessionAffinityTimeoutSeconds":10`, reason: ReasonService},
		{name: "timeout over a day", entry: `,"sessionAffinity":"ClientIP","sessionAffinityTimeoutSeconds":86401`, reason: ReasonService},
		{name: "bad traffic policy", entry: `,"internalTrafficPolicy":"Node"`, reason: ReasonService},
		{name: "bad traffic distribution", entry: `,"trafficDistribution":"not valid!"`, reason: ReasonService},
		{name: "bad label key", entry: `,"labels":{"-x":"a"}`, reason: ReasonService},
		{name: "bad label value", entry: `,"labels":{"x":"` + strings.Repeat("v", 64) + `"}`, reason: ReasonService},
		{name: "bad annotation key", entry: `,"annotations":{"a b":"c"}`, reason: ReasonService},
		{name: "wrong shape", entry: `,"labels":["a"]`, reason: ReasonJSON},
		{name: "stale: drop", entry: `,"staleEndpoints":"Drop","staleGraceSeconds":30`, want: Service{StaleEndpoints: StaleDrop, StaleGraceSeconds: 30}},
		{name: "stale: drop if local", entry: `,"staleEndpoints":"DropIfLocal"`, want: Service{StaleEndpoints: StaleDropIfLocal}},
		{name: "stale: serve", entry: `,"staleEndpoints":"Serve"`, want: Service{StaleEndpoints: StaleServe}},
		{name: "stale: unknown policy", entry: `,"staleEndpoints":"Expire"`, reason: ReasonService},
		{name: "stale: grace without a drop", entry: `,"staleGraceSeconds":30`, reason: ReasonService},
		{name: "stale: negative grace", entry: `,"staleEndpoints":"Drop","staleGraceSeconds":-1`, reason: ReasonService},
		{name: "stale: grace over a week", entry: `,"staleEndpoints":"Drop","staleGraceSeconds":604801`, reason: ReasonService},
		{name: "ipFamilies: one", entry: `,"ipFamilies":["IPv6"]`, want: Service{IPFamilies: NewIPFamilies(IPv6)}},
		{name: "ipFamilies: dual stack, IPv6 first", entry: `,"ipFamilies":["IPv6","IPv4"]`, want: Service{IPFamilies: NewIPFamilies(IPv6, IPv4)}},
		{name: "ipFamilies: empty is absent", entry: `,"ipFamilies":[]`, want: Service{}},
		{name: "ipFamilies: unknown family", entry: `,"ipFamilies":["IPv5"]`, reason: ReasonService},
		{name: "ipFamilies: lower case", entry: `,"ipFamilies":["ipv4"]`, reason: ReasonService},
		{name: "ipFamilies: twice", entry: `,"ipFamilies":["IPv4","IPv4"]`, reason: ReasonService},
		{name: "ipFamilies: three", entry: `,"ipFamilies":["IPv4","IPv6","IPv4"]`, reason: ReasonService},
		{name: "ipFamilies: not a list", entry: `,"ipFamilies":"IPv4"`, reason: ReasonJSON},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := `{"services":[{"name":"backend"` + tc.entry + `},{"name":"other"}]}`
			got, rej := ParseExports(raw, "default", "cluster-a")
			if tc.reason != "" {
				if len(rej) != 1 || rej[0].Reason != tc.reason || rej[0].Index != 0 {
					t.Fatalf("rejections %v, want one %s for entry 0", rej, tc.reason)
				}
				if len(got) != 1 || got[0].Name != "other" {
					t.Errorf("the good entry beside it: %+v", got)
				}
				return
			}
			if len(rej) > 0 || len(got) != 2 {
				t.Fatalf("got %+v, rejections %v", got, rej)
			}
			if !reflect.DeepEqual(got[0].Service, tc.want) {
				t.Errorf("service fields %+v, want %+v", got[0].Service, tc.want)
			}
		})
	}
}

func TestServiceFieldsRoundTrip(t *testing.T) {
	e := Export{Name: "backend", Namespace: "default",
		Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: TCP, AppProtocol: "kubernetes.io/h2c"}},
		Service: Service{Type: TypeClusterSetIP, ExportedAt: "2026-11-25T12:00:00Z", Labels: map[string]string{"a": "b"},
			StaleEndpoints: StaleDropIfLocal, StaleGraceSeconds: 30, IPFamilies: NewIPFamilies(IPv4, IPv6)}}
	raw, err := FormatExports([]Export{e}, "default", "cluster-a")
	if err != nil {
		t.Fatal(err)
	}
	back, rej := ParseExports(raw, "default", "cluster-a")
	e.Cluster = "cluster-a"
	if len(rej) > 0 || len(back) != 1 || !reflect.DeepEqual(back[0], e) {
		t.Fatalf("round trip of %s: %+v %v, want %+v", raw, back, rej, e)
	}
	// Written without the fields, the value is what it always was.
	old, _ := FormatExports([]Export{{Name: "backend", Namespace: "default"}}, "default", "cluster-a")
	if old != `{"services":[{"name":"backend","namespace":"default"}]}` {
		t.Errorf("an entry without Service fields is written as %s", old)
	}
}

func TestServiceDefaults(t *testing.T) {
	var s Service
	if s.ServiceType() != TypeHeadless || !s.Exported().IsZero() {
		t.Errorf("defaults: type %q, exported %v", s.ServiceType(), s.Exported())
	}
	s = Service{Type: TypeClusterSetIP, ExportedAt: "2026-11-25T12:00:00+01:00"}
	if s.ServiceType() != TypeClusterSetIP || !s.Exported().Equal(time.Date(2026, 11, 25, 11, 0, 0, 0, time.UTC)) {
		t.Errorf("type %q, exported %v", s.ServiceType(), s.Exported())
	}
}

func TestAppProtocolChecked(t *testing.T) {
	_, rej := ParseExports(`{"services":[{"name":"a","ports":[{"port":80,"appProtocol":"not valid!"}]}]}`, "default", "c")
	if len(rej) != 1 || rej[0].Reason != ReasonPort {
		t.Errorf("rejections %v, want one invalid_port", rej)
	}
}

func TestServiceEqual(t *testing.T) {
	a := Service{Type: TypeClusterSetIP, Labels: map[string]string{"a": "1"}}
	for _, change := range []func(*Service){
		func(s *Service) { s.Type = TypeHeadless },
		func(s *Service) { s.ExportedAt = "2026-11-25T12:00:00Z" },
		func(s *Service) { s.SessionAffinity = "ClientIP" },
		func(s *Service) { s.SessionAffinityTimeoutSeconds = 5 },
		func(s *Service) { s.InternalTrafficPolicy = "Local" },
		func(s *Service) { s.TrafficDistribution = "PreferClose" },
		func(s *Service) { s.Labels = map[string]string{"a": "2"} },
		func(s *Service) { s.Annotations = map[string]string{"a": "1"} },
		func(s *Service) { s.StaleEndpoints = StaleDrop },
		func(s *Service) { s.StaleGraceSeconds = 30 },
		func(s *Service) { s.IPFamilies = NewIPFamilies(IPv4) },
	} {
		b := a
		b.Labels = map[string]string{"a": "1"}
		if !a.Equal(&b) {
			t.Fatalf("a copy differs")
		}
		change(&b)
		if a.Equal(&b) {
			t.Errorf("a change is not seen: %+v", b)
		}
	}
}

// An entry without exportedAt (everything written before the field) is read
// on every index build: it must not allocate.
func TestExportedWithoutTimeDoesNotAllocate(t *testing.T) {
	s := &Service{}
	if n := testing.AllocsPerRun(100, func() { _ = s.Exported() }); n != 0 {
		t.Fatalf("Exported() of an entry without exportedAt: %v allocations, want 0", n)
	}
	at := "2026-11-26T10:00:00Z"
	if got := (&Service{ExportedAt: at}).Exported(); got.Format(time.RFC3339) != at {
		t.Fatalf("Exported() = %v, want %s", got, at)
	}
}

// Every record of an exporting Pod holds its export entries: the entry keeps
// its size class (224 bytes) with IPFamilies, and the families still cross
// as a list, in order.
func TestIPFamiliesCostNothing(t *testing.T) {
	if n := unsafe.Sizeof(Export{}); n > 224 {
		t.Errorf("an Export is %d bytes, want at most 224 (its size class)", n)
	}
	for _, fams := range [][]string{nil, {IPv4}, {IPv6}, {IPv4, IPv6}, {IPv6, IPv4}} {
		b, err := json.Marshal(Service{IPFamilies: NewIPFamilies(fams...)})
		if err != nil {
			t.Fatal(err)
		}
		var back struct {
			IPFamilies []string `json:"ipFamilies"`
		}
		if err := json.Unmarshal(b, &back); err != nil || !slices.Equal(back.IPFamilies, fams) {
			t.Errorf("%v: written as %s (%v)", fams, b, err)
		}
	}
}
