//go:build unix

package snapshot

import (
	"os"
	"syscall"
)

// unlockFile drops the flock bbolt took on f. Closing f alone does not: the
// lock belongs to the open file description, which bbolt's memory mapping
// keeps alive until it is unmapped.
func unlockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
