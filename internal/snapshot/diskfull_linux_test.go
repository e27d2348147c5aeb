//go:build linux

package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDiskFullOnTmpfs fills a small tmpfs so that commits fail with ENOSPC,
// then frees space: the changes must be written by the background retries.
// It needs root (or CAP_SYS_ADMIN) to mount the tmpfs and is skipped
// otherwise.
func TestDiskFullOnTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	// Registered after TempDir's cleanup, so it runs before it.
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})

	var logs logBuf
	o := testOptions(&logs)
	o.MaxRetryInterval = 50 * time.Millisecond
	path := filepath.Join(dir, "mcs.db")
	s, _ := mustOpen(t, path, o)
	s.Put("local", "before", []byte("1"))
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}

	// Fill the file system.
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling: %v", err)
			}
			break
		}
	}
	f.Close()

	value := bytes.Repeat([]byte("v"), 1000)
	for i := 0; i < 500; i++ {
		s.Put("local", fmt.Sprintf("key-%03d", i), value)
	}
	err = s.Flush()
	if err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("Flush on a full disk = %v, want ENOSPC", err)
	}
	waitFor(t, 5*time.Second, "background retries", func() bool { return s.Stats().WriteErrors >= 3 })
	if st := s.Stats(); st.Pending != 500 {
		t.Errorf("Pending = %d, want 500", st.Pending)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the retries to succeed", func() bool { return s.Stats().Pending == 0 })
	got := reopenLoad(t, s, path, o)
	if n := len(got["local"].Records); n != 501 {
		t.Errorf("after the disk had room again: %d records, want 501", n)
	}
	if !bytes.Equal(got["local"].Records["key-499"], value) {
		t.Errorf("key-499 = %q", got["local"].Records["key-499"])
	}
}
