package snapshot

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// A record round-trips in the smallest form that holds it; older forms
// still read; damaged records are refused.
func TestPodCodec(t *testing.T) {
	a := pod("edge-a", "default", "a", "web-0", true, []string{"10.0.0.1", "fd00::1"}, export("backend", httpPort))
	b, err := EncodePod(a)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodePod(b)
	if err != nil || !back.Equal(a) {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	if b[0] != 'b' {
		t.Errorf("written as %q, want the binary form", b[0])
	}
	// Allowed namespaces make a 'c' record, read back whole.
	c := pod("edge-a", "default", "c", "", true, []string{"10.0.0.3"}, annotation.Export{Name: "backend", Allowed: []string{"api", "web"}, Ports: []annotation.Port{httpPort}})
	if cb, err := EncodePod(c); err != nil || cb[0] != 'c' {
		t.Fatalf("allowed namespaces: %q, %v", cb, err)
	} else if back, err := DecodePod(cb); err != nil || !back.Equal(c) || !slices.Equal(back.Exports[0].Allowed, []string{"api", "web"}) {
		t.Fatalf("allowed namespaces round trip: %+v, %v", back, err)
	}
	// Records written as JSON (the first format) still read.
	legacy := []byte(`j{"c":"edge-a","ns":"default","n":"a","h":"web-0","ips":["10.0.0.1","fd00::1"],"r":true,` +
		`"e":[{"name":"backend","namespace":"default","cluster":"edge-a","ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}]}]}`)
	if back, err := DecodePod(legacy); err != nil || !back.Equal(a) {
		t.Fatalf("legacy JSON: %+v, %v", back, err)
	}
	bad := [][]byte{nil, []byte("x{}"), []byte("j{"), []byte(`j{"c":"edge-a"}`), []byte("j[]"),
		[]byte(`j{"n":"p","r":true}`), // no cluster or namespace at all: no Common
		b[:len(b)/2], append(append([]byte(nil), b...), 0), []byte("b\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")}
	for _, x := range bad {
		if _, err := DecodePod(x); err == nil {
			t.Errorf("DecodePod(%q) accepted", x)
		}
	}
	if _, err := EncodePod(&store.Pod{Common: &store.Common{Cluster: "a", Namespace: "b", Exports: []annotation.Export{{Name: "s", Ports: []annotation.Port{{Port: 1, Protocol: "ICMP"}}}}}, Name: "c"}); err == nil {
		t.Error("EncodePod accepted an unknown protocol")
	}
}

// A PodDecoder shares one Common among records that repeat the cluster,
// namespace and exports, and decodes exactly what DecodePod decodes.
func TestDecoderShares(t *testing.T) {
	a := pod("edge-a", "default", "a", "web-0", true, []string{"10.0.0.1", "fd00::1"}, export("backend", httpPort))
	b := pod("edge-a", "default", "b", "", true, []string{"10.0.0.2"}, export("backend", httpPort))
	c := pod("edge-a", "default", "c", "", false, []string{"10.0.0.3"}, export("frontend", httpPort))
	// d's exports encode as b's, but d runs in another namespace.
	d := pod("edge-a", "other", "d", "", true, []string{"10.0.0.4"}, annotation.Export{Name: "backend", Namespace: "default", Ports: []annotation.Port{httpPort}})
	dec := NewPodDecoder()
	var got []*store.Pod
	for _, p := range []*store.Pod{a, b, c, d} {
		raw, err := EncodePod(p)
		if err != nil {
			t.Fatal(err)
		}
		plain, err := DecodePod(raw)
		if err != nil {
			t.Fatal(err)
		}
		shared, err := dec.Decode(raw)
		if err != nil || !shared.Equal(plain) || !shared.Equal(p) {
			t.Fatalf("%s: shared %+v, plain %+v, %v", p.Name, shared, plain, err)
		}
		got = append(got, shared)
	}
	if got[0].Common != got[1].Common {
		t.Error("two records with the same cluster, namespace and exports do not share them")
	}
	if got[1].Common == got[2].Common {
		t.Error("different exports shared")
	}
	if got[1].Common == got[3].Common || got[3].Namespace != "other" {
		t.Errorf("records of two namespaces share one Common (%q)", got[3].Namespace)
	}
	if unsafe.StringData(got[0].Namespace) != unsafe.StringData(got[2].Namespace) {
		t.Error("namespace not shared")
	}
	// A damaged record after good ones is still refused, and shares nothing.
	raw, _ := EncodePod(a)
	if _, err := dec.Decode(raw[:len(raw)-1]); err == nil {
		t.Error("truncated record accepted")
	}
	if _, err := dec.Decode(append(raw[:len(raw):len(raw)], 0)); err == nil {
		t.Error("record with trailing data accepted")
	}
}

// Past maxShared distinct values a PodDecoder copies instead of remembering:
// its maps stay bounded, and every record still decodes correctly.
func TestDecoderBounded(t *testing.T) {
	dec := NewPodDecoder()
	for i := range maxShared + 100 {
		p := pod("edge-a", fmt.Sprintf("ns-%d", i), "p", "", true, []string{"10.0.0.1"}, export(fmt.Sprintf("s-%d", i), httpPort))
		raw, _ := EncodePod(p)
		back, err := dec.Decode(raw)
		if err != nil || !back.Equal(p) {
			t.Fatalf("record %d: %+v, %v", i, back, err)
		}
	}
	if len(dec.strings) > maxShared || len(dec.commons) > maxShared {
		t.Fatalf("maps grew past the bound: %d strings, %d commons", len(dec.strings), len(dec.commons))
	}
}

// Records cut from a PodDecoder's chunks stay what they were decoded as while
// more records fill the chunks and start new ones: names and addresses of all
// lengths (some names near the limit, some records with more addresses than
// a chunk hands out), damaged records in between, and no record's addresses can be
// appended to in place. The same with chunks sized for fewer records than
// it decodes, and fewer than some records' addresses (NewPodDecoderFor).
func TestDecoderChunks(t *testing.T) {
	for _, hint := range []int{chunkRecords, 7} {
		t.Run(fmt.Sprintf("chunk=%d", hint), func(t *testing.T) { testDecoderChunks(t, NewPodDecoderFor(hint)) })
	}
}

func testDecoderChunks(t *testing.T, dec *PodDecoder) {
	rng := rand.New(rand.NewPCG(3, 4))
	var want, got []*store.Pod
	for i := range 5 * chunkRecords {
		name := fmt.Sprintf("p-%d-", i) + strings.Repeat("x", rng.IntN(40))
		if i%97 == 0 {
			name += strings.Repeat("y", 960) // near the longest a record may hold
		}
		host := ""
		if i%3 == 0 {
			host = fmt.Sprintf("host-%d", i)
		}
		var ips []string
		n := rng.IntN(4)
		if i%89 == 0 {
			n = chunkRecords/4 + 1 // more than a chunk hands out
		}
		for j := range n {
			if j%2 == 0 {
				ips = append(ips, fmt.Sprintf("10.%d.%d.%d", i>>8&255, i&255, j))
			} else {
				ips = append(ips, fmt.Sprintf("fd00::%x:%x", i, j))
			}
		}
		p := pod("edge-a", "default", name, host, i%5 != 0, ips, export("backend", httpPort))
		raw, err := EncodePod(p)
		if err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 { // a damaged record first: refused, and it harms no other
			if _, err := dec.Decode(raw[:len(raw)-3]); err == nil {
				t.Fatalf("record %d: truncated record accepted", i)
			}
		}
		back, err := dec.Decode(raw)
		if err != nil || !back.Equal(p) {
			t.Fatalf("record %d: %+v, %v", i, back, err)
		}
		want, got = append(want, p), append(got, back)
	}
	for i, p := range got {
		if !p.Equal(want[i]) {
			t.Fatalf("record %d changed after later records were decoded: %+v, want %+v", i, p, want[i])
		}
		if cap(p.IPs) != len(p.IPs) {
			t.Fatalf("record %d: %d addresses with room for %d: an append would write into another record's", i, len(p.IPs), cap(p.IPs))
		}
	}
}

// A PodDecoder for a small cluster cuts its records from a chunk of that
// many (an edge's snapshot holds a thousand origins of a few dozen records:
// a whole chunk each was 30 KB per origin, held while its records live).
func TestDecoderForSmallCluster(t *testing.T) {
	dec := NewPodDecoderFor(30)
	for i := range 30 {
		raw, err := EncodePod(pod("edge-a", "default", fmt.Sprintf("p-%d", i), "", true, []string{fmt.Sprintf("10.0.0.%d", i)}, export("backend", httpPort)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dec.Decode(raw); err != nil {
			t.Fatal(err)
		}
	}
	if len(dec.pods) != 0 || len(dec.addrs) != 0 || cap(dec.text) > 24*30 {
		t.Fatalf("after 30 records: room left for %d records, %d addresses, %d bytes of names (of %d): want a chunk of 30",
			len(dec.pods), len(dec.addrs), cap(dec.text)-len(dec.text), cap(dec.text))
	}
}

// FuzzDecodePod: no input panics or allocates without bound, and whatever
// decodes encodes back to a record that decodes the same.
func FuzzDecodePod(f *testing.F) {
	for _, p := range benchPods(3, 1, 1) {
		b, _ := EncodePod(p)
		f.Add(b)
	}
	withAllowed := pod("edge-a", "default", "c", "", true, []string{"10.0.0.3"}, annotation.Export{Name: "backend", Allowed: []string{"web"}, Ports: []annotation.Port{httpPort}})
	if b, err := EncodePod(withAllowed); err == nil {
		f.Add(b)
	}
	if b, err := EncodePod(servicePod("web-0", "10.0.0.1")); err == nil {
		f.Add(b) // a 'd' record
	}
	withStale := servicePod("web-0", "10.0.0.1")
	withStale.Exports[0].StaleEndpoints, withStale.Exports[0].StaleGraceSeconds = annotation.StaleDropIfLocal, 30
	if b, err := EncodePod(withStale); err == nil {
		f.Add(b) // an 'e' record
	}
	f.Add([]byte(`j{"c":"a","ns":"b","n":"c"}`))
	f.Add([]byte("b"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodePod(b)
		if err != nil {
			return
		}
		again, err := EncodePod(p)
		if err != nil {
			return // JSON records may carry protocols the binary form refuses
		}
		q, err := DecodePod(again)
		if err != nil || !q.Equal(p) {
			t.Fatalf("round trip: %+v -> %+v, %v", p, q, err)
		}
	})
}
