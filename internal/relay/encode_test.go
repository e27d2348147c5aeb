package relay

import (
	"crypto/ed25519"
	"net/netip"
	"strings"
	"testing"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

const exportWeb = `{"services":[{"name":"web","ports":[{"port":80}]}]}`

func proofRec(name string, ready bool, proof *store.Proof, ips ...string) *store.Pod {
	p := &store.Pod{Common: &store.Common{Cluster: "origin", Namespace: "ns", Proof: proof}, Name: name, Ready: ready}
	for _, ip := range ips {
		p.IPs = append(p.IPs, netip.MustParseAddr(ip))
	}
	return p
}

func TestEncode(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	signedStmt := annotation.FormatEndpoint(annotation.Endpoint{IPs: []string{"10.0.0.2"}, Ready: true, Seq: 42})
	signed := &store.Proof{UID: "uid-b", Export: exportWeb, Endpoint: signedStmt,
		EndpointSignature: annotation.SignEndpoint(key, "origin", "ns", "b", "uid-b", exportWeb, signedStmt)}
	other := `{"services":[{"name":"api","ports":[{"port":81}]}]} <&>`
	for _, tc := range []struct {
		name        string
		pods        []*store.Pod
		wantExports []string
		wantPods    []Pod
		wantSkipped int
	}{
		{
			name: "exports listed once, in the order of the Pods by name",
			pods: []*store.Pod{
				proofRec("c", true, &store.Proof{UID: "uid-c", Export: other, Endpoint: `{"seq":3}`, EndpointSignature: "ed25519:x"}, "10.0.0.3"),
				proofRec("a", true, &store.Proof{UID: "uid-a", Export: strings.Clone(exportWeb), Endpoint: `{"seq":1}`, EndpointSignature: "ed25519:y"}, "10.0.0.1"),
				proofRec("b", true, signed, "10.0.0.2"),
			},
			wantExports: []string{exportWeb, other},
			wantPods: []Pod{
				{Name: "a", UID: "uid-a", Export: 0, Endpoint: `{"seq":1}`, Signature: "ed25519:y"},
				{Name: "b", UID: "uid-b", Export: 0, Endpoint: signedStmt, Signature: signed.EndpointSignature},
				{Name: "c", UID: "uid-c", Export: 1, Endpoint: `{"seq":3}`, Signature: "ed25519:x"},
			},
		},
		{
			name: "no statement: one from the record, unsigned, two addresses at most",
			pods: []*store.Pod{
				func() *store.Pod {
					p := proofRec("d", false, &store.Proof{UID: "uid-d", Export: exportWeb}, "10.0.0.4", "fd00::4", "10.0.0.5")
					p.Hostname = "web-0"
					return p
				}(),
				proofRec("e", true, &store.Proof{UID: "uid-e", Export: exportWeb}, "10.0.0.6"),
			},
			wantExports: []string{exportWeb},
			wantPods: []Pod{
				{Name: "d", UID: "uid-d", Endpoint: `{"ips":["10.0.0.4","fd00::4"],"hostname":"web-0","seq":1}`},
				{Name: "e", UID: "uid-e", Endpoint: `{"ips":["10.0.0.6"],"ready":true,"seq":1}`},
			},
		},
		{
			name:        "records without proof and names twice left out",
			pods:        []*store.Pod{proofRec("f", true, nil, "10.0.0.7"), proofRec("b", true, signed, "10.0.0.2"), proofRec("b", true, signed, "10.0.0.2")},
			wantExports: []string{exportWeb},
			wantPods:    []Pod{{Name: "b", UID: "uid-b", Endpoint: signedStmt, Signature: signed.EndpointSignature}},
			wantSkipped: 2,
		},
		{name: "none", wantExports: []string{}, wantPods: []Pod{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			value, fits, skipped := Annotation(tc.pods)
			if !fits || skipped != tc.wantSkipped {
				t.Fatalf("fits %v, skipped %d (want %d)", fits, skipped, tc.wantSkipped)
			}
			s, err := Parse(value) // what a reader gets
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(s.Exports, "|") != strings.Join(tc.wantExports, "|") {
				t.Errorf("exports %q, want %q", s.Exports, tc.wantExports)
			}
			if len(s.Pods) != len(tc.wantPods) {
				t.Fatalf("pods %+v, want %+v", s.Pods, tc.wantPods)
			}
			for i, p := range s.Pods {
				if p != tc.wantPods[i] {
					t.Errorf("pod %d: %+v, want %+v", i, p, tc.wantPods[i])
				}
				if _, _, err := annotation.ParseEndpoint(p.Endpoint); err != nil {
					t.Errorf("pod %s: statement %q does not parse: %v", p.Name, p.Endpoint, err)
				}
				// Only the origin's own statement verifies.
				_, ok := annotation.VerifyEndpoint(pub, p.Signature, "origin", "ns", p.Name, p.UID, s.Exports[p.Export], p.Endpoint)
				if want := p.Name == "b"; ok != want {
					t.Errorf("pod %s: verifies %v, want %v", p.Name, ok, want)
				}
			}
		})
	}
}

// The bound: one record fits whatever its bytes (within what a source
// keeps), and a slice of too many does not, so that the hub splits it.
func TestAnnotationBound(t *testing.T) {
	worst := func(name string) *store.Pod {
		return proofRec(name, true, &store.Proof{
			UID:               strings.Repeat("u", 36),
			Export:            strings.Repeat(`"\`, annotation.MaxBytes/2) + name, // every byte escaped
			Endpoint:          strings.Repeat(`"`, annotation.MaxEndpointBytes),
			EndpointSignature: strings.Repeat(`\`, 256),
		}, "10.0.0.1")
	}
	value, fits, _ := Annotation([]*store.Pod{worst("a")})
	if !fits {
		t.Fatalf("one record of the largest kept bytes does not fit: %d bytes", len(value))
	}
	var many []*store.Pod
	for _, n := range []string{"a", "b", "c", "d"} {
		many = append(many, worst(n))
	}
	if value, fits, _ := Annotation(many); fits || len(value) <= MaxSliceBytes {
		t.Fatalf("four records of distinct large exports fit in %d bytes", len(value))
	}
	// The same four with one export: listed once, they fit.
	for _, p := range many {
		p.Proof.Export = many[0].Proof.Export
	}
	if value, fits, _ := Annotation(many); !fits {
		t.Fatalf("four records of one export do not fit: %d bytes", len(value))
	}
}

// The origins' bytes cross the wire as they are: no \u003c for <, > and &.
func TestFormatKeepsBytes(t *testing.T) {
	raw := `{"services":[{"name":"web","annotations":{"a":"<b>&</b>"}}]}`
	value := Format(Slice{Exports: []string{raw}, Pods: []Pod{}})
	if !strings.Contains(value, `<b>&</b>`) {
		t.Errorf("annotation %s escapes the origin's bytes", value)
	}
	if s, err := Parse(value); err != nil || s.Exports[0] != raw {
		t.Errorf("round trip: %q, %v", s.Exports, err)
	}
}
