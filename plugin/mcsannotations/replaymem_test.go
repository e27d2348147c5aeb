package mcsannotations

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	coretest "github.com/coredns/coredns/test"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
	bolt "go.etcd.io/bbolt"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// The relay's replay memory is loaded from the snapshot before the hubs
// are read: a hub presenting a statement older than the one remembered is
// refused (and counted) from the start. What the relay does not take (an
// expired tombstone, an origin without a key) is forgotten from the file, a
// replay entry that does not decode is skipped and counted, and what the
// relay remembers is written back as it changes.
func TestHubsReplayMemoryFromSnapshot(t *testing.T) {
	keys := t.TempDir()
	writeKey(t, keys, "edge-a")
	originKey := writeKey(t, keys, "edge-o")
	snap := filepath.Join(t.TempDir(), "table.db")
	corefile := strings.ReplaceAll(hubsCorefile, "{KEYS}", keys)
	corefile = strings.Replace(corefile, "        verify", "        snapshot "+snap+"\n        verify", 1)
	export := `{"services":[{"name":"backend","ports":[{"name":"http","port":80,"targetPort":8080}]}]}`

	// The file as a previous run left it: backend-1 accepted at Seq 20,
	// a tombstone past its time, an origin the edge has no key for, and
	// a damaged entry.
	st, _, err := snapshot.Open(snap, snapshot.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	st.PutReplay("edge-o", snapshot.Replay{Pod: "default/backend-1", Seq: 20, Hash: 1})
	st.PutReplay("edge-o", snapshot.Replay{Pod: "default/old", Seq: 5, Gone: time.Now().Add(-relay.TombstoneTTL - time.Hour)})
	st.PutReplay("edge-x", snapshot.Replay{Pod: "default/p", Seq: 5})
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(snap, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("replay")).Bucket([]byte("edge-o")).Put([]byte("default/bad"), []byte{0xff})
	}); err != nil {
		t.Fatal(err)
	}
	_ = db.Close()

	// hub-1 presents backend-1 at Seq 10 (older), and backend-2 (new).
	hub := fake.NewClientset(relaySliceObject("default", "backend-edge-o-1", "edge-o", export,
		relayedPod(originKey, "edge-o", "default", "backend-1", "10.7.0.1", true, 10, export),
		relayedPod(originKey, "edge-o", "default", "backend-2", "10.7.0.2", true, 10, export)),
		originLease("hub-1", "edge-o", source.Connected, time.Now()))
	clients := map[string]kubernetes.Interface{"/local": fake.NewClientset(), "/hub-1": hub, "/hub-2": fake.NewClientset()}
	withClient(t, func(kubeconfig, _ string) (kubernetes.Interface, error) { return clients[kubeconfig], nil })
	bad0 := testutil.ToFloat64(snapshotErrors.WithLabelValues("bad_record"))
	replayed0 := testutil.ToFloat64(relayRefused.WithLabelValues("hub-1", string(relay.ReasonReplayed)))
	i, udp, _, err := coretest.CoreDNSServerAndPorts(corefile)
	if err != nil {
		t.Fatal(err)
	}
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.7.0.2"})
	waitSynced(t)
	if n := testutil.ToFloat64(relayRefused.WithLabelValues("hub-1", string(relay.ReasonReplayed))) - replayed0; n != 1 {
		t.Errorf("relay_refused_total{hub-1, replayed} grew by %v, want 1 (backend-1 at Seq 10)", n)
	}
	if n := testutil.ToFloat64(snapshotErrors.WithLabelValues("bad_record")) - bad0; n != 1 {
		t.Errorf("snapshot_errors_total{bad_record} grew by %v, want 1", n)
	}
	r := exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", dns.TypeA, 0)
	if got := addrsOf(r); !slices.Equal(got, []string{"10.7.0.2"}) {
		t.Errorf("answer %v, want only backend-2", got)
	}
	stopServer(i)

	st, _, err = snapshot.Open(snap, snapshot.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got := map[string][]string{}
	if _, err := st.LoadReplay(func(origin string, mem []snapshot.Replay) {
		for _, m := range mem {
			got[origin] = append(got[origin], m.Pod)
			if m.Pod == "default/backend-1" && m.Seq != 20 {
				t.Errorf("backend-1 remembered at Seq %d, want 20", m.Seq)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !slices.Equal(got["edge-o"], []string{"default/backend-1", "default/backend-2"}) {
		t.Errorf("replay memory in the file after the run: %v, want edge-o's backend-1 and backend-2", got)
	}
}
