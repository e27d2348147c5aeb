package snapshot

import (
	"cmp"
	"errors"
	"fmt"
	"iter"
	"log"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Meta is what the store keeps about a source besides its records.
type Meta struct {
	ClusterID    string
	LastContact  time.Time // last successful contact with the source
	LastFullSync time.Time // last time a full list replaced the source's records
	State        string    // the source's state when the meta was written ("connected", ...); "": not recorded
	Via          []string  // the hubs that relayed the cluster's records; empty: read directly
	Records      int       // number of records; filled by Load, ignored on write
}

// Source is one source as loaded from the file.
type Source struct {
	Meta    Meta
	Records map[string][]byte // key -> value; the bytes are owned by the caller
}

// Options configure a Store. The zero value is usable.
type Options struct {
	// OpenTimeout bounds the wait for the file lock (bbolt Options.Timeout).
	// Another open Store on the same file, in this process or another, holds
	// it. Default 1s.
	OpenTimeout time.Duration
	// BatchInterval is how long changes are gathered before they are
	// committed together in one transaction. Default 100ms.
	BatchInterval time.Duration
	// MaxRetryInterval caps the backoff between retries of a failed commit.
	// Default 5s.
	MaxRetryInterval time.Duration
	// Logf receives the moved-aside and write-error lines. Default log.Printf.
	Logf func(format string, args ...any)
}

const (
	defaultOpenTimeout      = time.Second
	defaultBatchInterval    = 100 * time.Millisecond
	defaultMaxRetryInterval = 5 * time.Second
	fileMode                = 0o600
	dirMode                 = 0o755
)

func (o Options) withDefaults() Options {
	if o.OpenTimeout <= 0 {
		o.OpenTimeout = defaultOpenTimeout
	}
	if o.BatchInterval <= 0 {
		o.BatchInterval = defaultBatchInterval
	}
	if o.MaxRetryInterval <= 0 {
		o.MaxRetryInterval = defaultMaxRetryInterval
	}
	if o.MaxRetryInterval < o.BatchInterval {
		o.MaxRetryInterval = o.BatchInterval
	}
	if o.Logf == nil {
		o.Logf = log.Printf
	}
	return o
}

// LoadResult says what Open found.
type LoadResult struct {
	// Created is true when the store starts empty because there was no
	// usable snapshot: no file, an empty file, or one that was moved aside.
	Created bool
	// MovedAside is where an unusable file was renamed to, "" if none was.
	MovedAside string
	// Reason explains MovedAside, or why an existing file was re-initialised.
	Reason string
}

// Stats describe the writer. All counters are since Open.
type Stats struct {
	Commits           uint64        // batches committed, one bbolt Update each
	RecordsWritten    uint64        // record puts and deletes committed (unchanged values are skipped)
	WriteErrors       uint64        // failed commit attempts; their changes were kept for retry
	LastError         error         // error of the last failed attempt; nil once a commit succeeds
	LastWrite         time.Time     // end of the last successful commit
	LastBatchDuration time.Duration // duration of the last commit attempt
	Pending           int           // changes not yet committed, including the batch being committed (a key changed again meanwhile counts twice)
	Rejected          uint64        // calls ignored: invalid source, key or value, or store closed
}

var (
	// ErrClosed is returned by Load and Flush after Close.
	ErrClosed = errors.New("snapshot: store is closed")
	// ErrLocked is wrapped by Open's error when another Store holds the file.
	ErrLocked = errors.New("snapshot: file is locked by another open store")
	// ErrDamaged is wrapped by every error of a Store whose file turned out
	// to be damaged while open (bbolt panicked or faulted reading it). Such a
	// Store does not touch the file again; Close it and Open again, which
	// moves the file aside. Changes made meanwhile stay pending but are lost
	// on Close.
	ErrDamaged = errors.New("snapshot: file damaged while open")
)

// Store is a bbolt-backed store of per-source records. Its methods are safe
// for concurrent use.
type Store struct {
	path string
	opts Options

	// dbMu guards db: read-locked for every transaction, write-locked to
	// close it. db is nil after Close.
	dbMu sync.RWMutex
	db   *bolt.DB
	// file is bbolt's own handle on the file. A panic inside bbolt can leave
	// its internal locks held, so a damaged store is closed by unlocking and
	// closing file instead of calling db.Close, which could block forever.
	file *os.File
	// damaged is set, once, to an error wrapping ErrDamaged when bbolt
	// panics; from then on the store makes no bbolt call.
	damaged  atomic.Pointer[error]
	isClosed atomic.Bool

	mu       sync.Mutex // guards pending, inflight, closed, rejected
	pending  map[bucketRef]*change
	inflight int // size of the batch being committed
	closed   bool
	rejected uint64

	statsMu sync.Mutex
	stats   Stats // Pending and Rejected are filled in by Stats()

	wake     chan struct{}   // a change was enqueued; capacity 1
	flushReq chan chan error // Flush asks the batcher to commit now
	stop     chan struct{}   // closed by Close
	done     chan struct{}   // closed when the batcher has exited

	tmpCopy string // OpenReadOnly's copy of a locked file, removed by Close

	finalErr  error // result of the batcher's last commit, set before done is closed
	closeOnce sync.Once
	closeErr  error
}

// Open opens the snapshot at path, creating it (and its directory) if needed.
// An unusable file (see the package documentation) is moved aside and a fresh
// store is created; LoadResult says so. Open fails, without touching the
// file, if the lock is not obtained within OpenTimeout (the error wraps
// ErrLocked) or on an I/O error such as a read-only file system.
func Open(path string, o Options) (*Store, LoadResult, error) {
	o = o.withDefaults()
	var res LoadResult
	if err := os.MkdirAll(filepath.Dir(path), dirMode); err != nil {
		return nil, res, fmt.Errorf("snapshot: %w", err)
	}
	fi, statErr := os.Stat(path)
	wasEmpty := statErr == nil && fi.Mode().IsRegular() && fi.Size() == 0

	db, file, created, err := openChecked(path, o.OpenTimeout)
	if errors.Is(err, errUnusable) {
		reason := strings.TrimPrefix(err.Error(), errUnusable.Error()+": ")
		aside, mvErr := moveAside(path)
		if mvErr != nil {
			return nil, res, fmt.Errorf("snapshot: %s is unusable (%s) and could not be moved aside: %w", path, reason, mvErr)
		}
		o.Logf("snapshot: %s is unusable (%s); moved it aside to %s and starting with an empty snapshot", path, reason, aside)
		for _, old := range pruneAside(path, KeepAside) {
			o.Logf("snapshot: removed %s, an older file moved aside (the newest %d are kept)", old, KeepAside)
		}
		res.MovedAside, res.Reason = aside, reason
		db, file, created, err = openChecked(path, o.OpenTimeout)
	}
	if err != nil {
		return nil, res, err
	}
	res.Created = created
	if created && wasEmpty && res.MovedAside == "" {
		res.Reason = "the file was empty (interrupted first initialisation?); initialised it in place"
		o.Logf("snapshot: %s: %s", path, res.Reason)
	}

	s := &Store{
		path:     path,
		opts:     o,
		db:       db,
		file:     file,
		pending:  make(map[bucketRef]*change),
		wake:     make(chan struct{}, 1),
		flushReq: make(chan chan error),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go s.run()
	return s, res, nil
}

// openChecked opens path and verifies it with inspect, initialising an empty
// file. Problems with the file's contents are returned wrapping errUnusable
// (the file is closed and unlocked by then); anything else is an error the
// caller must not treat as corruption.
func openChecked(path string, timeout time.Duration) (db *bolt.DB, file *os.File, created bool, err error) {
	// Keep bbolt's handle on the file so that it (and its lock) can be
	// released if bbolt panics, without calling into bbolt again.
	bo := &bolt.Options{
		Timeout:      timeout,
		FreelistType: bolt.FreelistMapType,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	}
	defer func() {
		if r := recover(); r != nil {
			// bbolt may hold internal locks now: release the file, do not
			// call into the DB. The mapping leaks (once per damaged file);
			// the file lock does not.
			if file != nil {
				_ = unlockFile(file)
				_ = file.Close()
			}
			db, file, created, err = nil, nil, false, unusable("reading it failed: %v", r)
		}
	}()
	// A page that points past the end of the file faults; make that a panic.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))

	if err := checkFreelistFirst(path, timeout); err != nil {
		return nil, nil, false, err
	}
	db, err = bolt.Open(path, fileMode, bo)
	switch {
	case err == nil:
	case errors.Is(err, berrors.ErrTimeout):
		return nil, nil, false, fmt.Errorf("%w: %s (gave up after %s: %w)", ErrLocked, path, timeout, err)
	case corruptOpenError(err):
		return nil, nil, false, unusable("%v", err)
	default:
		return nil, nil, false, fmt.Errorf("snapshot: open %s: %w", path, err)
	}

	fi, err := os.Stat(path)
	if err != nil {
		closeQuietly(db)
		return nil, nil, false, fmt.Errorf("snapshot: %w", err)
	}
	var empty bool
	var version string
	err = db.View(func(tx *bolt.Tx) error {
		var err error
		empty, version, err = inspect(tx, fi.Size())
		if err != nil {
			return err
		}
		// Every reachable page has now been read without faulting, so
		// bbolt's own check (which runs in its own goroutine) is safe.
		return checkConsistency(tx)
	})
	if err != nil {
		closeQuietly(db)
		if !errors.Is(err, errUnusable) {
			err = fmt.Errorf("snapshot: read %s: %w", path, err)
		}
		return nil, nil, false, err
	}
	if empty {
		if err := db.Update(initSchema); err != nil {
			closeQuietly(db)
			return nil, nil, false, fmt.Errorf("snapshot: initialise %s: %w", path, err)
		}
	}
	if version == schemaVersion1 {
		if err := db.Update(migrate1); err != nil {
			closeQuietly(db)
			return nil, nil, false, fmt.Errorf("snapshot: migrate %s from schema 1: %w", path, err)
		}
	}
	return db, file, empty, nil
}

// corruptOpenError reports whether an error from bolt.Open means the file's
// contents are bad (rather than that it could not be opened, locked or read).
func corruptOpenError(err error) bool {
	return errors.Is(err, berrors.ErrInvalid) ||
		errors.Is(err, berrors.ErrVersionMismatch) ||
		errors.Is(err, berrors.ErrChecksum) ||
		// bbolt returns this one unwrapped from its mmap step.
		strings.Contains(err.Error(), "file size too small")
}

func closeQuietly(db *bolt.DB) {
	defer func() { _ = recover() }()
	_ = db.Close()
}

// KeepAside is how many files moved aside are kept, the newest ones: a disk
// at the edge must not fill with damaged copies when damage repeats.
const KeepAside = 3

// pruneAside removes all but the newest keep files moved aside from path and
// returns their names. Names sort by age: the timestamp, then the counter.
func pruneAside(path string, keep int) []string {
	names, err := filepath.Glob(path + ".corrupt-*")
	if err != nil || len(names) <= keep {
		return nil
	}
	slices.SortFunc(names, func(a, b string) int {
		ta, ca := asideOrder(path, a)
		tb, cb := asideOrder(path, b)
		return cmp.Or(cmp.Compare(ta, tb), cmp.Compare(ca, cb))
	})
	var removed []string
	for _, name := range names[:len(names)-keep] {
		if os.Remove(name) == nil {
			removed = append(removed, name)
		}
	}
	return removed
}

// asideOrder splits a moved-aside name into its timestamp and counter.
func asideOrder(path, name string) (string, int) {
	stamp := strings.TrimPrefix(name, path+".corrupt-")
	n := 0
	if i := strings.IndexByte(stamp, '.'); i >= 0 {
		n, _ = strconv.Atoi(stamp[i+1:])
		stamp = stamp[:i]
	}
	return stamp, n
}

// moveAside renames path to path.corrupt-<UTC timestamp>, adding a counter if
// that name is taken, and returns the new name.
func moveAside(path string) (string, error) {
	base := path + ".corrupt-" + time.Now().UTC().Format("20060102T150405Z")
	// Number it after the newest of this second (pruning may have freed
	// lower numbers): base, base.1, base.2, ...
	next := 0
	taken, _ := filepath.Glob(base + "*")
	for _, name := range taken {
		_, n := asideOrder(path, name)
		next = max(next, n+1)
	}
	aside := base
	for ; ; next++ {
		if next > 0 {
			aside = fmt.Sprintf("%s.%d", base, next)
		}
		if _, err := os.Lstat(aside); errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	if err := os.Rename(path, aside); err != nil {
		return "", err
	}
	return aside, nil
}

// Load returns every source's meta and records as committed to the file.
// Changes still pending are not included: call Flush first if that matters.
// The returned maps and byte slices are the caller's.
func (s *Store) Load() (map[string]Source, error) {
	out := make(map[string]Source)
	err := s.Scan(func(name string, meta Meta, records iter.Seq2[[]byte, []byte]) error {
		src := Source{Meta: meta, Records: make(map[string][]byte, meta.Records)}
		for k, v := range records {
			src.Records[string(k)] = append([]byte(nil), v...)
		}
		src.Meta.Records = len(src.Records)
		out[name] = src
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Scan calls fn for every source committed to the file, with its meta (whose
// Records is the number of records) and an iterator over the records, all in
// one read transaction.
// It copies nothing: the keys and values point into the file's memory map
// and are valid until fn returns (the transaction's life), so fn must copy
// what it keeps. That is what makes a start-up load cheap: nothing is held
// twice. A goroutine that fn starts to read them must do so inside Guard.
// fn must not call Flush or Close; Put, Delete and the other batched changes
// are fine (they are queued).
func (s *Store) Scan(fn func(name string, meta Meta, records iter.Seq2[[]byte, []byte]) error) error {
	return s.view(func(tx *bolt.Tx) error {
		sources := tx.Bucket([]byte(sourcesBucket))
		if sources == nil {
			return fmt.Errorf("no %q bucket", sourcesBucket)
		}
		return sources.ForEachBucket(func(name []byte) error {
			if n := string(name); n == v1ClientsSource || n == v1ClusterSetIPsSource {
				return nil // a schema 1 file read by OpenReadOnly: see typedBucket
			}
			sb := sources.Bucket(name)
			var meta Meta
			if mv := sb.Get([]byte(sourceMetaKey)); mv != nil {
				m, err := decodeMeta(mv)
				if err != nil {
					return fmt.Errorf("source %q: meta: %w", name, err)
				}
				meta = m
			}
			rb := sb.Bucket([]byte(recordsBucket))
			meta.Records = 0
			if rb != nil {
				// Stats counts keys page by page, without visiting them.
				meta.Records = rb.Stats().KeyN
			}
			return fn(string(name), meta, func(yield func(k, v []byte) bool) {
				if rb == nil {
					return
				}
				c := rb.Cursor()
				for k, v := c.First(); k != nil; k, v = c.Next() {
					if !yield(k, v) {
						return
					}
				}
			})
		})
	})
}

// Guard runs f, which reads keys or values that Scan handed out, with the
// protection Scan's own goroutine has: a file damaged under the mapping
// faults into an error wrapping ErrDamaged (and marks the store damaged)
// rather than crashing the process. A panic in f is turned the same way.
func (s *Store) Guard(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = s.markDamaged("reading", r)
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	f()
	return nil
}

// view runs fn in a read transaction, turning a panic or a page fault (a file
// damaged after Open) into an error.
func (s *Store) view(fn func(*bolt.Tx) error) (err error) {
	if s.isClosed.Load() {
		return ErrClosed
	}
	if err := s.damagedErr(); err != nil {
		return err
	}
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return ErrClosed
	}
	defer func() {
		if r := recover(); r != nil {
			err = s.markDamaged("reading", r)
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	if err := s.db.View(fn); err != nil {
		return fmt.Errorf("snapshot: reading %s: %w", s.path, err)
	}
	return nil
}

// Flush commits everything pending now and waits for the result. On error
// the changes stay pending and are retried in the background.
func (s *Store) Flush() error {
	reply := make(chan error, 1)
	select {
	case s.flushReq <- reply:
		return <-reply
	case <-s.done:
		return ErrClosed
	}
}

// Close commits what is pending, stops the batcher and closes the file. It is
// idempotent; every call returns the first call's result. Changes made after
// Close are ignored.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		defer func() {
			if s.tmpCopy != "" {
				s.closeErr = errors.Join(s.closeErr, os.Remove(s.tmpCopy))
			}
		}()
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.isClosed.Store(true)
		close(s.stop)
		<-s.done

		if derr := s.damagedErr(); derr != nil {
			s.closeErr = errors.Join(derr, unlockFile(s.file), s.file.Close())
			return
		}
		s.dbMu.Lock()
		var cerr error
		if s.db != nil {
			cerr = s.db.Close()
			s.db = nil
		}
		s.dbMu.Unlock()
		s.closeErr = errors.Join(s.finalErr, cerr)
	})
	return s.closeErr
}

// markDamaged records that bbolt panicked (r) while doing what, logs it once,
// and returns the error every later call gets.
func (s *Store) markDamaged(what string, r any) error {
	err := fmt.Errorf("%w: %s %s: bbolt panicked: %v", ErrDamaged, what, s.path, r)
	if s.damaged.CompareAndSwap(nil, &err) {
		s.opts.Logf("%v; no further reads or writes until the store is reopened", err)
	}
	return *s.damaged.Load()
}

func (s *Store) damagedErr() error {
	if p := s.damaged.Load(); p != nil {
		return *p
	}
	return nil
}

// Stats returns a snapshot of the writer's counters.
func (s *Store) Stats() Stats {
	s.statsMu.Lock()
	st := s.stats
	s.statsMu.Unlock()
	s.mu.Lock()
	st.Pending = countPending(s.pending) + s.inflight
	st.Rejected = s.rejected
	s.mu.Unlock()
	return st
}

// Path returns the file's path.
func (s *Store) Path() string { return s.path }

// checkConsistency runs bbolt's own check of tx's file, which finds freelist
// damage that would make later writes overwrite live pages. Call it only once
// every reachable page has been read without faulting (inspect): the check
// runs in its own goroutine, where a fault could not be recovered.
func checkConsistency(tx *bolt.Tx) error {
	var err error
	for cerr := range tx.Check() {
		if err == nil {
			err = unusable("consistency check: %v", cerr)
		}
	}
	return err
}
