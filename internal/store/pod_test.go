package store

import (
	"net/netip"
	"testing"
	"unsafe"
)

// A relay hub passes a record's proof on: a change of the proof alone (a new
// endpoint statement, a new signature) is a change of the record, so that
// the hub writes it.
func TestPodEqualProof(t *testing.T) {
	rec := func(proof *Proof) *Pod {
		return &Pod{Common: &Common{Cluster: "a", Namespace: "ns", Proof: proof}, Name: "p", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Ready: true}
	}
	proof := Proof{UID: "u1", Export: `[{"name":"web"}]`, Endpoint: `{"seq":1}`, EndpointSignature: "ed25519:x"}
	with := func(f func(*Proof)) *Proof { p := proof; f(&p); return &p }
	for _, tc := range []struct {
		name string
		a, b *Proof
		want bool
	}{
		{"both nil", nil, nil, true},
		{"nil and set", nil, &proof, false},
		{"set and nil", &proof, nil, false},
		{"same bytes", &proof, with(func(*Proof) {}), true},
		{"uid", &proof, with(func(p *Proof) { p.UID = "u2" }), false},
		{"export", &proof, with(func(p *Proof) { p.Export = `[{"name":"api"}]` }), false},
		{"statement", &proof, with(func(p *Proof) { p.Endpoint = `{"seq":2}` }), false},
		{"signature", &proof, with(func(p *Proof) { p.EndpointSignature = "ed25519:y" }), false},
	} {
		if got := rec(tc.a).Equal(rec(tc.b)); got != tc.want {
			t.Errorf("%s: Equal = %v, want %v", tc.name, got, tc.want)
		}
	}
	// The store hands on a record whose proof alone changed.
	s := New()
	var changes []Change
	s.Subscribe(func(cs []Change) { changes = append(changes, cs...) })
	s.Upsert(rec(&proof))
	s.Upsert(rec(with(func(*Proof) {})))
	s.Upsert(rec(with(func(p *Proof) { p.Endpoint = `{"seq":2}` })))
	if len(changes) != 2 {
		t.Fatalf("%d changes, want 2 (the first record and the new statement): %v", len(changes), changes)
	}
}

// The proof costs an edge nothing per record: Pod keeps its 72 bytes, and
// Common stays in the 64-byte size class it was allocated in.
func TestProofCostsNoRecordBytes(t *testing.T) {
	if n := unsafe.Sizeof(Pod{}); n != 72 {
		t.Errorf("store.Pod is %d bytes, want 72 (the snapshot decoder cuts records from chunks: each byte counts)", n)
	}
	if n := unsafe.Sizeof(Common{}); n > 64 {
		t.Errorf("store.Common is %d bytes, over the 64-byte size class", n)
	}
}
