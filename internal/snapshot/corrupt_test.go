package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// writeStore creates a real snapshot at path with n records in "local".
func writeStore(t *testing.T, path string, n int) {
	t.Helper()
	var logs logBuf
	s, _ := mustOpen(t, path, testOptions(&logs))
	recs := make(map[string][]byte, n)
	for i := 0; i < n; i++ {
		recs[fmt.Sprintf("default/svc-%05d", i)] = bytes.Repeat([]byte{byte('a' + i%26)}, 120)
	}
	s.ReplaceSource("local", recs, Meta{ClusterID: "c1", LastContact: t0})
	mustClose(t, s)
}

// boltUpdate opens path with bbolt directly and runs fn in an Update.
func boltUpdate(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func truncateTo(t *testing.T, path string, size func(old int64) int64) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size(fi.Size())); err != nil {
		t.Fatal(err)
	}
}

// overwriteLeafPage replaces the first leaf page of the records bucket with
// random bytes, keeping the file's size and meta pages intact.
func overwriteLeafPage(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true, PreLoadFreelist: true})
	if err != nil {
		t.Fatal(err)
	}
	var leaf int = -1
	pageSize := db.Info().PageSize
	_ = db.View(func(tx *bolt.Tx) error {
		for id := 2; ; id++ {
			p, err := tx.Page(id)
			if err != nil || p == nil {
				return err
			}
			if p.Type == "leaf" && p.Count > 20 { // a records page, not a bucket's
				leaf = id
				return nil
			}
		}
	})
	db.Close()
	if leaf < 0 {
		t.Fatal("no leaf page found")
	}
	junk := make([]byte, pageSize)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range junk {
		junk[i] = byte(r.Uint32())
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(junk, int64(leaf*pageSize)); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

func TestUnusableFileIsMovedAside(t *testing.T) {
	random := func(n int) []byte {
		b := make([]byte, n)
		r := rand.New(rand.NewPCG(5, 6))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	cases := []struct {
		name   string
		make   func(t *testing.T, path string)
		reason string // substring of LoadResult.Reason
	}{{
		name:   "garbage",
		make:   func(t *testing.T, path string) { os.WriteFile(path, random(64<<10), 0o600) },
		reason: "invalid database",
	}, {
		name:   "short garbage",
		make:   func(t *testing.T, path string) { os.WriteFile(path, []byte("not a database\n"), 0o600) },
		reason: "invalid database",
	}, {
		name: "truncated to half",
		make: func(t *testing.T, path string) {
			writeStore(t, path, 5000)
			truncateTo(t, path, func(n int64) int64 { return n / 2 })
		},
		reason: "", // bbolt trips over the freelist page before the size check runs
	}, {
		name: "truncated inside the second meta page",
		make: func(t *testing.T, path string) {
			writeStore(t, path, 100)
			truncateTo(t, path, func(int64) int64 { return 5000 })
		},
		reason: "file size too small",
	}, {
		name: "truncated after the meta pages",
		make: func(t *testing.T, path string) {
			writeStore(t, path, 5000)
			truncateTo(t, path, func(int64) int64 { return 3 * int64(os.Getpagesize()) })
		},
		reason: "", // bbolt or the size check, depending on page layout
	}, {
		name: "damaged records page",
		make: func(t *testing.T, path string) {
			writeStore(t, path, 5000)
			overwriteLeafPage(t, path)
		},
		reason: "",
	}, {
		name: "unknown schema version",
		make: func(t *testing.T, path string) {
			writeStore(t, path, 10)
			boltUpdate(t, path, func(tx *bolt.Tx) error {
				return tx.Bucket([]byte(metaBucket)).Put([]byte(schemaVersionKey), []byte("3"))
			})
		},
		reason: `unknown schema version "3"`,
	}, {
		name: "no schema version",
		make: func(t *testing.T, path string) {
			writeStore(t, path, 10)
			boltUpdate(t, path, func(tx *bolt.Tx) error {
				return tx.Bucket([]byte(metaBucket)).Delete([]byte(schemaVersionKey))
			})
		},
		reason: "no schema version",
	}, {
		name: "bbolt file of another program",
		make: func(t *testing.T, path string) {
			boltUpdate(t, path, func(tx *bolt.Tx) error {
				b, err := tx.CreateBucket([]byte("foo"))
				if err != nil {
					return err
				}
				return b.Put([]byte("k"), []byte("v"))
			})
		},
		reason: `no "meta" bucket`,
	}, {
		name: "bad source meta",
		make: func(t *testing.T, path string) {
			writeStore(t, path, 10)
			boltUpdate(t, path, func(tx *bolt.Tx) error {
				return tx.Bucket([]byte(sourcesBucket)).Bucket([]byte("local")).Put([]byte(sourceMetaKey), []byte("{not json"))
			})
		},
		reason: `source "local": meta`,
	}, {
		name: "records is not a bucket",
		make: func(t *testing.T, path string) {
			boltUpdate(t, path, func(tx *bolt.Tx) error {
				if err := initSchema(tx); err != nil {
					return err
				}
				sb, err := tx.Bucket([]byte(sourcesBucket)).CreateBucket([]byte("local"))
				if err != nil {
					return err
				}
				return sb.Put([]byte(recordsBucket), []byte("x"))
			})
		},
		reason: "is not a bucket",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var logs logBuf
			path := filepath.Join(t.TempDir(), "mcs.db")
			tc.make(t, path)
			bad, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}

			s, res, err := Open(path, testOptions(&logs))
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if !res.Created || res.MovedAside == "" || !strings.Contains(res.Reason, tc.reason) {
				t.Errorf("LoadResult = %+v, want Created, moved aside, reason containing %q", res, tc.reason)
			}
			if !strings.HasPrefix(filepath.Base(res.MovedAside), "mcs.db.corrupt-") {
				t.Errorf("moved aside to %q, want mcs.db.corrupt-<time>", res.MovedAside)
			}
			if aside, err := os.ReadFile(res.MovedAside); err != nil || !bytes.Equal(aside, bad) {
				t.Errorf("moved-aside file: err=%v, same bytes=%v", err, bytes.Equal(aside, bad))
			}
			if !logs.contains("moved it aside to " + res.MovedAside) {
				t.Errorf("not logged:\n%s", logs.String())
			}
			if got := mustLoad(t, s); len(got) != 0 {
				t.Errorf("Load after moving aside = %d sources, want none", len(got))
			}
			// The fresh store works and survives a reopen.
			s.Put("local", "a", []byte("1"))
			got := reopenLoad(t, s, path, testOptions(&logs))
			if string(got["local"].Records["a"]) != "1" {
				t.Errorf("fresh store after reopen: %+v", got)
			}
		})
	}
}

func TestZeroLengthFileIsInitialised(t *testing.T) {
	var logs logBuf
	path := filepath.Join(t.TempDir(), "mcs.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, res := mustOpen(t, path, testOptions(&logs))
	if !res.Created || res.MovedAside != "" || !strings.Contains(res.Reason, "empty") {
		t.Errorf("LoadResult = %+v, want Created, nothing moved aside, reason mentioning the empty file", res)
	}
	if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 0 {
		t.Errorf("an empty file has nothing to keep, but was moved aside: %v", aside)
	}
	s.Put("local", "a", []byte("1"))
	if got := reopenLoad(t, s, path, testOptions(&logs)); string(got["local"].Records["a"]) != "1" {
		t.Errorf("after reopen: %+v", got)
	}
}

// TestNewFileWithoutSchemaIsInitialised covers a crash between bbolt's
// initialisation of a new file and the commit of our schema: the file is a
// valid, empty bbolt database.
func TestNewFileWithoutSchemaIsInitialised(t *testing.T) {
	var logs logBuf
	path := filepath.Join(t.TempDir(), "mcs.db")
	boltUpdate(t, path, func(*bolt.Tx) error { return nil })
	s, res := mustOpen(t, path, testOptions(&logs))
	defer mustClose(t, s)
	if !res.Created || res.MovedAside != "" {
		t.Errorf("LoadResult = %+v", res)
	}
}

func TestMoveAsideNamesDoNotCollide(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mcs.db")
	var names []string
	for i := 0; i < 3; i++ {
		if err := os.WriteFile(path, []byte(fmt.Sprint("garbage ", i)), 0o600); err != nil {
			t.Fatal(err)
		}
		aside, err := moveAside(path)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, aside)
	}
	for i, name := range names {
		if b, err := os.ReadFile(name); err != nil || string(b) != fmt.Sprint("garbage ", i) {
			t.Errorf("%s: %q, %v", name, b, err)
		}
	}
}

// TestFileTruncatedUnderRunningStore: damage after Open must give errors,
// not crash the server or hang it, whether a read or a write hits it first.
func TestFileTruncatedUnderRunningStore(t *testing.T) {
	for _, firstHit := range []string{"read", "write"} {
		t.Run(firstHit, func(t *testing.T) {
			var logs logBuf
			path := filepath.Join(t.TempDir(), "mcs.db")
			writeStore(t, path, 5000)
			o := testOptions(&logs)
			o.BatchInterval = time.Hour
			s, _ := mustOpen(t, path, o)
			truncateTo(t, path, func(int64) int64 { return 3 * int64(os.Getpagesize()) })

			if firstHit == "read" {
				if _, err := s.Load(); !errors.Is(err, ErrDamaged) {
					t.Errorf("Load of a file truncated underneath = %v, want ErrDamaged", err)
				}
			}
			// Enough changes to touch many pages.
			for i := 0; i < 200; i++ {
				s.Put("local", fmt.Sprintf("default/svc-%05d", i*20), []byte("new"))
			}
			if err := s.Flush(); !errors.Is(err, ErrDamaged) {
				t.Errorf("Flush = %v, want ErrDamaged", err)
			}
			if _, err := s.Load(); !errors.Is(err, ErrDamaged) {
				t.Errorf("Load = %v, want ErrDamaged", err)
			}
			if st := s.Stats(); st.Pending != 200 || !errors.Is(st.LastError, ErrDamaged) {
				t.Errorf("Stats = %+v, want the changes kept pending and ErrDamaged", st)
			}
			if err := s.Close(); !errors.Is(err, ErrDamaged) {
				t.Errorf("Close = %v, want ErrDamaged", err)
			}
			if n := strings.Count(logs.String(), "no further reads or writes"); n != 1 {
				t.Errorf("damage logged %d times, want once:\n%s", n, logs.String())
			}
			// Close released the file lock, so the next Open (a reload)
			// gets the file, finds it damaged and moves it aside.
			s2, res, err := Open(path, o)
			if err != nil {
				t.Fatalf("Open after damage: %v", err)
			}
			if res.MovedAside == "" {
				t.Errorf("reopen: %+v, want the damaged file moved aside", res)
			}
			mustClose(t, s2)
		})
	}
}

// Repeated damage keeps only the newest KeepAside files moved aside, and
// the newest is the last damaged file.
func TestMovedAsideFilesArePruned(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mcs.db")
	var logs logBuf
	for i := range KeepAside + 3 {
		if err := os.WriteFile(path, []byte(fmt.Sprint("garbage ", i)), 0o600); err != nil {
			t.Fatal(err)
		}
		s, res, err := Open(path, Options{Logf: logs.Logf})
		if err != nil || res.MovedAside == "" {
			t.Fatalf("open %d: %+v, %v", i, res, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	names, _ := filepath.Glob(path + ".corrupt-*")
	if len(names) != KeepAside {
		t.Fatalf("%d files kept, want %d: %v", len(names), KeepAside, names)
	}
	newest := false
	for _, n := range names {
		if b, _ := os.ReadFile(n); string(b) == fmt.Sprint("garbage ", KeepAside+2) {
			newest = true
		}
		if b, _ := os.ReadFile(n); string(b) == "garbage 0" {
			t.Errorf("the oldest file %s was kept", n)
		}
	}
	if !newest {
		t.Error("the newest damaged file was not kept")
	}
	if !logs.contains("an older file moved aside") {
		t.Error("no log line for the removal")
	}
}
