package snapshot

import (
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// loadReplay returns what LoadReplay hands out, by origin, and its bad count.
func loadReplay(t *testing.T, s *Store) (map[string][]Replay, int) {
	t.Helper()
	got := map[string][]Replay{}
	bad, err := s.LoadReplay(func(origin string, mem []Replay) { got[origin] = mem })
	if err != nil {
		t.Fatalf("LoadReplay: %v", err)
	}
	return got, bad
}

func equalReplay(a, b []Replay) bool {
	return slices.EqualFunc(a, b, func(x, y Replay) bool {
		return x.Pod == y.Pod && x.Seq == y.Seq && x.Hash == y.Hash && x.Gone.Equal(y.Gone)
	})
}

// The replay memory round-trips through the file: puts, deletes and a
// replacement are journaled, batched, and load after a reopen as written
// (times to the nanosecond); a replacement with nothing drops the origin;
// the records of the sources are untouched.
func TestReplayRoundTrip(t *testing.T) {
	path := dbPath(t)
	var l logBuf
	s, _ := mustOpen(t, path, testOptions(&l))
	gone := time.Unix(1_700_000_000, 123456789)
	p := Replay{Pod: "prod/p", Seq: 1_700_000_000_123, Hash: 0xfedcba9876543210}
	q := Replay{Pod: "prod/q", Seq: 7, Hash: 1, Gone: gone}
	s.Put("edge-o", "prod/p", []byte("record"))
	s.PutReplay("edge-o", p)
	s.PutReplay("edge-o", q)
	s.PutReplay("edge-o", Replay{Pod: "prod/r", Seq: 1})
	s.DeleteReplay("edge-o", "prod/r")
	s.ReplaceReplay("edge-x", []Replay{{Pod: "ns/a", Seq: 2}})
	s.ReplaceReplay("edge-y", []Replay{{Pod: "ns/a", Seq: 2}})
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.DropReplay("edge-y")
	mustClose(t, s)

	s, res := mustOpen(t, path, testOptions(&l))
	defer mustClose(t, s)
	if res.MovedAside != "" || res.Created {
		t.Fatalf("reopen: %+v", res)
	}
	got, bad := loadReplay(t, s)
	if bad != 0 || len(got) != 2 || !equalReplay(got["edge-o"], []Replay{p, q}) || !equalReplay(got["edge-x"], []Replay{{Pod: "ns/a", Seq: 2}}) {
		t.Errorf("loaded %+v (bad %d)", got, bad)
	}
	if srcs := mustLoad(t, s); string(srcs["edge-o"].Records["prod/p"]) != "record" {
		t.Errorf("sources %+v", srcs)
	}
}

// A file without the replay bucket (written before it existed) opens as it
// is, its records load, its memory is empty, and the first change makes
// the bucket.
func TestReplayOldFileLoads(t *testing.T) {
	path := dbPath(t)
	writeStore(t, path, 3)
	boltUpdate(t, path, func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte(replayBucket)) })
	var l logBuf
	s, res := mustOpen(t, path, testOptions(&l))
	if res.MovedAside != "" || res.Created {
		t.Fatalf("a file without the replay bucket was not kept: %+v\n%s", res, l.String())
	}
	if got, bad := loadReplay(t, s); len(got) != 0 || bad != 0 {
		t.Errorf("memory of an old file: %+v, bad %d", got, bad)
	}
	s.PutReplay("edge-o", Replay{Pod: "prod/p", Seq: 3})
	got := reopenLoad(t, s, path, testOptions(&l))
	if len(got["local"].Records) != 3 {
		t.Errorf("records of an old file: %d", len(got["local"].Records))
	}
	s, _ = mustOpen(t, path, testOptions(&l))
	defer mustClose(t, s)
	if got, _ := loadReplay(t, s); !equalReplay(got["edge-o"], []Replay{{Pod: "prod/p", Seq: 3}}) {
		t.Errorf("memory written to an old file: %+v", got)
	}

	// A schema 1 file too.
	s1, _ := mustOpen(t, copySchema1(t), testOptions(&l))
	defer mustClose(t, s1)
	if got, bad := loadReplay(t, s1); len(got) != 0 || bad != 0 {
		t.Errorf("memory of a schema 1 file: %+v, bad %d", got, bad)
	}
}

// Entries that do not decode (a bad key, an unknown format, a short or long
// value, a nested bucket, a value where an origin's bucket belongs) are
// skipped, logged and counted, and forgotten from the file; the good ones
// and the records load; the file is not moved aside.
func TestReplayCorruptEntrySkipped(t *testing.T) {
	path := dbPath(t)
	writeStore(t, path, 2)
	var l logBuf
	s, _ := mustOpen(t, path, testOptions(&l))
	good := Replay{Pod: "prod/good", Seq: 9, Hash: 42}
	s.PutReplay("edge-o", good)
	s.PutReplay("edge-n", good)
	mustClose(t, s)
	valid := EncodeReplay(good)
	boltUpdate(t, path, func(tx *bolt.Tx) error {
		top := tx.Bucket([]byte(replayBucket))
		ob := top.Bucket([]byte("edge-o"))
		for k, v := range map[string][]byte{
			"no-slash":   valid,
			"prod/fmt":   append([]byte{9}, valid[1:]...),
			"prod/short": valid[:5],
			"prod/long":  append(slices.Clone(valid), 0),
			"prod/empty": {},
		} {
			if err := ob.Put([]byte(k), v); err != nil {
				return err
			}
		}
		if _, err := top.Bucket([]byte("edge-n")).CreateBucket([]byte("prod/nested")); err != nil {
			return err
		}
		return top.Put([]byte("edge-v"), []byte("not a bucket"))
	})

	s, res := mustOpen(t, path, testOptions(&l))
	if res.MovedAside != "" {
		t.Fatalf("moved aside for a bad replay entry: %+v", res)
	}
	got, bad := loadReplay(t, s)
	if bad != 7 || len(got) != 2 || !equalReplay(got["edge-o"], []Replay{good}) || !equalReplay(got["edge-n"], []Replay{good}) {
		t.Errorf("loaded %+v, bad %d; want the good entries and 7 bad", got, bad)
	}
	if !l.contains("prod/fmt") || !l.contains("edge-v") || !l.contains("prod/nested") {
		t.Errorf("not logged:\n%s", l.String())
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("forgetting the bad entries: %v", err)
	}
	if srcs := reopenLoad(t, s, path, testOptions(&l)); len(srcs["local"].Records) != 2 {
		t.Errorf("records: %+v", srcs)
	}
	s, _ = mustOpen(t, path, testOptions(&l))
	defer mustClose(t, s)
	got, bad = loadReplay(t, s)
	if bad != 0 || len(got) != 2 || !equalReplay(got["edge-o"], []Replay{good}) || !equalReplay(got["edge-n"], []Replay{good}) {
		t.Errorf("after forgetting: %+v, bad %d", got, bad)
	}
}
