package mcsannotations

import (
	"context"
	"fmt"
	"iter"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	"github.com/coredns/caddy"
	coretest "github.com/coredns/coredns/test"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
	bolt "go.etcd.io/bbolt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

func snapshotCorefile(path string) string {
	return `clusterset.local:0 {
    bind 127.0.0.1
    mcsannotations {
        cluster edge-a
        kubeconfig /unused-in-this-test
        snapshot ` + path + `
    }
}`
}

func deadAPI(string, string) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second})
}

func fakeAPI(objs ...runtime.Object) func(string, string) (kubernetes.Interface, error) {
	c := fake.NewClientset(objs...)
	return func(string, string) (kubernetes.Interface, error) { return c, nil }
}

func addrsOf(r *dns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	slices.Sort(out)
	return out
}

// serveSnapshot starts a CoreDNS with the plugin and the snapshot at path
// (through the client withClient set last).
func serveSnapshot(t *testing.T, path string) (i *caddy.Instance, udp, tcp string) {
	t.Helper()
	i, udp, tcp, err := coretest.CoreDNSServerAndPorts(snapshotCorefile(path))
	if err != nil {
		t.Fatal(err)
	}
	return i, udp, tcp
}

// waitAnswer polls until qname answers with want, for at most 5 s.
func waitAnswer(t *testing.T, udp, qname string, want []string) {
	t.Helper()
	var got []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got = addrsOf(exchange(t, "udp", udp, qname, dns.TypeA, 0)); slices.Equal(got, want) {
			return
		}
	}
	t.Fatalf("%s: %v, want %v", qname, got, want)
}

const backendAnno = `{"services":[{"name":"backend","ports":[{"name":"http","port":80}]}]}`

// seedSnapshot writes the snapshot at path as a run with a live API holding
// pods leaves it: CoreDNS syncs (backend answering want) and stops.
func seedSnapshot(t *testing.T, path string, want []string, pods ...runtime.Object) {
	t.Helper()
	withClient(t, fakeAPI(pods...))
	i, udp, _ := serveSnapshot(t, path)
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", want)
	waitSynced(t)
	stopServer(i)
}

// Sync with a live API, stop, start again with the API dead: the very first
// query is answered from the snapshot, and the plugin is ready.
func TestSnapshotServesAfterRestartWhileOffline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "table.db")
	seedSnapshot(t, path, []string{"10.0.0.1", "10.0.0.2"}, exporter("a", "10.0.0.1", backendAnno), exporter("b", "10.0.0.2", backendAnno))

	withClient(t, deadAPI)
	i, udp, tcp := serveSnapshot(t, path)
	defer stopServer(i)
	r := exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 0)
	if got := addrsOf(r); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Fatalf("first answer after an offline restart: %v", r)
	}
	r = exchange(t, "tcp", tcp, "_http._tcp.backend.default.svc.clusterset.local.", dns.TypeSRV, 0)
	if len(r.Answer) != 2 {
		t.Fatalf("SRV after an offline restart: %v", r)
	}
	if !liveInstance(t).Ready() {
		t.Error("not ready although the snapshot was loaded")
	}
}

// A second restart while still offline is as good as the first: the source,
// which never listed in the first offline run, must not have overwritten the
// stored last full sync when it saw the API down (it did, and the plugin
// stayed unready for good).
func TestSnapshotSecondOfflineRestartStaysReady(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table.db")
	withClient(t, fakeAPI(exporter("a", "10.0.0.1", backendAnno)))
	i, udp, _ := serveSnapshot(t, path)
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1"})
	waitSynced(t)
	synced := liveInstance(t).sources[0].LastFullSync()
	stopServer(i)

	withClient(t, deadAPI)
	for run := 1; run <= 2; run++ {
		i, udp, _ := serveSnapshot(t, path)
		m := liveInstance(t)
		if !m.Ready() {
			stopServer(i)
			t.Fatalf("offline restart %d: not ready", run)
		}
		if got := m.sources[0].LastFullSync(); !got.Equal(synced) {
			t.Errorf("offline restart %d: last full sync %v, want the stored %v", run, got, synced)
		}
		// The dead API turns the source Disconnected, which saves its meta:
		// the write that used to store "never".
		for deadline := time.Now().Add(10 * time.Second); m.sources[0].State() != source.Disconnected; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				stopServer(i)
				t.Fatalf("offline restart %d: source never saw the API down", run)
			}
		}
		r := exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 0)
		stopServer(i)
		if got := addrsOf(r); !slices.Equal(got, []string{"10.0.0.1"}) {
			t.Fatalf("offline restart %d: %v", run, r)
		}
	}
}

// waitSynced waits until the live instance's sources have synced once.
func waitSynced(t *testing.T) {
	t.Helper()
	m := liveInstance(t)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m.sources[0].HasSynced() {
			return
		}
	}
	t.Fatal("source did not sync")
}

// liveInstance returns the one running plugin instance.
func liveInstance(t *testing.T) *MCS {
	t.Helper()
	collector.mu.Lock()
	defer collector.mu.Unlock()
	if len(collector.live) != 1 {
		t.Fatalf("%d live instances", len(collector.live))
	}
	for m := range collector.live {
		return m
	}
	return nil
}

// Records in the snapshot that the API no longer has go away at the first
// complete list; the others never stop answering.
func TestSnapshotStaleRecordsDroppedOnSync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table.db")
	seedSnapshot(t, path, []string{"10.0.0.1", "10.0.0.9"}, exporter("a", "10.0.0.1", backendAnno), exporter("gone", "10.0.0.9", backendAnno))

	withClient(t, fakeAPI(exporter("a", "10.0.0.1", backendAnno), exporter("new", "10.0.0.3", backendAnno)))
	i, udp, _ := serveSnapshot(t, path)
	defer stopServer(i)
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1", "10.0.0.3"})
}

// Garbage where the snapshot should be: moved aside, the server starts empty
// and fills from the API.
func TestSnapshotGarbageMovedAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "table.db")
	if err := os.WriteFile(path, []byte("this is not a bbolt file, not even close"), 0o600); err != nil {
		t.Fatal(err)
	}
	withClient(t, fakeAPI(exporter("a", "10.0.0.1", backendAnno)))
	i, udp, _ := serveSnapshot(t, path)
	defer stopServer(i)
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1"})
	aside, _ := filepath.Glob(filepath.Join(dir, "table.db.corrupt-*"))
	if len(aside) != 1 {
		t.Fatalf("moved-aside files: %v", aside)
	}
}

// A reload opens the same file in the same process while the old instance
// still runs: it must neither hang on bbolt's lock nor lose the data.
func TestSnapshotReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table.db")
	withClient(t, fakeAPI(exporter("a", "10.0.0.1", backendAnno)))
	i, udp, _ := serveSnapshot(t, path)
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1"})

	withClient(t, deadAPI) // the reloaded instance cannot reach the API: only the snapshot has the data
	done := make(chan error, 1)
	var ni *caddy.Instance
	go func() {
		var err error
		ni, err = i.Restart(coretest.NewInput(snapshotCorefile(path)))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reload hung")
	}
	defer stopServer(ni)
	udp, _ = coretest.CoreDNSServerPorts(ni, 0)
	r := exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 0)
	if got := addrsOf(r); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Fatalf("after reload: %v", r)
	}
}

// The file is damaged under the running server (truncated): the store stops
// touching it, the plugin notices, reopens (the damaged file is moved aside)
// and writes the table out again, so a later offline restart still answers,
// including with what changed after the damage.
func TestSnapshotDamagedWhileRunning(t *testing.T) {
	old := snapshotCheckEvery
	snapshotCheckEvery = 50 * time.Millisecond
	t.Cleanup(func() { snapshotCheckEvery = old })

	dir := t.TempDir()
	path := filepath.Join(dir, "table.db")
	var objs []runtime.Object
	for i := range 2000 {
		objs = append(objs, exporter(fmt.Sprintf("p%d", i), fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), `{"services":[{"name":"bulk"}]}`))
	}
	client := fake.NewClientset(objs...)
	withClient(t, func(string, string) (kubernetes.Interface, error) { return client, nil })
	i, udp, _ := serveSnapshot(t, path)
	waitSynced(t)
	m := liveInstance(t)
	if err := m.store.Load().Flush(); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 3*int64(os.Getpagesize())); err != nil {
		t.Fatal(err)
	}
	// Changes after the damage: they must survive too.
	for j := range 200 {
		if _, err := client.CoreV1().Pods("default").Create(context.Background(),
			exporter(fmt.Sprintf("late%d", j), fmt.Sprintf("10.9.%d.%d", j/250, j%250+1), backendAnno), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitAnswer(t, udp, "10-9-0-200.edge-a.backend.default.svc.clusterset.local.", []string{"10.9.0.200"})
	var aside []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && len(aside) == 0; time.Sleep(50 * time.Millisecond) {
		aside, _ = filepath.Glob(filepath.Join(dir, "table.db.corrupt-*"))
	}
	if len(aside) != 1 {
		t.Fatalf("the damaged file was not moved aside: %v", aside)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if st := m.store.Load(); st != nil && st.Stats().Pending == 0 && st.Stats().LastError == nil {
			break
		}
	}
	stopServer(i)

	withClient(t, deadAPI)
	i, udp, tcp := serveSnapshot(t, path)
	defer stopServer(i)
	r := exchange(t, "tcp", tcp, "bulk.default.svc.clusterset.local.", dns.TypeA, 0)
	if len(r.Answer) != 2000 {
		t.Fatalf("after an offline restart: %d bulk answers, want 2000", len(r.Answer))
	}
	if got := addrsOf(exchange(t, "udp", udp, "10-9-0-200.edge-a.backend.default.svc.clusterset.local.", dns.TypeA, 0)); !slices.Equal(got, []string{"10.9.0.200"}) {
		t.Fatalf("a change made after the damage was lost: %v", got)
	}
}

// Records that do not decode, or that disagree with their key or bucket,
// are skipped, counted and deleted from the file; a cluster no longer
// configured is dropped; the good records are served. The load decodes
// straight from the file's memory map, so the good ones must survive the
// read transaction (a record that kept a slice of the map would crash or
// change under a later write).
func TestSnapshotBadRecordsSkipped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table.db")
	st, _, err := snapshot.Open(path, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	good := func(name, ip string) []byte {
		b, err := snapshot.EncodePod(&store.Pod{Common: &store.Common{Cluster: "edge-a", Namespace: "default", Exports: []annotation.Export{{Name: "backend", Namespace: "default", Cluster: "edge-a"}}}, Name: name, Ready: true,
			IPs: []netip.Addr{netip.MustParseAddr(ip)}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	now := time.Now()
	st.ReplaceSource("edge-a", map[string][]byte{
		"default/a":     good("a", "10.0.0.1"),
		"default/b":     good("b", "10.0.0.2"),
		"default/other": good("c", "10.0.0.3"),          // key names another Pod
		"default/junk":  []byte("\x01\xff\xff\xff\xff"), // does not decode
		"default/empty": {0x7f},                         // unknown version
	}, snapshot.Meta{ClusterID: "edge-a", LastContact: now, LastFullSync: now})
	st.ReplaceSource("edge-gone", map[string][]byte{"default/x": good("x", "10.0.0.9")}, snapshot.Meta{})
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	rawPut(t, path, "clients", "default/client", []byte("garbage"))

	before := testutil.ToFloat64(snapshotErrors.WithLabelValues("bad_record"))
	withClient(t, deadAPI)
	i, udp, _ := serveSnapshot(t, path)
	r := exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 0)
	if got := addrsOf(r); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Fatalf("answer from a snapshot with bad records: %v", got)
	}
	if got := testutil.ToFloat64(snapshotErrors.WithLabelValues("bad_record")) - before; got != 4 {
		t.Errorf("bad_record counted %v times, want 4", got)
	}
	stopServer(i) // flushes the deletions

	st, _, err = snapshot.Open(path, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	data, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range data["edge-a"].Records {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"default/a", "default/b"}) {
		t.Errorf("records left in the file: %v, want the good ones", keys)
	}
	if _, ok := data["edge-gone"]; ok {
		t.Error("the unconfigured cluster's records are still in the file")
	}
	if _, err := st.LoadClients(func(*clients.Client, []netip.Addr) {}); err != nil || rawLen(t, st, "clients") != 0 {
		t.Errorf("bad client records left in the file (%v)", err)
	}
}

// rawPut writes key = v straight into a typed bucket of the snapshot at
// path, bypassing the store's codecs: what a damaged or hostile file holds.
func rawPut(t *testing.T, path, bucket, key string, v []byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		if b == nil {
			return fmt.Errorf("no bucket %q", bucket)
		}
		return b.Put([]byte(key), v)
	}); err != nil {
		t.Fatal(err)
	}
}

// rawLen is the number of keys in a typed bucket of an open store's file.
func rawLen(t *testing.T, st *snapshot.Store, bucket string) int {
	t.Helper()
	path := st.Path()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	n := 0
	_ = db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket([]byte(bucket)).Stats().KeyN
		return nil
	})
	return n
}

// snapshot.DecodeRecords spreads a cluster's records over several goroutines: every
// good record comes back once, every bad one is reported by key, whatever
// the number of workers (batches of snapshot.DecodeBatch, a partial last batch).
func TestDecodeRecordsInParallel(t *testing.T) {
	const n = 5*snapshot.DecodeBatch + 17
	path := filepath.Join(t.TempDir(), "table.db")
	st, _, err := snapshot.Open(path, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs := make(map[string][]byte, n)
	wantBad := map[string]bool{}
	for i := range n {
		name := fmt.Sprintf("p%05d", i)
		b, err := snapshot.EncodePod(&store.Pod{Common: &store.Common{Cluster: "edge-a", Namespace: "default", Exports: []annotation.Export{{Name: fmt.Sprintf("svc-%d", i/10), Namespace: "default", Cluster: "edge-a"}}}, Name: name, Ready: true,
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})}})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case i%997 == 0:
			b = b[:len(b)/2] // truncated
			wantBad["default/"+name] = true
		case i%991 == 0:
			name += "-renamed" // key names another Pod
			wantBad["default/"+name] = true
		}
		recs["default/"+name] = b
	}
	st.ReplaceSource("edge-a", recs, snapshot.Meta{ClusterID: "edge-a"})
	if err := st.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, procs := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(procs))
			var pods []*store.Pod
			var bad []string
			err := st.Scan(func(cluster string, meta snapshot.Meta, records iter.Seq2[[]byte, []byte]) error {
				var err error
				pods, bad, err = snapshot.DecodeRecords(st, cluster, meta.Records, records)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(pods)+len(bad) != n || len(bad) != len(wantBad) {
				t.Fatalf("%d good, %d bad of %d; want %d bad", len(pods), len(bad), n, len(wantBad))
			}
			for _, k := range bad {
				if !wantBad[k] {
					t.Errorf("good record %s reported bad", k)
				}
			}
			seen := map[string]bool{}
			for _, p := range pods {
				k := p.Namespace + "/" + p.Name
				if seen[k] || wantBad[k] {
					t.Fatalf("%s returned twice or although bad", k)
				}
				seen[k] = true
			}
		})
	}
}

// While a source stays connected and nothing changes its state, its last
// contact still reaches the snapshot (every contactSaveEvery of contact):
// a restart while cut ages its records from when contact was lost, not from
// the sync long before.
func TestSnapshotKeepsLastContactCurrent(t *testing.T) {
	oldCheck, oldSave := snapshotCheckEvery, contactSaveEvery
	snapshotCheckEvery, contactSaveEvery = 20*time.Millisecond, 50*time.Millisecond
	t.Cleanup(func() { snapshotCheckEvery, contactSaveEvery = oldCheck, oldSave })
	c := fake.NewClientset(exporter("a", "10.0.0.1", backendAnno))
	withClient(t, func(string, string) (kubernetes.Interface, error) { return c, nil })
	i, udp, _ := serveSnapshot(t, filepath.Join(t.TempDir(), "table.db"))
	defer stopServer(i)
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1"})
	waitSynced(t)
	m := liveInstance(t)
	stored := func() time.Time {
		var at time.Time
		if err := m.store.Load().Scan(func(cluster string, meta snapshot.Meta, _ iter.Seq2[[]byte, []byte]) error {
			if cluster == "edge-a" {
				at = meta.LastContact
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return at
	}
	var first time.Time
	for deadline := time.Now().Add(5 * time.Second); first.IsZero() && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		first = stored()
	}
	if first.IsZero() {
		t.Fatal("no last contact in the snapshot after the sync")
	}
	// Contact goes on (a fake clientset has no /readyz: its events are the
	// contact), the state stays connected.
	for n := 0; n < 5; n++ {
		time.Sleep(40 * time.Millisecond)
		if _, err := c.CoreV1().Pods("default").Create(context.Background(), exporter(fmt.Sprintf("b%d", n), fmt.Sprintf("10.0.0.%d", n+2), backendAnno), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	want := m.sources[0].LastContact()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got := stored(); got.Sub(first) >= contactSaveEvery && !got.After(want) {
			return
		}
	}
	t.Fatalf("the snapshot's last contact stayed %v (the source's is %v): a connected source's contact is not written", stored(), want)
}
