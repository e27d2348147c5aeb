package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

func pod(cluster, ns, name, svc string, ready bool, ips ...string) *store.Pod {
	p := &store.Pod{Common: &store.Common{Cluster: cluster, Namespace: ns,
		Exports: []annotation.Export{{Name: svc, Namespace: ns, Cluster: cluster, Ports: []annotation.Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}}}}},
		Name: name, Ready: ready}
	for _, ip := range ips {
		p.IPs = append(p.IPs, netip.MustParseAddr(ip))
	}
	return p
}

// writeSnapshot writes a snapshot as the plugin does and returns its path
// and the still open store (the plugin's, holding the lock).
func writeSnapshot(t *testing.T) (string, *snapshot.Store) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "table.db")
	st, _, err := snapshot.Open(path, snapshot.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	put := func(ps ...*store.Pod) map[string][]byte {
		m := map[string][]byte{}
		for _, p := range ps {
			b, err := snapshot.EncodePod(p)
			if err != nil {
				t.Fatal(err)
			}
			m[p.Namespace+"/"+p.Name] = b
		}
		return m
	}
	contact := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	st.ReplaceSource("edge-a", put(pod("edge-a", "default", "web-0", "web", true, "10.0.0.1"), pod("edge-a", "default", "web-1", "web", false, "10.0.0.2")),
		snapshot.Meta{ClusterID: "edge-a", LastContact: contact, LastFullSync: contact})
	st.ReplaceSource("edge-b", put(pod("edge-b", "default", "web-0", "web", true, "10.1.0.1"), pod("edge-b", "shop", "db-0", "db", true, "fd00::1")),
		snapshot.Meta{ClusterID: "edge-b", LastContact: contact})
	st.Put("edge-b", "shop/garbage", []byte("not a record"))
	st.PutClient(&clients.Client{Namespace: "default", Name: "client"}, []netip.Addr{netip.MustParseAddr("10.0.0.9")})
	st.ReplaceClusterSetIPs([]table.ClusterSetIP{{Namespace: "shop", Name: "cart", IPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Ports: []table.ImportPort{{Name: "http", Protocol: "TCP", Port: 80}}}})
	if err := st.Flush(); err != nil {
		t.Fatal(err)
	}
	return path, st
}

func TestSnapshotJSON(t *testing.T) {
	path, _ := writeSnapshot(t) // open: read through a copy
	var out, errb bytes.Buffer
	if rc := run([]string{"mcsctl", "snapshot", path, "-o", "json"}, nil, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	var s site
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !s.Copied || s.Clients != 1 || len(s.Sources) != 2 || len(s.ClusterSetIPs) != 1 || s.ClusterSetIPs[0].Ports[0] != "http:80/TCP" {
		t.Errorf("got %+v", s)
	}
	a, b := s.Sources[0], s.Sources[1]
	if a.Cluster != "edge-a" || a.Records != 2 || !a.Complete || a.LastContact == nil || !a.LastContact.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("edge-a: %+v", a)
	}
	if b.Cluster != "edge-b" || b.Records != 2 || b.Complete || b.LastFullSync != nil || b.BadRecords != 1 {
		t.Errorf("edge-b: %+v", b)
	}
	if len(s.Services) != 2 || s.Services[0].Name != "web" || s.Services[1].Namespace != "shop" {
		t.Fatalf("services %+v", s.Services)
	}
	web := s.Services[0]
	if len(web.Clusters) != 2 || web.Clusters[0].Ready != 1 || len(web.Clusters[0].Endpoints) != 2 ||
		web.Clusters[0].Endpoints[1].Ready || web.Clusters[0].Ports[0] != "http:80/TCP->8080" ||
		web.Clusters[0].Endpoints[0].Hostname != "10-0-0-1" {
		t.Errorf("web: %+v", web)
	}

	out.Reset()
	if rc := run([]string{"mcsctl", "snapshot", path}, nil, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	for _, w := range []string{"read from a copy", "edge-b", "cluster edge-a: 1 of 2 endpoints ready", "shop/cart", "DNS clients: 1"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("text output lacks %q:\n%s", w, out.String())
		}
	}
	if rc := run([]string{"mcsctl", "snapshot", filepath.Join(t.TempDir(), "none.db")}, nil, &out, &errb); rc != 1 {
		t.Errorf("missing file: exit %d", rc)
	}
}

func TestExplainSnapshot(t *testing.T) {
	path, st := writeSnapshot(t)
	st.Close() // also works on a file nobody holds
	var out, errb bytes.Buffer
	if rc := run([]string{"mcsctl", "explain", "web.default", "--snapshot", path, "--local", "edge-a"}, nil, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	for _, w := range []string{
		"web.default.svc.clusterset.local.",
		"A    service", "10.0.0.1", // prefer-local: the local ready endpoint only
		"SRV  srv",
		"cluster edge-a: Pod default/web-1 (10-0-0-2, [10.0.0.2]): not answered: the Pod is not ready",
		"cluster edge-b: Pod default/web-0 (10-1-0-1, [10.1.0.1]): answered by its endpoint name and SRV; left out of the service's A/AAAA",
	} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
	if strings.Contains(out.String(), "A\t10.1.0.1") {
		t.Errorf("prefer-local answered a remote endpoint:\n%s", out.String())
	}
	out.Reset()
	if rc := run([]string{"mcsctl", "explain", "cart.shop.svc.clusterset.local", "--snapshot", path}, nil, &out, &errb); rc != 0 ||
		!strings.Contains(out.String(), "A    clustersetip") || !strings.Contains(out.String(), "10.96.0.10") {
		t.Errorf("ClusterSetIP: exit %d\n%s", rc, out.String())
	}
	out.Reset()
	if rc := run([]string{"mcsctl", "explain", "nope.default", "--snapshot", path}, nil, &out, &errb); rc != 0 ||
		!strings.Contains(out.String(), "A    nxdomain") || !strings.Contains(out.String(), "no Pod exports default/nope") {
		t.Errorf("unknown name: exit %d\n%s", rc, out.String())
	}
	if rc := run([]string{"mcsctl", "explain", "web.default"}, nil, &out, &errb); rc != 2 {
		t.Errorf("no source: exit %d", rc)
	}
}

func TestExplainLive(t *testing.T) {
	labelled := map[string]string{annotation.ExporterLabel: annotation.LabelValue}
	mk := func(name, value string) *v1.Pod {
		return &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labelled,
				Annotations: map[string]string{annotation.ExportAnnotation: value}},
			Status: v1.PodStatus{PodIP: "10.0.0.5", Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
		}
	}
	client := fake.NewClientset(mk("web-0", `{"services":[{"name":"web"}]}`), mk("bad-0", `{"services":[{"name":"web","cluster":"edge-z"}]}`))
	pods, rej, err := listPods(context.Background(), client, "edge-a", "default", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 2 || len(rej) != 1 || rej[0].name != "bad-0" || rej[0].rejections[0].Reason != annotation.ReasonClusterOutside {
		t.Errorf("pods %d, rejected %+v", len(pods), rej)
	}
}

// A schema 1 file (written by the build before the typed buckets) is read
// as it is, without migrating it: the tool never writes.
func TestSnapshotSchema1(t *testing.T) {
	b, err := os.ReadFile("../../internal/snapshot/testdata/schema1.db")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "old.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := readSite(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Sources) != 1 || s.Sources[0].Records != 2 || s.Clients != 1 || len(s.ClusterSetIPs) != 1 || len(s.Services) != 1 {
		t.Errorf("read %+v", s)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, b) {
		t.Error("reading changed the file")
	}
}

// TestSnapshotDamaged: a damaged file's lengths and page numbers cannot make
// mcsctl allocate more than a few times the file's size (a bucket's value
// length with bit 29 set would ask for 512 MiB; an inline bucket's page not
// a leaf would make bbolt descend without end): it says the file is unusable, which
// page is damaged, and exits 1, leaving the file as it was.
func TestSnapshotDamaged(t *testing.T) {
	path, st := writeSnapshot(t)
	st.Close()
	img, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ps, ne := os.Getpagesize(), binary.NativeEndian
	// bucketValue returns the offset of the first bucket element's header
	// whose bucket is inline (or not), found in the live pages of img.
	bucketValue := func(inline bool) int {
		db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, PreLoadFreelist: true, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		found := -1
		_ = db.View(func(tx *bolt.Tx) error {
			for id := 2; found < 0 && (id+1)*ps <= len(img); id++ {
				info, _ := tx.Page(id)
				if info == nil || info.Type != "leaf" {
					continue
				}
				for i := range info.Count {
					at := id*ps + 16 + i*16
					v := at + int(ne.Uint32(img[at+4:])) + int(ne.Uint32(img[at+8:]))
					if ne.Uint32(img[at:])&1 == 1 && (ne.Uint64(img[v:]) == 0) == inline {
						found = at
						break
					}
				}
			}
			return nil
		})
		if found < 0 {
			t.Fatalf("no bucket element (inline %t)", inline)
		}
		return found
	}
	cases := []struct {
		name   string
		damage func(b []byte)
		want   string
	}{{
		name:   "value length with bit 29 set",
		damage: func(b []byte) { at := bucketValue(false); b[at+15] ^= 1 << 5 },
		want:   "runs past the page",
	}, {
		name: "inline bucket's page not a leaf",
		damage: func(b []byte) {
			at := bucketValue(true)
			v := at + int(ne.Uint32(b[at+4:])) + int(ne.Uint32(b[at+8:]))
			ne.PutUint16(b[v+16+8:], 0)
		},
		want: "inline bucket: a page of type 0x0",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := append([]byte(nil), img...)
			tc.damage(b)
			damaged := filepath.Join(t.TempDir(), "damaged.db")
			if err := os.WriteFile(damaged, b, 0o600); err != nil {
				t.Fatal(err)
			}
			var out, errb bytes.Buffer
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			rc := run([]string{"mcsctl", "snapshot", damaged}, nil, &out, &errb)
			runtime.ReadMemStats(&after)
			if limit := 4*uint64(len(b)) + 1<<20; after.TotalAlloc-before.TotalAlloc > limit {
				t.Errorf("allocated %d bytes reading a %d-byte file, over %d", after.TotalAlloc-before.TotalAlloc, len(b), limit)
			}
			if rc != 1 || !strings.Contains(errb.String(), "mcsctl snapshot: unusable snapshot: ") || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want 1 and unusable ... %s", rc, errb.String(), tc.want)
			}
			if after, _ := os.ReadFile(damaged); !bytes.Equal(after, b) {
				t.Error("reading changed the file")
			}
		})
	}
}
