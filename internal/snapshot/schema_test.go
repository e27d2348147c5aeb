package snapshot

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// copySchema1 copies testdata/schema1.db, a file written by commit ae347de's
// code (testdata/genv1.go.txt): the cluster edge-a's two Pods, and the
// clients and ClusterSetIP services as the sources "~clients" and
// "~serviceimports".
func copySchema1(t *testing.T) string { return copyTestdata(t, "schema1.db") }

// copyTestdata copies testdata/name into a temporary directory.
func copyTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "mcs.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A schema 1 file is read correctly: migrated in place at Open (not moved
// aside), its records unchanged, the typed buckets holding what the fake
// sources held, and no fake source left.
func TestSchema1Migrated(t *testing.T) {
	path := copySchema1(t)
	var l logBuf
	s, res := mustOpen(t, path, testOptions(&l))
	if res.MovedAside != "" || res.Created {
		t.Fatalf("a schema 1 file was not kept: %+v", res)
	}
	srcs := mustLoad(t, s)
	if len(srcs) != 1 || len(srcs["edge-a"].Records) != 2 || srcs["edge-a"].Meta.LastFullSync.IsZero() {
		t.Fatalf("sources after migration: %+v", srcs)
	}
	for k, v := range srcs["edge-a"].Records {
		p, err := DecodePod(v)
		if err != nil || !IsNameKey([]byte(k), p.Namespace, p.Name) {
			t.Errorf("record %s: %+v, %v", k, p, err)
		}
	}
	var got []*clients.Client
	if bad, err := s.LoadClients(func(c *clients.Client, ips []netip.Addr) {
		got = append(got, c)
		if len(ips) != 1 || ips[0] != netip.MustParseAddr("10.0.1.5") {
			t.Errorf("client IPs %v", ips)
		}
	}); err != nil || bad != 0 || len(got) != 1 || got[0].Imports[0].Alias != "be" {
		t.Errorf("clients %+v, bad %d, %v", got, bad, err)
	}
	list, bad, err := s.LoadClusterSetIPs()
	if err != nil || bad != 0 || len(list) != 1 || list[0].Name != "cart" || list[0].IPs[0] != netip.MustParseAddr("10.96.0.10") {
		t.Errorf("ClusterSetIPs %+v, bad %d, %v", list, bad, err)
	}
	mustClose(t, s)

	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		if v := string(tx.Bucket([]byte(metaBucket)).Get([]byte(schemaVersionKey))); v != schemaVersion {
			t.Errorf("schema version %q after migration", v)
		}
		for _, old := range []string{v1ClientsSource, v1ClusterSetIPsSource} {
			if tx.Bucket([]byte(sourcesBucket)).Bucket([]byte(old)) != nil {
				t.Errorf("source %q left after migration", old)
			}
		}
		return nil
	})
}

// The typed buckets round-trip through their codecs, and replacing one
// leaves the others alone.
func TestTypedBuckets(t *testing.T) {
	var l logBuf
	path := dbPath(t)
	s, _ := mustOpen(t, path, testOptions(&l))
	a := &clients.Client{Namespace: "web", Name: "a"}
	s.PutClient(a, []netip.Addr{ipA})
	s.PutClient(&clients.Client{Namespace: "web", Name: "b"}, []netip.Addr{ipB})
	s.DeleteClient("web", "b")
	if bad := s.ReplaceClusterSetIPs([]table.ClusterSetIP{csip("default", "x", []string{"10.96.0.1"}), csip("default", "y", []string{"10.96.0.2"})}); bad != 0 {
		t.Fatalf("bad %d", bad)
	}
	s.Put("edge-a", "default/p", []byte("v"))
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.ReplaceClusterSetIPs([]table.ClusterSetIP{csip("default", "y", []string{"10.96.0.3"})})
	mustClose(t, s)

	s, _ = mustOpen(t, path, testOptions(&l))
	defer mustClose(t, s)
	n := 0
	if _, err := s.LoadClients(func(c *clients.Client, _ []netip.Addr) {
		n++
		if c.Name != "a" {
			t.Errorf("client %s", c.Name)
		}
	}); err != nil || n != 1 {
		t.Errorf("%d clients, %v", n, err)
	}
	list, _, err := s.LoadClusterSetIPs()
	if err != nil || len(list) != 1 || list[0].IPs[0] != netip.MustParseAddr("10.96.0.3") {
		t.Errorf("ClusterSetIPs %+v, %v", list, err)
	}
	if srcs := mustLoad(t, s); len(srcs) != 1 || string(srcs["edge-a"].Records["default/p"]) != "v" {
		t.Errorf("sources %+v", srcs)
	}
}
