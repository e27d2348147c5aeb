//go:build !unix

package snapshot

import "os"

// unlockFile is a no-op where bbolt does not use flock.
func unlockFile(*os.File) error { return nil }
