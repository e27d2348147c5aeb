package snapshot

import (
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

var (
	t0 = time.Date(2026, 11, 1, 10, 0, 0, 123456789, time.UTC)
	t1 = t0.Add(time.Hour)
)

func TestOpenCreatesFileAndDirectory(t *testing.T) {
	var logs logBuf
	path := dbPath(t)
	s, res := mustOpen(t, path, testOptions(&logs))
	defer mustClose(t, s)
	if !res.Created || res.MovedAside != "" {
		t.Errorf("LoadResult = %+v, want Created and nothing moved aside", res)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != fileMode {
		t.Errorf("stat %s = %v, %v; want mode %v", path, fi, err, os.FileMode(fileMode))
	}
	if got := mustLoad(t, s); len(got) != 0 {
		t.Errorf("Load of a new store = %v, want empty", got)
	}
}

// TestRoundTrip applies a sequence of calls, closes, reopens and compares
// what Load returns with the expected content. Each case runs twice: with
// everything in one batch, and with a Flush after every call, so coalescing
// in memory and applying to committed data must agree.
func TestRoundTrip(t *testing.T) {
	type call func(s *Store)
	put := func(src, k, v string) call { return func(s *Store) { s.Put(src, k, []byte(v)) } }
	del := func(src, k string) call { return func(s *Store) { s.Delete(src, k) } }
	meta := func(src, id string, at time.Time) call {
		return func(s *Store) { s.SetMeta(src, Meta{ClusterID: id, LastContact: at, LastFullSync: at, Records: 999}) }
	}
	replace := func(src, id string, kv ...string) call {
		return func(s *Store) {
			recs := make(map[string][]byte)
			for i := 0; i < len(kv); i += 2 {
				recs[kv[i]] = []byte(kv[i+1])
			}
			s.ReplaceSource(src, recs, Meta{ClusterID: id, LastContact: t1, LastFullSync: t1})
		}
	}
	drop := func(src string) call { return func(s *Store) { s.DropSource(src) } }
	src := func(id string, at time.Time, kv ...string) Source {
		recs := make(map[string][]byte)
		for i := 0; i < len(kv); i += 2 {
			recs[kv[i]] = []byte(kv[i+1])
		}
		m := Meta{ClusterID: id, LastContact: at, LastFullSync: at, Records: len(recs)}
		return Source{Meta: m, Records: recs}
	}

	cases := []struct {
		name  string
		calls []call
		want  map[string]Source
	}{{
		name:  "puts and meta",
		calls: []call{put("local", "a", "1"), put("local", "b", "2"), meta("local", "c1", t0), put("peer", "x", "9")},
		want:  map[string]Source{"local": src("c1", t0, "a", "1", "b", "2"), "peer": src("", time.Time{}, "x", "9")},
	}, {
		name:  "later put wins, delete removes",
		calls: []call{put("local", "a", "1"), put("local", "a", "2"), put("local", "b", "x"), del("local", "b"), del("local", "nothere")},
		want:  map[string]Source{"local": src("", time.Time{}, "a", "2")},
	}, {
		name:  "delete then put again",
		calls: []call{put("local", "a", "1"), del("local", "a"), put("local", "a", "3")},
		want:  map[string]Source{"local": src("", time.Time{}, "a", "3")},
	}, {
		name:  "empty value",
		calls: []call{put("local", "a", ""), put("local", "b", "1"), del("local", "b")},
		want:  map[string]Source{"local": src("", time.Time{}, "a", "")},
	}, {
		name: "replace removes absent keys and keeps other sources",
		calls: []call{put("local", "a", "1"), put("local", "b", "2"), put("peer", "x", "9"), meta("peer", "p", t0),
			replace("local", "c1", "b", "22", "c", "3")},
		want: map[string]Source{"local": src("c1", t1, "b", "22", "c", "3"), "peer": src("p", t0, "x", "9")},
	}, {
		name:  "put after replace is kept",
		calls: []call{put("local", "a", "1"), replace("local", "c1", "b", "2"), put("local", "c", "3"), del("local", "b")},
		want:  map[string]Source{"local": src("c1", t1, "c", "3")},
	}, {
		name:  "replace with nothing keeps the source and its meta",
		calls: []call{put("local", "a", "1"), replace("local", "c1")},
		want:  map[string]Source{"local": src("c1", t1)},
	}, {
		name:  "drop removes source and meta",
		calls: []call{put("local", "a", "1"), meta("local", "c1", t0), put("peer", "x", "9"), drop("local")},
		want:  map[string]Source{"peer": src("", time.Time{}, "x", "9")},
	}, {
		name:  "put after drop starts a new source without meta",
		calls: []call{put("local", "a", "1"), meta("local", "c1", t0), drop("local"), put("local", "b", "2")},
		want:  map[string]Source{"local": src("", time.Time{}, "b", "2")},
	}, {
		name:  "meta after drop",
		calls: []call{put("local", "a", "1"), drop("local"), meta("local", "c2", t1)},
		want:  map[string]Source{"local": src("c2", t1)},
	}, {
		name:  "drop of unknown source",
		calls: []call{drop("ghost"), put("local", "a", "1")},
		want:  map[string]Source{"local": src("", time.Time{}, "a", "1")},
	}}
	for _, tc := range cases {
		for _, flushEach := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/flushEach=%v", tc.name, flushEach), func(t *testing.T) {
				var logs logBuf
				o := testOptions(&logs)
				o.BatchInterval = time.Hour // only Flush and Close commit
				path := dbPath(t)
				s, _ := mustOpen(t, path, o)
				for _, c := range tc.calls {
					c(s)
					if flushEach {
						if err := s.Flush(); err != nil {
							t.Fatalf("Flush: %v", err)
						}
					}
				}
				if d := diffSources(reopenLoad(t, s, path, o), tc.want); d != "" {
					t.Error(d)
				}
			})
		}
	}
}

// TestRandomOpsMatchModel drives the store with random calls and random
// Flushes and checks every reload against a plain in-memory model.
func TestRandomOpsMatchModel(t *testing.T) {
	var logs logBuf
	o := testOptions(&logs)
	o.BatchInterval = time.Hour
	path := dbPath(t)
	s, _ := mustOpen(t, path, o)
	r := rand.New(rand.NewPCG(1, 2))
	model := map[string]Source{}
	sources := []string{"local", "peer-a", "peer-b"}
	touch := func(name string) Source {
		src, ok := model[name]
		if !ok {
			src = Source{Records: map[string][]byte{}}
		}
		return src
	}
	for round := 0; round < 20; round++ {
		for i := 0; i < 200; i++ {
			name := sources[r.IntN(len(sources))]
			key := fmt.Sprintf("k%02d", r.IntN(40))
			switch n := r.IntN(100); {
			case n < 55:
				v := []byte(fmt.Sprintf("v%d", r.IntN(1000)))
				s.Put(name, key, v)
				src := touch(name)
				src.Records[key] = v
				model[name] = src
			case n < 80:
				s.Delete(name, key)
				if src, ok := model[name]; ok {
					delete(src.Records, key)
				}
			case n < 88:
				m := Meta{ClusterID: name, LastContact: t0.Add(time.Duration(i) * time.Second)}
				s.SetMeta(name, m)
				src := touch(name)
				src.Meta = m
				model[name] = src
			case n < 95:
				recs := map[string][]byte{}
				for j := r.IntN(10); j > 0; j-- {
					recs[fmt.Sprintf("k%02d", r.IntN(40))] = []byte(fmt.Sprintf("r%d", r.IntN(1000)))
				}
				m := Meta{ClusterID: name, LastFullSync: t1.Add(time.Duration(i) * time.Second)}
				s.ReplaceSource(name, recs, m)
				model[name] = Source{Meta: m, Records: recs}
			default:
				s.DropSource(name)
				delete(model, name)
			}
			if r.IntN(50) == 0 {
				if err := s.Flush(); err != nil {
					t.Fatalf("Flush: %v", err)
				}
			}
		}
		for name, src := range model {
			src.Meta.Records = len(src.Records)
			model[name] = src
		}
		if d := diffSources(reopenLoad(t, s, path, o), model); d != "" {
			t.Fatalf("round %d:\n%s", round, d)
		}
		s, _ = mustOpen(t, path, o)
	}
	mustClose(t, s)
}

func TestBatchingCoalescesBurst(t *testing.T) {
	var logs logBuf
	o := testOptions(&logs)
	o.BatchInterval = 100 * time.Millisecond
	path := dbPath(t)
	s, _ := mustOpen(t, path, o)
	const n = 5000
	start := time.Now()
	for i := 0; i < n; i++ {
		s.Put("local", fmt.Sprintf("key-%05d", i), []byte("value"))
	}
	burst := time.Since(start)
	waitFor(t, 5*time.Second, "pending writes to commit", func() bool {
		st := s.Stats()
		return st.Pending == 0 && st.RecordsWritten == n
	})
	st := s.Stats()
	// One commit per BatchInterval the burst lasted, plus one for the
	// tail; on a quiet machine the burst takes a few ms and this is 1.
	if limit := 2 + int(burst/o.BatchInterval); st.Commits < 1 || int(st.Commits) > limit {
		t.Errorf("%d Puts in a burst of %s took %d commits, want 1 to %d", n, burst, st.Commits, limit)
	}
	t.Logf("%d Puts in %s: %d commits", n, burst, st.Commits)
	if st.WriteErrors != 0 || st.LastError != nil || st.LastWrite.IsZero() {
		t.Errorf("Stats = %+v", st)
	}

	// Rewriting identical values writes nothing, and a key overwritten
	// many times is written once per commit at most, with its last value.
	before := st
	for i := 0; i < 1000; i++ {
		s.Put("local", "hot", []byte(fmt.Sprint(i)))
		s.Put("local", fmt.Sprintf("key-%05d", i), []byte("value"))
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	after := s.Stats()
	written, commits := after.RecordsWritten-before.RecordsWritten, after.Commits-before.Commits
	if written < 1 || written > commits {
		t.Errorf("2000 Puts (1000 of one key, 1000 unchanged) wrote %d records in %d commits, want 1 to %d", written, commits, commits)
	}
	got := reopenLoad(t, s, path, o)
	if len(got["local"].Records) != n+1 || string(got["local"].Records["hot"]) != "999" {
		t.Errorf("after reload: %d records, hot=%q", len(got["local"].Records), got["local"].Records["hot"])
	}
}

func TestPutDoesNotWaitForDisk(t *testing.T) {
	var logs logBuf
	o := testOptions(&logs)
	path := dbPath(t)
	s, _ := mustOpen(t, path, o)
	defer mustClose(t, s)
	// Hold the database write-locked, as a very slow commit or Close
	// would: Puts must still return at once.
	s.dbMu.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 10000; i++ {
			s.Put("local", fmt.Sprint(i), []byte("v"))
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Error("Put blocked while the database was busy")
	}
	s.dbMu.Unlock()
	<-done
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := len(mustLoad(t, s)["local"].Records); got != 10000 {
		t.Errorf("%d records, want 10000", got)
	}
}

func TestConcurrentWriters(t *testing.T) {
	var logs logBuf
	path := dbPath(t)
	o := testOptions(&logs)
	s, _ := mustOpen(t, path, o)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Go(func() {
			name := fmt.Sprintf("src-%d", w)
			for i := 0; i < 500; i++ {
				s.Put(name, fmt.Sprint(i), []byte{byte(i)})
				if i%100 == 0 {
					_ = s.Flush()
					_, _ = s.Load()
					_ = s.Stats()
				}
			}
			s.SetMeta(name, Meta{ClusterID: name})
		})
	}
	wg.Wait()
	got := reopenLoad(t, s, path, o)
	for w := 0; w < 4; w++ {
		name := fmt.Sprintf("src-%d", w)
		if src := got[name]; src.Meta.Records != 500 || src.Meta.ClusterID != name {
			t.Errorf("%s: %+v", name, src.Meta)
		}
	}
}

func TestInvalidCallsAreRejected(t *testing.T) {
	var logs logBuf
	path := dbPath(t)
	o := testOptions(&logs)
	s, _ := mustOpen(t, path, o)
	long := strings.Repeat("k", bolt.MaxKeySize+1)
	s.Put("", "k", []byte("v"))
	s.Put("local", "", []byte("v"))
	s.Put("local", long, []byte("v"))
	s.Delete("local", "")
	s.SetMeta("", Meta{})
	s.DropSource("")
	s.ReplaceSource("local", map[string][]byte{"ok": []byte("1"), "": []byte("bad")}, Meta{ClusterID: "c"})
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush after invalid calls: %v (an invalid call must not poison the batch)", err)
	}
	if st := s.Stats(); st.Rejected != 7 || st.WriteErrors != 0 {
		t.Errorf("Stats = %+v, want 7 rejected and no write errors", st)
	}
	if !logs.contains("ignoring change") || !logs.contains("left out 1 invalid records") {
		t.Errorf("rejections not logged:\n%s", logs.String())
	}
	want := map[string]Source{"local": {Meta: Meta{ClusterID: "c", Records: 1}, Records: map[string][]byte{"ok": []byte("1")}}}
	if d := diffSources(reopenLoad(t, s, path, o), want); d != "" {
		t.Error(d)
	}
}

func TestValuesAreCopied(t *testing.T) {
	var logs logBuf
	path := dbPath(t)
	o := testOptions(&logs)
	o.BatchInterval = time.Hour
	s, _ := mustOpen(t, path, o)
	buf := []byte("first")
	s.Put("local", "a", buf)
	recs := map[string][]byte{"b": []byte("second")}
	s.ReplaceSource("peer", recs, Meta{})
	copy(buf, "XXXXX")
	recs["b"][0] = 'X'
	recs["c"] = []byte("added later")
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	got := mustLoad(t, s)
	if string(got["local"].Records["a"]) != "first" || string(got["peer"].Records["b"]) != "second" || len(got["peer"].Records) != 1 {
		t.Errorf("caller's later changes leaked into the store: %+v", got)
	}
	// Loaded bytes are the caller's: changing them changes nothing stored.
	got["local"].Records["a"][0] = 'Y'
	again := mustLoad(t, s)
	if string(again["local"].Records["a"]) != "first" {
		t.Errorf("Load returned bytes shared with the store")
	}
	mustClose(t, s)
}

func TestCloseIsIdempotentAndLaterCallsAreSafe(t *testing.T) {
	var logs logBuf
	path := dbPath(t)
	o := testOptions(&logs)
	o.BatchInterval = time.Hour
	s, _ := mustOpen(t, path, o)
	s.Put("local", "a", []byte("1")) // pending: Close must write it
	for i := 0; i < 3; i++ {
		if err := s.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	select {
	case <-s.done:
	default:
		t.Error("the batcher goroutine is still running after Close")
	}
	s.Put("local", "b", []byte("2"))
	s.Delete("local", "a")
	s.ReplaceSource("local", nil, Meta{})
	s.SetMeta("local", Meta{})
	s.DropSource("local")
	if err := s.Flush(); !errors.Is(err, ErrClosed) {
		t.Errorf("Flush after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Load(); !errors.Is(err, ErrClosed) {
		t.Errorf("Load after Close = %v, want ErrClosed", err)
	}
	if st := s.Stats(); st.Rejected != 5 || st.Pending != 0 {
		t.Errorf("Stats after Close = %+v, want 5 rejected, none pending", st)
	}
	s2, _ := mustOpen(t, path, o)
	defer mustClose(t, s2)
	got := mustLoad(t, s2)
	if string(got["local"].Records["a"]) != "1" || len(got["local"].Records) != 1 {
		t.Errorf("after Close: %+v, want only a=1 (pending write committed by Close, later calls ignored)", got)
	}
}

// TestSecondOpenTimesOut is the CoreDNS reload sequence: the new instance
// opens the file while the old one still has it.
func TestSecondOpenTimesOut(t *testing.T) {
	var logs logBuf
	path := dbPath(t)
	o := testOptions(&logs)
	o.OpenTimeout = 300 * time.Millisecond
	first, _ := mustOpen(t, path, o)
	first.Put("local", "a", []byte("1"))
	if err := first.Flush(); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	second, _, err := Open(path, o)
	took := time.Since(start)
	if err == nil {
		second.Close()
		t.Fatal("second Open of a locked file succeeded")
	}
	if !errors.Is(err, ErrLocked) || !errors.Is(err, berrors.ErrTimeout) {
		t.Errorf("second Open error = %v, want ErrLocked wrapping bbolt's ErrTimeout", err)
	}
	// bbolt gives up one 50ms retry step early.
	if took < o.OpenTimeout-100*time.Millisecond || took > o.OpenTimeout+2*time.Second {
		t.Errorf("second Open returned after %s, want about OpenTimeout (%s)", took, o.OpenTimeout)
	}
	if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 0 {
		t.Errorf("a locked file was moved aside: %v", aside)
	}
	// The first store is unaffected and still writes.
	first.Put("local", "b", []byte("2"))
	if err := first.Flush(); err != nil {
		t.Fatalf("first store after the failed second Open: %v", err)
	}
	mustClose(t, first)

	second, res := mustOpen(t, path, o)
	defer mustClose(t, second)
	if res.Created || res.MovedAside != "" {
		t.Errorf("LoadResult = %+v", res)
	}
	if got := mustLoad(t, second)["local"]; got.Meta.Records != 2 {
		t.Errorf("after reload: %+v, want 2 records", got)
	}
}

func TestOpenErrorsAreNotCorruption(t *testing.T) {
	var logs logBuf
	dir := t.TempDir()
	// The path is a directory: an I/O error, not a corrupt file.
	path := filepath.Join(dir, "isdir")
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(path, testOptions(&logs)); err == nil {
		t.Fatal("Open of a directory succeeded")
	}
	if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 0 {
		t.Errorf("moved aside on an I/O error: %v", aside)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("directory gone: %v", err)
	}
}

// TestReplaceSourceIsAtomic: a reader never sees a source between its old
// and its new content, in particular never empty.
func TestReplaceSourceIsAtomic(t *testing.T) {
	var logs logBuf
	path := dbPath(t)
	o := testOptions(&logs)
	o.BatchInterval = time.Millisecond
	s, _ := mustOpen(t, path, o)
	defer mustClose(t, s)
	set := func(prefix string) map[string][]byte {
		m := make(map[string][]byte)
		for i := 0; i < 1000; i++ {
			m[fmt.Sprintf("%s%04d", prefix, i)] = []byte(prefix)
		}
		return m
	}
	a, b := set("a"), set("b")
	s.ReplaceSource("local", a, Meta{ClusterID: "a"})
	s.Put("peer", "x", []byte("1"))
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				s.ReplaceSource("local", b, Meta{ClusterID: "b"})
			} else {
				s.ReplaceSource("local", a, Meta{ClusterID: "a"})
			}
			time.Sleep(time.Millisecond)
		}
	})
	loads := 0
	for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); loads++ {
		got := mustLoad(t, s)
		local := got["local"]
		prefix := local.Meta.ClusterID
		if len(local.Records) != 1000 || len(got["peer"].Records) != 1 {
			t.Fatalf("load %d: local has %d records, peer %d", loads, len(local.Records), len(got["peer"].Records))
		}
		for k, v := range local.Records {
			if !strings.HasPrefix(k, prefix) || string(v) != prefix {
				t.Fatalf("load %d: meta says %q but record %q=%q", loads, prefix, k, v)
			}
		}
	}
	close(stop)
	wg.Wait()
	if st := s.Stats(); st.Commits < 3 {
		t.Errorf("only %d commits during the test: replacements did not interleave with loads", st.Commits)
	}
	t.Logf("%d loads, %d commits", loads, s.Stats().Commits)
}

// Scan gives each source's meta (with its record count) and records in key order, stops
// where the caller's loop stops, and returns the caller's error.
func TestScan(t *testing.T) {
	s, _ := mustOpen(t, filepath.Join(t.TempDir(), "s.db"), Options{})
	defer s.Close()
	s.ReplaceSource("edge-a", map[string][]byte{"ns/a": []byte("1"), "ns/b": []byte("2"), "ns/c": []byte("3")},
		Meta{ClusterID: "edge-a", LastContact: t1, LastFullSync: t1})
	s.ReplaceSource("edge-b", nil, Meta{ClusterID: "edge-b"})
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	type seen struct {
		meta Meta
		kv   []string
	}
	got := map[string]seen{}
	err := s.Scan(func(name string, meta Meta, records iter.Seq2[[]byte, []byte]) error {
		x := seen{meta: meta}
		for k, v := range records {
			x.kv = append(x.kv, string(k)+"="+string(v))
			if len(x.kv) == 2 {
				break
			}
		}
		got[name] = x
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if a := got["edge-a"]; a.meta.Records != 3 || a.meta.ClusterID != "edge-a" || !a.meta.LastFullSync.Equal(t1) ||
		!slices.Equal(a.kv, []string{"ns/a=1", "ns/b=2"}) {
		t.Errorf("edge-a: %+v", a)
	}
	if b, ok := got["edge-b"]; !ok || b.meta.Records != 0 || len(b.kv) != 0 {
		t.Errorf("edge-b: %+v (present %v)", b, ok)
	}
	stop := errors.New("stop")
	if err := s.Scan(func(string, Meta, iter.Seq2[[]byte, []byte]) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("Scan returned %v, want the callback's error", err)
	}
}

// Guard turns a panic (as a fault in the mapped file would be) into an
// error wrapping ErrDamaged, and the store refuses reads after it.
func TestGuard(t *testing.T) {
	s, _ := mustOpen(t, filepath.Join(t.TempDir(), "s.db"), Options{})
	defer s.Close()
	if err := s.Guard(func() {}); err != nil {
		t.Fatalf("a calm f: %v", err)
	}
	err := s.Guard(func() { panic("unexpected fault address") })
	if !errors.Is(err, ErrDamaged) {
		t.Fatalf("Guard returned %v, want ErrDamaged", err)
	}
	if _, err := s.Load(); !errors.Is(err, ErrDamaged) {
		t.Errorf("Load after a fault: %v, want ErrDamaged", err)
	}
}
