package mcsannotations

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/mcsannotations/mcsannotations/internal/snapshot"
)

// fastSnapshotRetry shortens the backoff between attempts to open the file.
func fastSnapshotRetry(t *testing.T) {
	old := snapshotRetry
	snapshotRetry = wait.Backoff{Duration: 20 * time.Millisecond, Factor: 1.5, Steps: math.MaxInt32, Cap: 200 * time.Millisecond}
	t.Cleanup(func() { snapshotRetry = old })
}

// waitStoreOpen waits until the live instance has the store open.
func waitStoreOpen(t *testing.T, m *MCS) *snapshot.Store {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st := m.store.Load(); st != nil {
			return st
		}
	}
	t.Fatal("the snapshot was not opened after its cause went away")
	return nil
}

// storedSources reads the file's sources (through a copy when a plugin
// holds it).
func storedSources(t *testing.T, path string) map[string]snapshot.Source {
	t.Helper()
	r, err := snapshot.OpenReadOnly(path, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := r.Load()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// storedPods reads the cluster's records from the file.
func storedPods(t *testing.T, path, cluster string) []string {
	t.Helper()
	got := storedSources(t, path)
	var out []string
	for k, v := range got[cluster].Records {
		if _, err := snapshot.DecodePod(v); err != nil {
			t.Errorf("record %s: %v", k, err)
		}
		out = append(out, k)
	}
	return out
}

// A snapshot that cannot be opened at start is tried again in the
// background: once the cause goes away, the file is created and holds the
// table, without a restart. One case per cause.
func TestSnapshotOpenRetried(t *testing.T) {
	fastSnapshotRetry(t)
	causes := []struct {
		name  string
		block func(t *testing.T, path string) (unblock func())
	}{
		{"a directory in its place", func(t *testing.T, path string) func() {
			if err := os.MkdirAll(filepath.Join(path, "x"), 0o755); err != nil {
				t.Fatal(err)
			}
			return func() { os.RemoveAll(path) }
		}},
		{"locked by another process", func(t *testing.T, path string) func() {
			// The lock is bbolt's flock: another open in this process
			// conflicts like another process's.
			other, _, err := snapshot.Open(path, snapshot.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return func() { other.Close() }
		}},
		{"permission denied", func(t *testing.T, path string) func() {
			if os.Geteuid() == 0 {
				t.Skip("root ignores file permissions (the read-only file system case covers a refused create)")
			}
			dir := filepath.Dir(path)
			if err := os.Chmod(dir, 0o500); err != nil {
				t.Fatal(err)
			}
			return func() { os.Chmod(dir, 0o755) }
		}},
		{"read-only file system", func(t *testing.T, path string) func() {
			dir := tmpfs(t, filepath.Dir(path), "size=1m")
			if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
				t.Skipf("remount read-only: %v", err)
			}
			return func() {
				if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT, "size=1m"); err != nil {
					t.Errorf("remount read-write: %v", err)
				}
			}
		}},
		{"disk full", func(t *testing.T, path string) func() {
			dir := tmpfs(t, filepath.Dir(path), "size=256k")
			filler := filepath.Join(dir, "filler")
			f, err := os.Create(filler)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4096)
			for {
				if _, err := f.Write(buf); err != nil {
					break // ENOSPC
				}
			}
			f.Close()
			return func() { os.Remove(filler) }
		}},
	}
	for _, tc := range causes {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "data", "table.db")
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			unblock := tc.block(t, path)
			openErrors := testutil.ToFloat64(snapshotErrors.WithLabelValues("open"))

			withClient(t, fakeAPI(exporter("a", "10.0.0.1", backendAnno), exporter("b", "10.0.0.2", backendAnno)))
			i, udp, _ := serveSnapshot(t, path)
			defer stopServer(i)
			waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1", "10.0.0.2"})
			m := liveInstance(t)
			if m.store.Load() != nil {
				t.Fatal("the snapshot opened although it cannot be")
			}
			if testutil.ToFloat64(snapshotOpen) != 0 {
				t.Error("snapshot_open is not 0 while the file cannot be opened")
			}
			// Still failing: the attempts go on and are counted.
			for deadline := time.Now().Add(5 * time.Second); testutil.ToFloat64(snapshotErrors.WithLabelValues("open")) < openErrors+2; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("no further attempts were made to open the snapshot")
				}
			}

			unblock()
			st := waitStoreOpen(t, m)
			if err := st.Flush(); err != nil {
				t.Fatal(err)
			}
			if testutil.ToFloat64(snapshotOpen) != 1 {
				t.Error("snapshot_open is not 1 once the file is open")
			}
			got := storedPods(t, path, "edge-a")
			if len(got) != 2 || !strings.Contains(strings.Join(got, " "), "default/a") {
				t.Errorf("the recovered file holds %v, want the table's default/a and default/b", got)
			}
			// And changes are journaled from then on.
			waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1", "10.0.0.2"})
		})
	}
}

// Started offline with the file locked (an old CoreDNS still has it): the
// plugin holds nothing; when the lock is freed, the file is loaded, as at
// start, rather than overwritten with the empty table.
func TestSnapshotLockedAtOfflineStartIsLoaded(t *testing.T) {
	fastSnapshotRetry(t)
	path := filepath.Join(t.TempDir(), "table.db")
	seedSnapshot(t, path, []string{"10.0.0.1"}, exporter("a", "10.0.0.1", backendAnno))
	other, _, err := snapshot.Open(path, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	withClient(t, deadAPI)
	i, udp, _ := serveSnapshot(t, path)
	defer stopServer(i)
	if got := addrsOf(exchange(t, "udp", udp, "backend.default.svc.clusterset.local.", 1, 0)); len(got) != 0 {
		t.Fatalf("answered %v without a snapshot", got)
	}
	other.Close()
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1"})
	if got := storedPods(t, path, "edge-a"); len(got) != 1 {
		t.Errorf("the file holds %v after the load, want its record kept", got)
	}
}

// Closing the plugin (a reload, shutdown) stops the attempts: the file is
// left for the next instance.
func TestSnapshotRetryStopsOnClose(t *testing.T) {
	fastSnapshotRetry(t)
	path := filepath.Join(t.TempDir(), "table.db")
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	withClient(t, fakeAPI(exporter("a", "10.0.0.1", backendAnno)))
	i, udp, _ := serveSnapshot(t, path)
	waitAnswer(t, udp, "backend.default.svc.clusterset.local.", []string{"10.0.0.1"})
	m := liveInstance(t)
	stopServer(i)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // more than the longest backoff step
	if m.store.Load() != nil {
		t.Fatal("a stopped instance opened the snapshot")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("a stopped instance created the file: %v", err)
	}
}

// tmpfs mounts a tmpfs of the given options on dir (root only) and unmounts
// it at the end of the test.
func tmpfs(t *testing.T, dir, opts string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}
