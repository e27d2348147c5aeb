package snapshot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestOpenReadOnlyWhileOpen: a tool reads the file while the plugin's store
// holds its lock and keeps committing; it reads a committed state (a copy,
// removed on Close), and changes nothing.
func TestOpenReadOnlyWhileOpen(t *testing.T) {
	var l logBuf
	path := dbPath(t)
	w, _ := mustOpen(t, path, testOptions(&l))
	defer mustClose(t, w)
	w.ReplaceSource("edge-a", map[string][]byte{"ns/a": []byte("1"), "ns/b": []byte("2")}, Meta{ClusterID: "edge-a", LastContact: time.Unix(100, 0)})
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // a writer that never pauses long
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			w.Put("edge-b", fmt.Sprintf("ns/p%d", i%500), []byte(fmt.Sprint(i)))
			_ = w.Flush()
		}
	}()
	defer func() { close(stop); <-done }()

	for range 3 {
		r, err := OpenReadOnly(path, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.Load()
		if err != nil {
			t.Fatal(err)
		}
		if a := got["edge-a"]; len(a.Records) != 2 || string(a.Records["ns/b"]) != "2" || a.Meta.ClusterID != "edge-a" {
			t.Errorf("edge-a read as %+v", a)
		}
		r.Put("edge-a", "ns/c", []byte("3")) // rejected: read-only
		if r.Stats().Rejected != 1 {
			t.Errorf("a change to a read-only store was not rejected")
		}
		tmp := r.tmpCopy
		if tmp == "" {
			t.Error("the file was locked, yet not copied")
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("copy %s not removed: %v", tmp, err)
		}
	}
}

// TestOpenReadOnly: unlocked files are read in place; missing and unusable
// ones are errors and are left where they are.
func TestOpenReadOnly(t *testing.T) {
	var l logBuf
	path := dbPath(t)
	w, _ := mustOpen(t, path, testOptions(&l))
	w.Put("edge-a", "ns/a", []byte("1"))
	mustClose(t, w)

	r, err := OpenReadOnly(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.tmpCopy != "" {
		t.Error("an unlocked file was copied")
	}
	if got := mustLoad(t, r); string(got["edge-a"].Records["ns/a"]) != "1" {
		t.Errorf("read %+v", got)
	}
	mustClose(t, r)

	if _, err := OpenReadOnly(filepath.Join(t.TempDir(), "none.db"), time.Second); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	garbage := filepath.Join(t.TempDir(), "garbage.db")
	if err := os.WriteFile(garbage, make([]byte, 1<<15), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenReadOnly(garbage, time.Second); !errors.Is(err, ErrUnusable) {
		t.Errorf("garbage file: %v, want ErrUnusable", err)
	}
	if _, err := os.Stat(garbage); err != nil {
		t.Errorf("garbage file moved: %v", err)
	}
}
