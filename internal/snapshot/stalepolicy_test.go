package snapshot

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// stalePod is an exporting Pod of edge-b whose entries are exports.
func stalePod(name, ip string, exports ...annotation.Export) *store.Pod {
	return &store.Pod{Common: &store.Common{Cluster: "edge-b", Namespace: "default", Exports: exports},
		Name: name, IPs: []netip.Addr{netip.MustParseAddr(ip)}, Ready: true}
}

// staleExport is an entry of service name with the stale policy policy.
func staleExport(name, policy string, grace int32) annotation.Export {
	e := annotation.Export{Name: name, Namespace: "default", Cluster: "edge-b", Ports: []annotation.Port{httpPort}}
	e.StaleEndpoints, e.StaleGraceSeconds = policy, grace
	return e
}

// An export's stale policy round-trips: a record with one is 'e', whatever
// else its entries carry; a record without one keeps its older form.
func TestStalePolicyCodec(t *testing.T) {
	withFields := staleExport("web", annotation.StaleDropIfLocal, 45)
	withFields.Allowed = []string{"shop"}
	withFields.Service.Type, withFields.Service.Labels = annotation.TypeClusterSetIP, map[string]string{"tier": "web"}
	withFields.Ports = []annotation.Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP", AppProtocol: "kubernetes.io/h2c"}}
	allowedOnly := staleExport("other", "", 0)
	allowedOnly.Allowed = []string{"*"}
	for _, c := range []struct {
		name    string
		exports []annotation.Export
		form    byte
	}{
		{"drop, nothing else", []annotation.Export{staleExport("web", annotation.StaleDrop, 30)}, 'e'},
		{"drop after 0s", []annotation.Export{staleExport("web", annotation.StaleDrop, 0)}, 'e'},
		{"the longest grace", []annotation.Export{staleExport("web", annotation.StaleDrop, annotation.MaxStaleGrace)}, 'e'},
		{"drop-if-local with every other field", []annotation.Export{withFields}, 'e'},
		{"serve written out", []annotation.Export{staleExport("web", annotation.StaleServe, 0)}, 'e'},
		{"the policy on the second entry only", []annotation.Export{allowedOnly, staleExport("web", annotation.StaleDrop, 10)}, 'e'},
		{"the policy on the first entry, allowed namespaces on the second", []annotation.Export{staleExport("web", annotation.StaleDrop, 10), allowedOnly}, 'e'},
		{"no policy", []annotation.Export{staleExport("web", "", 0)}, 'b'},
		{"no policy, allowed namespaces", []annotation.Export{allowedOnly}, 'c'},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := stalePod("web-0", "10.1.0.1", c.exports...)
			b, err := EncodePod(p)
			if err != nil {
				t.Fatal(err)
			}
			if b[0] != c.form {
				t.Errorf("written as %q, want %q", b[0], c.form)
			}
			for _, dec := range []*PodDecoder{nil, NewPodDecoder()} {
				back, err := dec.Decode(b)
				if err != nil || !back.Equal(p) {
					t.Fatalf("round trip: %+v, %v", back, err)
				}
				for i, e := range back.Exports {
					if e.StaleEndpoints != c.exports[i].StaleEndpoints || e.StaleGraceSeconds != c.exports[i].StaleGraceSeconds {
						t.Errorf("entry %d: policy %q %ds, want %q %ds", i, e.StaleEndpoints, e.StaleGraceSeconds, c.exports[i].StaleEndpoints, c.exports[i].StaleGraceSeconds)
					}
				}
			}
			for n := 1; n < len(b); n++ {
				if p, err := DecodePod(b[:n]); err == nil {
					t.Fatalf("a record cut at %d of %d bytes read as %+v", n, len(b), p)
				}
			}
		})
	}
	// A grace past the bound is damage: refused, not read as some policy.
	b, err := EncodePod(stalePod("web-0", "10.1.0.1", staleExport("web", annotation.StaleDrop, annotation.MaxStaleGrace+1)))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := DecodePod(b); err == nil {
		t.Errorf("a grace of %ds read as %+v", annotation.MaxStaleGrace+1, p.Exports)
	}
}

// The stale policy survives a restart through the snapshot: after the
// restart, a cluster out of contact past the grace loses its endpoints of
// the service whose entry says drop, and keeps those of the one that says
// nothing (serve).
func TestStalePolicySurvivesRestart(t *testing.T) {
	pods := []*store.Pod{
		stalePod("web-0", "10.1.0.1", staleExport("dropped", annotation.StaleDrop, 30)),
		stalePod("web-1", "10.1.0.2", staleExport("kept", "", 0)),
		stalePod("web-2", "10.1.0.3", staleExport("local", annotation.StaleDropIfLocal, 30)),
	}
	path := dbPath(t)
	var l logBuf
	s, _ := mustOpen(t, path, testOptions(&l))
	recs := map[string][]byte{}
	for _, p := range pods {
		b, err := EncodePod(p)
		if err != nil {
			t.Fatal(err)
		}
		recs[p.Namespace+"/"+p.Name] = b
	}
	s.ReplaceSource("edge-b", recs, Meta{ClusterID: "edge-b", LastContact: time.Now()})
	mustClose(t, s)

	s, _ = mustOpen(t, path, testOptions(&l))
	defer mustClose(t, s)
	dec := NewPodDecoder()
	var back []*store.Pod
	for _, v := range mustLoad(t, s)["edge-b"].Records {
		p, err := dec.Decode(v)
		if err != nil {
			t.Fatal(err)
		}
		back = append(back, p)
	}
	slices.SortFunc(back, func(a, b *store.Pod) int { return strings.Compare(a.Name, b.Name) })
	if len(back) != len(pods) {
		t.Fatalf("%d records after the restart, want %d", len(back), len(pods))
	}
	for i := range pods {
		if !back[i].Equal(pods[i]) {
			t.Errorf("read back %+v, want %+v", back[i].Exports, pods[i].Exports)
		}
	}

	st := store.New()
	tb := table.New(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a", Locality: table.Any}, st)
	st.ReplaceCluster("edge-b", back)
	tb.Rebuild()
	tb.SetStaleFor("edge-b", time.Minute)
	ix := tb.Rebuild()
	for _, c := range []struct {
		svc  string
		want int
	}{{"dropped", 0}, {"kept", 1}, {"local", 1}} { // local: no local endpoints, so kept
		a := ix.Lookup(c.svc+".default.svc.clusterset.local.", dns.TypeA)
		if len(a.A) != c.want {
			t.Errorf("%s a minute out of contact after the restart: %d addresses (%s), want %d", c.svc, len(a.A), a.Kind, c.want)
		}
	}
}

// A file written before the stale policy was stored (testdata/schema2d.db,
// written by commit 5d4061b's code with testdata/genv2d.go.txt) opens as it
// is: every record reads, with its Service fields, and the policy the old
// code did not keep reads as the default (serve) until the source lists the
// Pods again.
func TestSchema2dOldCodecOpens(t *testing.T) {
	path := copyTestdata(t, "schema2d.db")
	var l logBuf
	s, res := mustOpen(t, path, testOptions(&l))
	defer mustClose(t, s)
	if res.MovedAside != "" || res.Created {
		t.Fatalf("the file was not kept: %+v", res)
	}
	recs := mustLoad(t, s)["edge-a"].Records
	if len(recs) != 2 {
		t.Fatalf("records %v", recs)
	}
	for k, v := range recs {
		if v[0] != 'd' {
			t.Errorf("record %s is %q: the file is not what the test means to read", k, v[0])
		}
		p, err := DecodePod(v)
		if err != nil || !IsNameKey([]byte(k), p.Namespace, p.Name) {
			t.Fatalf("record %s: %+v, %v", k, p, err)
		}
		e := p.Exports[0]
		if got := fmt.Sprintln(e.ServiceType(), e.Labels, e.Allowed, e.Ports[0].AppProtocol); got != "ClusterSetIP map[tier:web] [shop] kubernetes.io/h2c\n" {
			t.Errorf("%s: type, labels, allowed namespaces, appProtocol: %s", p.Name, got)
		}
		if e.StalePolicy() != annotation.StaleServe || e.StaleGraceSeconds != 0 {
			t.Errorf("%s: policy %s %ds, want the default", p.Name, e.StalePolicy(), e.StaleGraceSeconds)
		}
	}
}

// A source's meta keeps the state it was written in, for mcsctl; a file
// written before the state was kept reads it as not recorded.
func TestMetaState(t *testing.T) {
	path := dbPath(t)
	var l logBuf
	s, _ := mustOpen(t, path, testOptions(&l))
	at := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	s.ReplaceSource("edge-b", map[string][]byte{}, Meta{ClusterID: "edge-b", LastContact: at, LastFullSync: at, State: "connected"})
	s.SetMeta("edge-b", Meta{ClusterID: "edge-b", LastContact: at, LastFullSync: at, State: "disconnected"})
	s.ReplaceSource("edge-o", map[string][]byte{}, Meta{ClusterID: "edge-o", LastContact: at, State: "connected", Via: []string{"hub-1", "hub-2"}})
	mustClose(t, s)
	s, _ = mustOpen(t, path, testOptions(&l))
	loaded := mustLoad(t, s)
	if m := loaded["edge-b"].Meta; m.State != "disconnected" || !m.LastContact.Equal(at) || m.Via != nil {
		t.Errorf("meta %+v, want the state and contact last written", m)
	}
	if m := loaded["edge-o"].Meta; !slices.Equal(m.Via, []string{"hub-1", "hub-2"}) {
		t.Errorf("a relayed cluster's meta %+v, want the hubs it came through", m)
	}
	mustClose(t, s)

	s, _ = mustOpen(t, copyTestdata(t, "schema2d.db"), testOptions(&l))
	defer mustClose(t, s)
	if m := mustLoad(t, s)["edge-a"].Meta; m.State != "" || m.LastContact.IsZero() {
		t.Errorf("an older file's meta %+v, want its contact and no state", m)
	}
}

// A record whose policy the annotation parser would refuse (a damaged or
// hand-made file) does not decode: it is never served as "serve" in
// silence.
func TestStalePolicyCodecRefusesInvalid(t *testing.T) {
	for _, e := range []annotation.Export{
		staleExport("web", "Bogus", 0),
		staleExport("web", annotation.StaleServe, 30),
	} {
		b, err := EncodePod(stalePod("web-0", "10.1.0.1", e))
		if err != nil {
			t.Fatal(err)
		}
		for _, dec := range []*PodDecoder{nil, NewPodDecoder()} {
			if p, err := dec.Decode(b); err == nil {
				t.Errorf("policy %q %ds: decoded as %+v, want an error", e.StaleEndpoints, e.StaleGraceSeconds, p.Exports)
			}
		}
	}
}
