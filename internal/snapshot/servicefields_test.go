package snapshot

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// A file written by the code before the Service fields were stored
// (testdata/schema2.db, written by commit 282710b's code with
// testdata/genv2.go.txt) opens as it is, every record read.
func TestSchema2OldCodecOpens(t *testing.T) {
	path := copyTestdata(t, "schema2.db")
	var l logBuf
	s, res := mustOpen(t, path, testOptions(&l))
	defer mustClose(t, s)
	if res.MovedAside != "" || res.Created {
		t.Fatalf("the file was not kept: %+v", res)
	}
	srcs := mustLoad(t, s)
	recs := srcs["edge-a"].Records
	if len(recs) != 2 {
		t.Fatalf("records %v", recs)
	}
	for k, v := range recs {
		p, err := DecodePod(v)
		if err != nil || !IsNameKey([]byte(k), p.Namespace, p.Name) || p.Exports[0].Ports[0].TargetPort != 8080 {
			t.Fatalf("record %s: %+v, %v", k, p, err)
		}
		if want := []string(nil); p.Name == "backend-1" {
			want = []string{"shop"}
			if !slices.Equal(p.Exports[0].Allowed, want) {
				t.Errorf("%s: allowed %v, want %v", p.Name, p.Exports[0].Allowed, want)
			}
		}
		if p.Exports[0].ServiceType() != annotation.TypeHeadless {
			t.Errorf("%s: an old record reads as %s, want Headless (the default)", p.Name, p.Exports[0].ServiceType())
		}
	}
	n := 0
	if _, err := s.LoadClients(func(*clients.Client, []netip.Addr) { n++ }); err != nil || n != 1 {
		t.Errorf("clients: %d, %v", n, err)
	}
	if list, bad, err := s.LoadClusterSetIPs(); err != nil || bad != 0 || len(list) != 1 {
		t.Errorf("ClusterSetIPs %v, bad %d, %v", list, bad, err)
	}
	if st, err := s.LoadImportState(); err != nil || st != table.ImportsUnknown {
		t.Errorf("import state %v, %v; want unknown", st, err)
	}
}

// servicePod is an exporting Pod whose entry carries every Service field.
func servicePod(name, ip string) *store.Pod {
	return &store.Pod{Common: &store.Common{Cluster: "edge-a", Namespace: "default", Exports: []annotation.Export{{
		Name: "web", Namespace: "default", Cluster: "edge-a", Allowed: []string{"shop"},
		Ports: []annotation.Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP", AppProtocol: "kubernetes.io/h2c"},
			{Name: "dns", Port: 53, TargetPort: 5353, Protocol: "UDP"}},
		Service: annotation.Service{Type: annotation.TypeClusterSetIP, ExportedAt: "2026-11-25T10:00:00Z",
			SessionAffinity: "ClientIP", SessionAffinityTimeoutSeconds: 600, InternalTrafficPolicy: "Local",
			TrafficDistribution: "PreferClose", Labels: map[string]string{"tier": "web", "team": ""},
			Annotations: map[string]string{"example.com/long": string(make([]byte, 4000)), "a": "b"}},
	}}}, Name: name, IPs: []netip.Addr{netip.MustParseAddr(ip)}, Ready: true}
}

// Every Service field of an export survives the snapshot; after a restart
// from it, the answers are the ones given before.
func TestServiceFieldsSurviveRestart(t *testing.T) {
	pods := []*store.Pod{servicePod("web-0", "10.0.0.1"), servicePod("web-1", "10.0.0.2")}
	path := dbPath(t)
	var l logBuf
	s, _ := mustOpen(t, path, testOptions(&l))
	recs := map[string][]byte{}
	for _, p := range pods {
		b, err := EncodePod(p)
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != 'd' {
			t.Errorf("written as %q, want 'd'", b[0])
		}
		recs[p.Namespace+"/"+p.Name] = b
	}
	s.ReplaceSource("edge-a", recs, Meta{ClusterID: "edge-a"})
	s.ReplaceImports(nil, table.ImportsAbsent)
	mustClose(t, s)

	s, _ = mustOpen(t, path, testOptions(&l))
	defer mustClose(t, s)
	dec := NewPodDecoder()
	var back []*store.Pod
	for _, v := range mustLoad(t, s)["edge-a"].Records {
		p, err := dec.Decode(v)
		if err != nil {
			t.Fatal(err)
		}
		back = append(back, p)
	}
	slices.SortFunc(back, func(a, b *store.Pod) int { return strings.Compare(a.Name, b.Name) })
	for i := range pods {
		if !back[i].Equal(pods[i]) {
			t.Errorf("read back %+v\nwant %+v", back[i].Exports, pods[i].Exports)
		}
	}
	if e := back[0].Exports[0]; !maps.Equal(e.Annotations, pods[0].Exports[0].Annotations) || e.Ports[0].AppProtocol != "kubernetes.io/h2c" {
		t.Errorf("annotations or appProtocol lost: %+v", e)
	}
	state, err := s.LoadImportState()
	if err != nil || state != table.ImportsAbsent {
		t.Fatalf("import state %v, %v", state, err)
	}

	answers := func(ps []*store.Pod, state table.ImportState) []table.Answer {
		st := store.New()
		tb := table.New(table.Config{Zone: "clusterset.local.", TTL: 5, LocalCluster: "edge-a"}, st)
		st.ReplaceCluster("edge-a", ps)
		tb.SetImportState(state)
		ix := tb.Rebuild()
		var out []table.Answer
		for _, q := range []struct {
			name  string
			qtype uint16
		}{{"web.default.svc.clusterset.local.", dns.TypeA}, {"web.default.svc.clusterset.local.", dns.TypeSRV},
			{"_http._tcp.web.default.svc.clusterset.local.", dns.TypeSRV}} {
			out = append(out, ix.Lookup(q.name, q.qtype))
		}
		return out
	}
	before, after := answers(pods, table.ImportsAbsent), answers(back, state)
	for i := range before {
		if before[i].Kind != after[i].Kind || len(before[i].A) != len(after[i].A) || (before[i].SRV == nil) != (after[i].SRV == nil) ||
			(before[i].SRV != nil && !slices.EqualFunc(before[i].SRV.SRV, after[i].SRV.SRV, func(a, b dns.SRV) bool { return a.Target == b.Target && a.Port == b.Port })) {
			t.Errorf("answer %d: %+v after the restart, %+v before", i, after[i], before[i])
		}
	}
	if after[1].Kind != table.KindSRV || after[1].SRV.SRV[0].Target != "web.default.svc.clusterset.local." {
		t.Errorf("SRV %+v: want service form (the type was kept)", after[1])
	}
}

// A damaged 'd' record is refused, never half read.
func TestServiceFieldsTruncated(t *testing.T) {
	b, err := EncodePod(servicePod("web-0", "10.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n < len(b); n += 7 {
		if p, err := DecodePod(b[:n]); err == nil {
			t.Fatalf("a record cut at %d of %d bytes read as %+v", n, len(b), p)
		}
	}
}
