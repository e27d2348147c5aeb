package table

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// A Decoder shares one Common among records that repeat the cluster,
// namespace and exports, and decodes exactly what DecodePod decodes.
func TestDecoderShares(t *testing.T) {
	a := pod("edge-a", "default", "a", "web-0", true, []string{"10.0.0.1", "fd00::1"}, export("backend", httpPort))
	b := pod("edge-a", "default", "b", "", true, []string{"10.0.0.2"}, export("backend", httpPort))
	c := pod("edge-a", "default", "c", "", false, []string{"10.0.0.3"}, export("frontend", httpPort))
	// d's exports encode as b's, but d runs in another namespace.
	d := pod("edge-a", "other", "d", "", true, []string{"10.0.0.4"}, annotation.Export{Name: "backend", Namespace: "default", Ports: []annotation.Port{httpPort}})
	dec := NewDecoder()
	var got []*Pod
	for _, p := range []*Pod{a, b, c, d} {
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

// Past maxShared distinct values a Decoder copies instead of remembering:
// its maps stay bounded, and every record still decodes correctly.
func TestDecoderBounded(t *testing.T) {
	dec := NewDecoder()
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

// Records cut from a Decoder's chunks stay what they were decoded as while
// more records fill the chunks and start new ones: names and addresses of all
// lengths (some names near the limit, some records with more addresses than
// a chunk hands out), damaged records in between, and no record's addresses can be
// appended to in place.
func TestDecoderChunks(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	dec := NewDecoder()
	var want, got []*Pod
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

// Any sequence of upserts, deletes and replacements leaves the incremental
// index answering exactly as an index built from scratch from the same
// records.
func TestIncrementalMatchesFresh(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tb := New(cfg())
	clusters := []string{"edge-a", "edge-b"}
	random := func(cluster string, i int) *Pod {
		var ex []annotation.Export
		for s := range 3 {
			if rng.IntN(2) == 0 {
				ex = append(ex, export(fmt.Sprintf("svc-%d", s), httpPort))
			}
		}
		ip := netip.AddrFrom4([4]byte{10, byte(rng.IntN(2)), 0, byte(rng.IntN(4))})
		return pod(cluster, "default", fmt.Sprintf("p-%d", i), "", rng.IntN(4) != 0, []string{ip.String()}, ex...)
	}
	for step := range 2000 {
		c := clusters[rng.IntN(2)]
		switch r := rng.IntN(20); {
		case r == 0:
			var ps []*Pod
			for i := range rng.IntN(6) {
				ps = append(ps, random(c, i))
			}
			tb.ReplaceCluster(c, ps)
		case r < 6:
			tb.Delete(Key{c, "default", fmt.Sprintf("p-%d", rng.IntN(6))})
		default:
			tb.Upsert(random(c, rng.IntN(6)))
		}
		if step%7 != 0 {
			continue
		}
		got := tb.Rebuild()
		fresh := New(cfg())
		for _, c := range clusters {
			fresh.ReplaceCluster(c, tb.Pods(c))
		}
		want := fresh.Rebuild()
		for s := range 3 {
			for _, q := range []string{fmt.Sprintf("svc-%d.default.svc.%s", s, zone), fmt.Sprintf("_http._tcp.svc-%d.default.svc.%s", s, zone)} {
				for _, qt := range []uint16{dns.TypeA, dns.TypeSRV} {
					g, w := got.Lookup(q, qt), want.Lookup(q, qt)
					if g.Kind != w.Kind || !slices.Equal(addrs(g), addrs(w)) || !slices.Equal(srvs(g), srvs(w)) {
						t.Fatalf("step %d %s %s: incremental %v %v %v, fresh %v %v %v", step, q, dns.TypeToString[qt],
							g.Kind, addrs(g), srvs(g), w.Kind, addrs(w), srvs(w))
					}
				}
			}
		}
	}
}

// A record is what the table holds once per endpoint: keep it in the 80-byte
// size class (BenchmarkIndexHeap; it was 128 with its cluster, namespace and
// exports inline).
func TestPodSize(t *testing.T) {
	if n := unsafe.Sizeof(Pod{}); n > 80 {
		t.Errorf("table.Pod is %d bytes, more than 80", n)
	}
}
