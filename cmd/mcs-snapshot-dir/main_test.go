package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func owner(t *testing.T, path string) (int, int) {
	t.Helper()
	info, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := info.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid)
}

// TestChownTree: the folder, its files and sub-folders change owner; a
// symbolic link changes itself, never its target; a second run changes
// nothing.
func TestChownTree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to change owners")
	}
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "outside")
	for _, p := range []string{outside, filepath.Join(dir, "table.db"), filepath.Join(dir, "aside", "table.db.corrupt")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	var skipped []string
	n, err := chownTree(dir, 65532, 65533, func(p string, err error) { skipped = append(skipped, p+": "+err.Error()) })
	if err != nil || n != 5 || len(skipped) > 0 {
		t.Fatalf("chownTree: %d changed, %v, skipped %v; want 5", n, err, skipped)
	}
	for _, p := range []string{dir, filepath.Join(dir, "table.db"), filepath.Join(dir, "aside"), filepath.Join(dir, "aside", "table.db.corrupt"), filepath.Join(dir, "link")} {
		if u, g := owner(t, p); u != 65532 || g != 65533 {
			t.Errorf("%s owned by %d:%d", p, u, g)
		}
	}
	if u, _ := owner(t, outside); u != 0 {
		t.Errorf("the link's target changed owner to %d", u)
	}
	if n, err := chownTree(dir, 65532, 65533, nil); n != 0 || err != nil {
		t.Errorf("second run: %d changed, %v", n, err)
	}
}

func TestRefusals(t *testing.T) {
	for _, s := range []string{"65532", "a:b", "-1:0", ":1"} {
		if _, _, err := parseOwner(s); err == nil {
			t.Errorf("owner %q accepted", s)
		}
	}
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := chownTree(f, 1, 1, nil); err == nil {
		t.Error("a file accepted as the folder")
	}
	if _, err := chownTree(filepath.Join(f, "missing"), 1, 1, nil); err == nil {
		t.Error("a missing folder accepted")
	}
}
