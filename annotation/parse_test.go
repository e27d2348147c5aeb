package annotation

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseExports(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    []Export
		reasons []Reason
	}{
		{
			name: "spec example",
			raw: `{"services":[{"name":"backend","namespace":"default","cluster":"cluster-a",
			  "ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}]}]}`,
			want: []Export{{Name: "backend", Namespace: "default", Cluster: "cluster-a",
				Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: TCP}}}},
		},
		{
			name: "defaults: namespace, cluster, protocol, targetPort",
			raw:  `{"services":[{"name":"backend","ports":[{"name":"dns","port":53,"protocol":"UDP"},{"port":9000}]}]}`,
			want: []Export{{Name: "backend", Namespace: "default", Cluster: "cluster-a",
				Ports: []Port{{Name: "dns", Port: 53, TargetPort: 53, Protocol: UDP}, {Port: 9000, TargetPort: 9000, Protocol: TCP}}}},
		},
		{
			name: "one Pod backs several services; no ports is fine",
			raw:  `{"services":[{"name":"a"},{"name":"b","ports":[{"name":"grpc","port":9090,"protocol":"SCTP"}]}]}`,
			want: []Export{{Name: "a", Namespace: "default", Cluster: "cluster-a"},
				{Name: "b", Namespace: "default", Cluster: "cluster-a", Ports: []Port{{Name: "grpc", Port: 9090, TargetPort: 9090, Protocol: SCTP}}}},
		},
		{name: "empty list", raw: `{"services":[]}`, want: []Export{}},
		{name: "no services key", raw: `{}`, want: []Export{}},
		{name: "not JSON", raw: `{"services":[`, reasons: []Reason{ReasonJSON}},
		{name: "trailing data", raw: `{"services":[]} {}`, reasons: []Reason{ReasonJSON}},
		{name: "a closing brace after", raw: `{"services":[]}}`, reasons: []Reason{ReasonJSON}},
		{name: "a closing bracket after", raw: `{"services":[]}]`, reasons: []Reason{ReasonJSON}},
		{name: "trailing whitespace", raw: "{\"services\":[]} \n", want: []Export{}},
		{name: "wrong envelope type", raw: `{"services":{"name":"a"}}`, reasons: []Reason{ReasonJSON}},
		{name: "oversized", raw: `{"services":[],"pad":"` + strings.Repeat("x", MaxBytes) + `"}`, reasons: []Reason{ReasonSize}},
		{name: "too many entries", raw: `{"services":[` + strings.TrimSuffix(strings.Repeat(`{"name":"a"},`, MaxServices+1), ",") + `]}`, reasons: []Reason{ReasonTooMany}},
		{
			name:    "bad entry beside good ones",
			raw:     `{"services":[{"name":"good"},{"name":"Bad_Name"},{"name":7},{"name":"also-good"}]}`,
			want:    []Export{{Name: "good", Namespace: "default", Cluster: "cluster-a"}, {Name: "also-good", Namespace: "default", Cluster: "cluster-a"}},
			reasons: []Reason{ReasonName, ReasonJSON},
		},
		{name: "hostile name", raw: `{"services":[{"name":"a.b.c"}]}`, reasons: []Reason{ReasonName}},
		{name: "name too long", raw: `{"services":[{"name":"` + strings.Repeat("a", 64) + `"}]}`, reasons: []Reason{ReasonName}},
		{name: "bad namespace", raw: `{"services":[{"name":"a","namespace":"UPPER"}]}`, reasons: []Reason{ReasonNamespace}},
		{name: "other namespace", raw: `{"services":[{"name":"a","namespace":"kube-system"}]}`, reasons: []Reason{ReasonNamespaceOutside}},
		{name: "other cluster", raw: `{"services":[{"name":"a","cluster":"cluster-b"}]}`, reasons: []Reason{ReasonClusterOutside}},
		{name: "bad cluster", raw: `{"services":[{"name":"a","cluster":"-x-"}]}`, reasons: []Reason{ReasonCluster}},
		{name: "cluster too long", raw: `{"services":[{"name":"a","cluster":"` + strings.Repeat("a", 128) + `"}]}`, reasons: []Reason{ReasonCluster}},
		{name: "port zero", raw: `{"services":[{"name":"a","ports":[{"port":0}]}]}`, reasons: []Reason{ReasonPort}},
		{name: "port too big", raw: `{"services":[{"name":"a","ports":[{"port":65536}]}]}`, reasons: []Reason{ReasonPort}},
		{name: "port beyond int32", raw: `{"services":[{"name":"a","ports":[{"port":4294967377}]}]}`, reasons: []Reason{ReasonPort}},
		{name: "negative targetPort", raw: `{"services":[{"name":"a","ports":[{"port":80,"targetPort":-1}]}]}`, reasons: []Reason{ReasonPort}},
		{name: "string targetPort", raw: `{"services":[{"name":"a","ports":[{"port":80,"targetPort":"http"}]}]}`, reasons: []Reason{ReasonJSON}},
		{name: "bad protocol", raw: `{"services":[{"name":"a","ports":[{"port":80,"protocol":"tcp"}]}]}`, reasons: []Reason{ReasonProtocol}},
		// A bad port name is dropped, not the entry (an older annotator may
		// have written it): the port stays, unnamed, so A answers go on.
		{name: "bad port name", raw: `{"services":[{"name":"a","ports":[{"name":"_http","port":80}]}]}`,
			want: []Export{{Name: "a", Namespace: "default", Cluster: "cluster-a", Ports: []Port{{Port: 80, TargetPort: 80, Protocol: TCP}}}}, reasons: []Reason{ReasonPortName}},
		// Access decided by the exporter: namespaces, or "*"; normalised.
		{name: "allowed namespaces", raw: `{"services":[{"name":"a","allowedNamespaces":["web","api","web"]},{"name":"b","allowedNamespaces":["web","*"]},{"name":"c","allowedNamespaces":[]}]}`,
			want: []Export{{Name: "a", Namespace: "default", Cluster: "cluster-a", Allowed: []string{"api", "web"}},
				{Name: "b", Namespace: "default", Cluster: "cluster-a", Allowed: []string{"*"}},
				{Name: "c", Namespace: "default", Cluster: "cluster-a"}}},
		{name: "bad allowed namespace", raw: `{"services":[{"name":"a","allowedNamespaces":["Web_"]},{"name":"b","allowedNamespaces":"web"}]}`, reasons: []Reason{ReasonNamespace, ReasonJSON}},
		{name: "too many allowed namespaces", raw: `{"services":[{"name":"a","allowedNamespaces":[` + strings.TrimSuffix(strings.Repeat(`"x",`, MaxAllowed+1), ",") + `]}]}`, reasons: []Reason{ReasonNamespace}},
		// IANA service names (RFC 6335), as Kubernetes checks container port names.
		{name: "numeric port name", raw: `{"services":[{"name":"a","ports":[{"name":"123","port":80}]}]}`,
			want: []Export{{Name: "a", Namespace: "default", Cluster: "cluster-a", Ports: []Port{{Port: 80, TargetPort: 80, Protocol: TCP}}}}, reasons: []Reason{ReasonPortName}},
		{name: "port name over 15", raw: `{"services":[{"name":"a","ports":[{"name":"abcdefghijklmnop","port":80},{"name":"http","port":81}]}]}`,
			want: []Export{{Name: "a", Namespace: "default", Cluster: "cluster-a", Ports: []Port{
				{Port: 80, TargetPort: 80, Protocol: TCP}, {Name: "http", Port: 81, TargetPort: 81, Protocol: TCP}}}}, reasons: []Reason{ReasonPortName}},
		{name: "two bad port names", raw: `{"services":[{"name":"a","ports":[{"name":"a--b","port":80},{"name":"a--b","port":81}]}]}`,
			want: []Export{{Name: "a", Namespace: "default", Cluster: "cluster-a", Ports: []Port{
				{Port: 80, TargetPort: 80, Protocol: TCP}, {Port: 81, TargetPort: 81, Protocol: TCP}}}}, reasons: []Reason{ReasonPortName, ReasonPortName}},
		{name: "bad port name and a bad port", raw: `{"services":[{"name":"a","ports":[{"name":"123","port":80},{"port":0}]}]}`, reasons: []Reason{ReasonPort}},
		{name: "port name of 15", raw: `{"services":[{"name":"a","ports":[{"name":"abcdefghijklmno","port":80},{"name":"h2c","port":81}]}]}`,
			want: []Export{{Name: "a", Namespace: "default", Cluster: "cluster-a", Ports: []Port{
				{Name: "abcdefghijklmno", Port: 80, TargetPort: 80, Protocol: TCP}, {Name: "h2c", Port: 81, TargetPort: 81, Protocol: TCP}}}}},
		{name: "duplicate port name", raw: `{"services":[{"name":"a","ports":[{"name":"p","port":80},{"name":"p","port":81}]}]}`, reasons: []Reason{ReasonDuplicate}},
		{name: "duplicate port number", raw: `{"services":[{"name":"a","ports":[{"port":80},{"port":80}]}]}`, reasons: []Reason{ReasonDuplicate}},
		{
			name:    "same port number, other protocol",
			raw:     `{"services":[{"name":"a","ports":[{"port":53},{"port":53,"protocol":"UDP"}]}]}`,
			want:    []Export{{Name: "a", Namespace: "default", Cluster: "cluster-a", Ports: []Port{{Port: 53, TargetPort: 53, Protocol: TCP}, {Port: 53, TargetPort: 53, Protocol: UDP}}}},
			reasons: nil,
		},
		{
			name:    "duplicate service",
			raw:     `{"services":[{"name":"a"},{"name":"a","namespace":"default"}]}`,
			want:    []Export{{Name: "a", Namespace: "default", Cluster: "cluster-a"}},
			reasons: []Reason{ReasonDuplicate},
		},
		{name: "null entry", raw: `{"services":[null]}`, reasons: []Reason{ReasonName}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, rej := ParseExports(tc.raw, "default", "cluster-a")
			if tc.want != nil && !reflect.DeepEqual(got, tc.want) {
				t.Errorf("exports:\n got %+v\nwant %+v", got, tc.want)
			}
			if tc.want == nil && len(got) != 0 {
				t.Errorf("exports: got %+v, want none", got)
			}
			if g := reasons(rej); !reflect.DeepEqual(g, tc.reasons) {
				t.Errorf("reasons: got %v, want %v (%v)", g, tc.reasons, rej)
			}
			for _, r := range rej {
				if r.Detail == "" || len(r.String()) > 400 {
					t.Errorf("rejection detail is empty or unbounded: %q", r.String())
				}
			}
		})
	}
}

func TestParseImports(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    []Import
		reasons []Reason
	}{
		{
			name: "spec example",
			raw:  `{"services":[{"name":"backend","namespace":"default","cluster":"cluster-a","alias":"backend"},{"name":"database-service"}]}`,
			want: []Import{{Name: "backend", Namespace: "default", Cluster: "cluster-a", Alias: "backend"}, {Name: "database-service", Namespace: "web"}},
		},
		{
			name: "other namespace is allowed for imports",
			raw:  `{"services":[{"name":"db","namespace":"data","alias":"db"}]}`,
			want: []Import{{Name: "db", Namespace: "data", Alias: "db"}},
		},
		{name: "bad alias", raw: `{"services":[{"name":"db","alias":"a.b"}]}`, reasons: []Reason{ReasonName}},
		{name: "duplicate alias", raw: `{"services":[{"name":"db","alias":"x"},{"name":"cache","alias":"x"}]}`,
			want: []Import{{Name: "db", Namespace: "web", Alias: "x"}}, reasons: []Reason{ReasonDuplicate}},
		{name: "duplicate import", raw: `{"services":[{"name":"db"},{"name":"db","namespace":"web"}]}`,
			want: []Import{{Name: "db", Namespace: "web"}}, reasons: []Reason{ReasonDuplicate}},
		{name: "bad cluster", raw: `{"services":[{"name":"db","cluster":"A B"}]}`, reasons: []Reason{ReasonCluster}},
		{name: "not JSON", raw: `nope`, reasons: []Reason{ReasonJSON}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, rej := ParseImports(tc.raw, "web")
			if tc.want != nil && !reflect.DeepEqual(got, tc.want) {
				t.Errorf("imports:\n got %+v\nwant %+v", got, tc.want)
			}
			if tc.want == nil && len(got) != 0 {
				t.Errorf("imports: got %+v, want none", got)
			}
			if g := reasons(rej); !reflect.DeepEqual(g, tc.reasons) {
				t.Errorf("reasons: got %v, want %v (%v)", g, tc.reasons, rej)
			}
		})
	}
}

func TestRejectionString(t *testing.T) {
	if got := (Rejection{Index: -1, Reason: ReasonSize, Detail: "big"}).String(); got != "size: big" {
		t.Errorf("got %q", got)
	}
	if got := (Rejection{Index: 3, Reason: ReasonJSON, Detail: "bad"}).String(); got != "entry 3: json: bad" {
		t.Errorf("got %q", got)
	}
}

func reasons(rej []Rejection) []Reason {
	var out []Reason
	for _, r := range rej {
		out = append(out, r.Reason)
	}
	return out
}

// FuzzParseExports checks that no input panics, that accepted entries obey
// every rule, and that output stays bounded by the input limits.
func FuzzParseExports(f *testing.F) {
	for _, s := range []string{
		`{"services":[{"name":"backend","namespace":"default","cluster":"cluster-a","ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}]}]}`,
		`{"services":[{"name":"a"},{"name":"b","ports":[{"port":53,"protocol":"UDP"}]}]}`,
		`{"services":[{"name":"x","namespace":"kube-system"}]}`,
		`{"services":[{"name":"x","cluster":"evil"}]}`,
		`{"services":[null,1,"s",[],{}]}`,
		`{"services":[{"name":"a","ports":[{"port":1e99}]}]}`,
		`{"services":[{"name":"\u0000"}]}`,
		`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[`,
		``,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, rej := ParseExports(raw, "default", "cluster-a")
		if len(got)+len(rej) > MaxServices+1 {
			t.Fatalf("%d results for one annotation", len(got)+len(rej))
		}
		for _, e := range got {
			if e.Namespace != "default" || e.Cluster != "cluster-a" {
				t.Fatalf("accepted foreign entry %+v", e)
			}
			if !ValidClusterID(e.Cluster) || len(e.Name) == 0 || len(e.Name) > 63 || strings.ContainsAny(e.Name, "._ ") {
				t.Fatalf("accepted invalid entry %+v", e)
			}
			for _, p := range e.Ports {
				if p.Port < 1 || p.TargetPort < 1 || (p.Protocol != TCP && p.Protocol != UDP && p.Protocol != SCTP) {
					t.Fatalf("accepted invalid port %+v", p)
				}
			}
		}
	})
}

func FuzzParseImports(f *testing.F) {
	f.Add(`{"services":[{"name":"backend","namespace":"default","cluster":"cluster-a","alias":"backend"},{"name":"database-service"}]}`)
	f.Add(`{"services":[{"name":"a","alias":"A"}]}`)
	f.Fuzz(func(t *testing.T, raw string) {
		got, rej := ParseImports(raw, "web")
		if len(got)+len(rej) > MaxServices+1 {
			t.Fatalf("%d results for one annotation", len(got)+len(rej))
		}
		for _, i := range got {
			if strings.ContainsAny(i.Alias+i.Name, "._ ") {
				t.Fatalf("accepted invalid import %+v", i)
			}
		}
	})
}
