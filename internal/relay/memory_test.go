package relay

import (
	"crypto/ed25519"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// The statement hash is the same in every process: the first 8 bytes of
// SHA-256 over each string after its length as 8 bytes big-endian. The
// constant is that function computed outside Go:
//
//	printf '\0\0\0\0\0\0\0\x02ab\0\0\0\0\0\0\0\x01c' | sha256sum | cut -c1-16
func TestStatementHashStable(t *testing.T) {
	if got, want := statementHash("ab", "c"), uint64(0x601d5476e2ccfe2c); got != want {
		t.Errorf("statementHash(ab, c) = %#x, want %#x", got, want)
	}
	if statementHash("a", "bc") == statementHash("ab", "c") {
		t.Errorf("the strings' bounds are not hashed")
	}
}

// journal keeps an origin's memory as Events.Remembered reports it, as the
// snapshot does.
type journal struct {
	mu  sync.Mutex
	mem map[string]map[string]Remembered // origin → Pod → memory
}

func (j *journal) remembered(origin string, set []Remembered, forgotten []string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.mem == nil {
		j.mem = map[string]map[string]Remembered{}
	}
	m := j.mem[origin]
	if m == nil {
		m = map[string]Remembered{}
		j.mem[origin] = m
	}
	for _, r := range set {
		m[r.Pod] = r
	}
	for _, k := range forgotten {
		delete(m, k)
	}
}

func (j *journal) of(origin string) []Remembered {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.SortedFunc(maps.Values(j.mem[origin]), func(a, b Remembered) int { return cmpString(a.Pod, b.Pod) })
}

// startSeeded starts a Relay over one fake hub, its replay memory seeded
// with mem for origin-a first.
func startSeeded(t *testing.T, st *store.Store, cfg Config, mem []Remembered, h *fakeHub) (*Relay, []string) {
	t.Helper()
	r := New(st, cfg)
	dropped := r.SeedMemory("origin-a", mem)
	if err := r.AddHub("hub-0", h, ""); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })
	eventually(t, "watches", h.watching)
	eventually(t, "synced", func() bool { return synced(r) })
	return r, dropped
}

// The replay memory survives a restart: what a Relay reported of it
// (Events.Remembered, what the snapshot journals) is its Memory, and a new
// Relay seeded with it refuses a statement older than one the first
// accepted, of a held Pod and of a deleted one, as the first would; an
// unseeded one takes them (the gap the memory closes). A tombstone past
// TombstoneTTL is forgotten on load: its Pod's older statement is taken.
func TestSeededMemoryRefusesReplays(t *testing.T) {
	pub, priv := genKey(t)
	keys := map[string]ed25519.PublicKey{"origin-a": pub}
	at := func(name string, seq uint64, ip string) *discoveryv1.EndpointSlice {
		return slice("prod", name, "origin-a", nil, stmt{origin: "origin-a", ns: "prod", name: name, ip: ip, ready: true, seq: seq}.pod(priv))
	}

	// The first process: p and q accepted at Seq 10, then q deleted.
	var j journal
	st := store.New()
	h := newFakeHub(at("p", 10, "10.0.0.10"), at("q", 10, "10.0.1.10"))
	r1 := start(t, st, Config{Keys: keys, Events: Events{Remembered: j.remembered}}, h)
	eventually(t, "p and q", func() bool { return len(records(st, "origin-a")) == 2 })
	if err := h.DiscoveryV1().EndpointSlices("prod").Delete(t.Context(), "q", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "q gone", func() bool { return len(records(st, "origin-a")) == 1 })
	eventually(t, "the reports match the memory", func() bool {
		mem := r1.Memory("origin-a")
		return len(mem) == 2 && !mem[1].Gone.IsZero() && slices.Equal(j.of("origin-a"), mem)
	})
	mem := r1.Memory("origin-a")
	if mem[0].Pod != "prod/p" || mem[0].Seq != 10 || !mem[0].Gone.IsZero() || mem[1].Pod != "prod/q" || mem[1].Seq != 10 {
		t.Fatalf("memory %+v", mem)
	}
	_ = r1.Stop()

	expired := slices.Clone(mem)
	expired[1].Gone = time.Now().Add(-TombstoneTTL - time.Minute)
	replayedP := "hub-0 origin-a prod/p replayed"
	replayedQ := "hub-0 origin-a prod/q replayed"
	for _, tc := range []struct {
		name    string
		mem     []Remembered
		dropped []string
		want    []string // origin-a's records once the hub presents p and q at Seq 5
		refused []string
	}{
		{"seeded", mem, nil, nil, []string{replayedP, replayedQ}},
		{"not seeded", nil, nil, []string{rec("prod", "p", "10.0.0.5", true, "backend"), rec("prod", "q", "10.0.1.5", true, "backend")}, nil},
		{"tombstone expired", expired, []string{"prod/q"}, []string{rec("prod", "q", "10.0.1.5", true, "backend")}, []string{replayedP}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ref refusals
			st := store.New()
			h := newFakeHub()
			r, dropped := startSeeded(t, st, Config{Keys: keys, Events: ref.events()}, tc.mem, h)
			if !slices.Equal(dropped, tc.dropped) {
				t.Errorf("SeedMemory dropped %q, want %q", dropped, tc.dropped)
			}
			for _, s := range []*discoveryv1.EndpointSlice{at("p", 5, "10.0.0.5"), at("q", 5, "10.0.1.5")} {
				if _, err := h.DiscoveryV1().EndpointSlices("prod").Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, fmt.Sprintf("records %q, refusals %q", tc.want, tc.refused), func() bool {
				return slices.Equal(records(st, "origin-a"), tc.want) && slices.Equal(ref.list(), tc.refused)
			})
			// The newer statement is taken, seeded or not.
			if _, err := h.DiscoveryV1().EndpointSlices("prod").Update(t.Context(), at("p", 11, "10.0.0.11"), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "p at Seq 11", func() bool {
				return slices.Contains(records(st, "origin-a"), rec("prod", "p", "10.0.0.11", true, "backend"))
			})
			if m := r.Memory("origin-a"); len(m) == 0 || m[0].Pod != "prod/p" || m[0].Seq != 11 {
				t.Errorf("memory after Seq 11: %+v", m)
			}
		})
	}
}

// SeedMemory takes what verify would remember, bounded as the memory is:
// nothing without verify or for an origin without a key, no entry whose Pod
// is no "namespace/name", no tombstone past TombstoneTTL, and at most
// ingest.MaxObjects Pods, the held ones first, then the newest tombstones.
// A Pod already remembered keeps a newer statement.
func TestSeedMemoryBounded(t *testing.T) {
	pub, _ := genKey(t)
	now := time.Now()
	mem := []Remembered{
		{Pod: "ns/live", Seq: 3, Hash: 1},
		{Pod: "ns/old", Seq: 3, Gone: now.Add(-TombstoneTTL - time.Minute)},
		{Pod: "ns/young", Seq: 3, Gone: now.Add(-time.Minute)},
		{Pod: "ns/newer", Seq: 3, Gone: now.Add(-time.Second)},
		{Pod: "no-namespace", Seq: 3},
		{Pod: "ns/Not_A_Name", Seq: 3},
	}
	pods := func(m []Remembered) []string {
		var out []string
		for _, r := range m {
			out = append(out, r.Pod)
		}
		return out
	}
	for _, cfg := range []Config{{}, {Keys: map[string]ed25519.PublicKey{"origin-b": pub}}, {Keys: map[string]ed25519.PublicKey{"origin-a": pub}, Local: "origin-a"}} {
		r := New(store.New(), cfg)
		if got := r.SeedMemory("origin-a", mem); len(got) != len(mem) || len(r.Memory("origin-a")) != 0 {
			t.Errorf("config %+v: dropped %q, remembers %+v; want everything dropped", cfg, got, r.Memory("origin-a"))
		}
	}

	defer func(n int) { ingest.MaxObjects = n }(ingest.MaxObjects)
	ingest.MaxObjects = 2
	r := New(store.New(), Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub}})
	dropped := r.SeedMemory("origin-a", mem)
	slices.Sort(dropped)
	if want := []string{"no-namespace", "ns/Not_A_Name", "ns/old", "ns/young"}; !slices.Equal(dropped, want) {
		t.Errorf("dropped %q, want %q", dropped, want)
	}
	if got, want := pods(r.Memory("origin-a")), []string{"ns/live", "ns/newer"}; !slices.Equal(got, want) {
		t.Errorf("remembers %q, want %q", got, want)
	}
	// Seeded again (a snapshot opened late): a newer statement replaces,
	// an older one does not; a future time of going counts as now.
	r.SeedMemory("origin-a", []Remembered{{Pod: "ns/live", Seq: 2}, {Pod: "ns/newer", Seq: 4, Gone: now.Add(time.Hour)}})
	got := r.Memory("origin-a")
	if got[0].Seq != 3 || got[0].Hash != 1 || got[1].Seq != 4 || got[1].Gone.After(time.Now()) {
		t.Errorf("after a second seed: %+v", got)
	}
}

// SeedSnapshot says what it took of a snapshot's replay memory in one line
// however many origins it holds, and each origin's part with debug: an
// origin without a key is forgotten, an expired tombstone too.
func TestSeedSnapshotLogsOneLine(t *testing.T) {
	pub, _ := genKey(t)
	path := filepath.Join(t.TempDir(), "table.db")
	st, _, err := snapshot.Open(path, snapshot.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, o := range []string{"origin-a", "origin-b"} {
		st.PutReplay(o, snapshot.Replay{Pod: "prod/web-0", Seq: 20, Hash: 1})
		st.PutReplay(o, snapshot.Replay{Pod: "prod/old", Seq: 5, Gone: time.Now().Add(-TombstoneTTL - time.Hour)})
	}
	st.PutReplay("origin-x", snapshot.Replay{Pod: "prod/p", Seq: 5})
	if err := st.Flush(); err != nil {
		t.Fatal(err)
	}
	r := New(store.New(), Config{Keys: map[string]ed25519.PublicKey{"origin-a": pub, "origin-b": pub}})
	var info, debug []string
	logTo := func(lines *[]string) func(string, ...any) {
		return func(format string, args ...any) { *lines = append(*lines, fmt.Sprintf(format, args...)) }
	}
	if bad, err := r.SeedSnapshot(st, logTo(&info), logTo(&debug)); bad != 0 || err != nil {
		t.Fatalf("SeedSnapshot: %d bad, %v", bad, err)
	}
	want := "snapshot: remembering 2 relayed statements of 2 origins (replay memory), 2 forgotten; forgetting the replay memory of 1 origins (not relayed under verify, or nothing left to remember)"
	if len(info) != 1 || info[0] != want {
		t.Errorf("info lines %q, want one: %q", info, want)
	}
	if len(debug) != 3 {
		t.Errorf("debug lines %q, want one per origin", debug)
	}
	if len(r.Memory("origin-a")) != 1 || len(r.Memory("origin-x")) != 0 {
		t.Errorf("memory of origin-a %v, of origin-x %v: want web-0, and none", r.Memory("origin-a"), r.Memory("origin-x"))
	}
}
