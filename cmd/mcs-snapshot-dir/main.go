// Command mcs-snapshot-dir gives the snapshot folder of our CoreDNS, and
// what is in it, to CoreDNS's non-root user. It is the init step of
// manifests/coredns/deployment.yaml: the kubelet creates a hostPath folder
// owned by root, where CoreDNS (user 65532) could not write its snapshot.
// It runs as root with only CAP_CHOWN, changes owners (never modes or
// contents), follows no symbolic link, and exits.
//
//	mcs-snapshot-dir -owner 65532:65532 /var/lib/mcsannotations
package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	fs := flag.NewFlagSet("mcs-snapshot-dir", flag.ContinueOnError)
	owner := fs.String("owner", "65532:65532", "UID:GID to give the folder and its contents to")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	uid, gid, err := parseOwner(*owner)
	if err == nil && fs.NArg() != 1 {
		err = errors.New("want one folder")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcs-snapshot-dir:", err)
		os.Exit(2)
	}
	changed, err := chownTree(fs.Arg(0), uid, gid, func(path string, err error) {
		fmt.Fprintf(os.Stderr, "mcs-snapshot-dir: %s: %v (left as it is)\n", path, err)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcs-snapshot-dir:", err)
		os.Exit(1)
	}
	fmt.Printf("mcs-snapshot-dir: %s owned by %d:%d (%d entries changed)\n", fs.Arg(0), uid, gid, changed)
}

// parseOwner reads "UID:GID", both numeric.
func parseOwner(s string) (uid, gid int, err error) {
	u, g, ok := strings.Cut(s, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil || uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("-owner %q: want numeric UID:GID", s)
	}
	return uid, gid, nil
}

// chownTree gives dir and everything under it to uid:gid, without following
// symbolic links (Lchown), skipping what already has that owner. The folder
// itself must succeed; an entry below it that cannot be read or changed is
// reported to skip and left, so that one odd file does not keep DNS from
// starting (CoreDNS moves a snapshot it cannot open aside).
func chownTree(dir string, uid, gid int, skip func(path string, err error)) (changed int, err error) {
	info, err := os.Lstat(dir)
	if err != nil {
		return 0, err
	}
	if !info.IsDir() {
		return 0, fmt.Errorf("%s is not a folder", dir)
	}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == dir {
				return err
			}
			skip(path, err)
			return nil
		}
		info, err := d.Info()
		if err != nil {
			skip(path, err)
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) == uid && int(st.Gid) == gid {
			return nil
		}
		if err := os.Lchown(path, uid, gid); err != nil {
			if path == dir {
				return err
			}
			skip(path, err)
			return nil
		}
		changed++
		return nil
	})
	return changed, err
}
