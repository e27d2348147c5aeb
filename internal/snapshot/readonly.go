package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// OpenReadOnly opens the snapshot at path for reading (Scan, Load) and never
// writes to it. It is for tools (mcsctl) that read the file of a running
// CoreDNS.
//
// A running plugin holds the file's lock exclusively, and bbolt's read-only
// open waits for a shared one, so when the lock is not free within a moment
// the file is copied first, into a temporary file that Close removes. A copy
// made while the plugin commits can mix two versions, so the file's two meta
// pages (every commit ends by writing one) are compared before and after the
// copy, and the copy is taken again until they match, until timeout. The
// copy (or the file) then goes through Open's checks; a file that fails them
// is an error wrapping ErrUnusable, and nothing is moved aside.
func OpenReadOnly(path string, timeout time.Duration) (*Store, error) {
	if timeout <= 0 {
		timeout = defaultOpenTimeout
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	deadline := time.Now().Add(timeout)
	db, file, err := openReadOnly(path, min(timeout, 200*time.Millisecond))
	tmp := ""
	if errors.Is(err, ErrLocked) {
		tmp, err = consistentCopy(path, deadline)
		if err != nil {
			return nil, err
		}
		db, file, err = openReadOnly(tmp, timeout)
	}
	if err != nil {
		if tmp != "" {
			_ = os.Remove(tmp)
		}
		return nil, err
	}
	s := &Store{
		path:     path,
		opts:     Options{}.withDefaults(),
		db:       db,
		file:     file,
		closed:   true, // every change is rejected
		pending:  map[bucketRef]*change{},
		wake:     make(chan struct{}, 1),
		flushReq: make(chan chan error),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		tmpCopy:  tmp,
	}
	close(s.done) // no batcher
	return s, nil
}

// ErrUnusable is wrapped by OpenReadOnly's error for a file that is not a
// usable snapshot (the reason follows).
var ErrUnusable = errUnusable

// openReadOnly opens path read-only and checks it as Open does, under the
// same fault protection.
func openReadOnly(path string, timeout time.Duration) (db *bolt.DB, file *os.File, err error) {
	return openReadOnlyWith(path, timeout, func(tx *bolt.Tx, size int64) error {
		empty, _, err := inspect(tx, size)
		if err == nil && empty {
			err = unusable("the file holds nothing yet")
		}
		if err != nil {
			return err
		}
		return checkConsistency(tx)
	})
}

// openReadOnlyWith opens path read-only (bbolt reads its meta pages, not
// its freelist) and runs check in a read transaction, with the file's size,
// under the fault protection Open has.
func openReadOnlyWith(path string, timeout time.Duration, check func(tx *bolt.Tx, size int64) error) (db *bolt.DB, file *os.File, err error) {
	bo := &bolt.Options{
		Timeout:  timeout,
		ReadOnly: true,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	}
	defer func() {
		if r := recover(); r != nil {
			if file != nil {
				_ = unlockFile(file)
				_ = file.Close()
			}
			db, file, err = nil, nil, unusable("reading it failed: %v", r)
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	db, err = bolt.Open(path, fileMode, bo)
	switch {
	case err == nil:
	case errors.Is(err, berrors.ErrTimeout):
		return nil, nil, fmt.Errorf("%w: %s (gave up after %s: %w)", ErrLocked, path, timeout, err)
	case corruptOpenError(err):
		return nil, nil, unusable("%v", err)
	default:
		return nil, nil, fmt.Errorf("snapshot: open %s: %w", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		closeQuietly(db)
		return nil, nil, err
	}
	err = db.View(func(tx *bolt.Tx) error { return check(tx, fi.Size()) })
	if err != nil {
		closeQuietly(db)
		return nil, nil, err
	}
	return db, file, nil
}

// consistentCopy copies path to a temporary file, again until no commit
// happened during the copy (the meta pages are unchanged), until deadline.
func consistentCopy(path string, deadline time.Time) (string, error) {
	for attempt := 1; ; attempt++ {
		before, err := metaPages(path)
		if err != nil {
			return "", err
		}
		tmp, err := copyFile(path)
		if err != nil {
			return "", err
		}
		after, err := metaPages(path)
		if err == nil && bytes.Equal(before, after) {
			return tmp, nil
		}
		_ = os.Remove(tmp)
		if err != nil {
			return "", err
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("snapshot: %s changed during each of %d copies (it is written continuously): try again", path, attempt)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metaPages returns the file's first two pages: bbolt's two meta pages, one
// of which every commit rewrites last. The page size is read from the first
// meta page (after the 16-byte page header: magic, version, page size).
func metaPages(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	hdr := make([]byte, 28)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, unusable("too short for a bbolt file: %v", err)
	}
	ps := int(binary.NativeEndian.Uint32(hdr[24:]))
	if ps < 512 || ps > 1<<16 {
		return nil, unusable("page size %d in the meta page", ps)
	}
	b := make([]byte, 2*ps)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b[:n], nil
}

// copyFile copies path into a new temporary file and returns its name.
func copyFile(path string) (string, error) {
	in, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.CreateTemp("", "mcs-snapshot-*.db")
	if err != nil {
		return "", err
	}
	_, err = io.Copy(out, in)
	if err = errors.Join(err, out.Close()); err != nil {
		_ = os.Remove(out.Name())
		return "", err
	}
	return out.Name(), nil
}

// ReadFromCopy reports whether OpenReadOnly read a copy of the file (its
// lock was held: a running plugin has it open).
func (s *Store) ReadFromCopy() bool { return s.tmpCopy != "" }
