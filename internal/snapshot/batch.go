package snapshot

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// op is a pending change to one record: a value to put, or a delete.
type op struct {
	value []byte
	del   bool
}

// change is everything pending for one source, already coalesced: later calls
// overwrite earlier ones key by key.
type change struct {
	// reset: the source's committed records (and meta, unless meta is set)
	// are discarded before ops are applied. Set by ReplaceSource and
	// DropSource. With no ops and no meta the source is removed entirely.
	reset bool
	ops   map[string]op
	meta  *Meta
}

func newChange() *change { return &change{ops: make(map[string]op)} }

// then returns the change equivalent to c followed by next. It reuses c (and
// may modify it) unless next supersedes it.
func (c *change) then(next *change) *change {
	if c == nil || next.reset {
		return next
	}
	for k, o := range next.ops {
		c.ops[k] = o
	}
	if next.meta != nil {
		c.meta = next.meta
	}
	return c
}

func (c *change) size() int {
	n := len(c.ops)
	if c.reset {
		n++
	}
	if c.meta != nil {
		n++
	}
	return n
}

// createsSource reports whether c writes something (a record or meta), as
// opposed to only deleting.
func (c *change) createsSource() bool {
	if c.meta != nil {
		return true
	}
	for _, o := range c.ops {
		if !o.del {
			return true
		}
	}
	return false
}

// kind is the type of a bucket: what its records are.
type kind uint8

const (
	kindSource        kind = iota // a cluster's Pod records, with its meta
	kindClients                   // local Pods as DNS clients
	kindClusterSetIPs             // ClusterSetIP services
	kindReplay                    // a relayed origin's replay memory (replay.go)
)

// bucketRef names a bucket that changes are queued for: a source's records,
// or one of the typed top-level buckets (name empty).
type bucketRef struct {
	kind kind
	name string
}

func (r bucketRef) String() string {
	switch r.kind {
	case kindClients:
		return "bucket " + clientsBucket
	case kindClusterSetIPs:
		return "bucket " + clusterSetIPsBucket
	case kindReplay:
		return fmt.Sprintf("replay memory of %.64q", r.name)
	}
	return fmt.Sprintf("source %.64q", r.name)
}

func sourceRef(name string) bucketRef { return bucketRef{kindSource, name} }

func countPending(p map[bucketRef]*change) int {
	n := 0
	for _, c := range p {
		n += c.size()
	}
	return n
}

func validName(s string) bool { return s != "" && len(s) <= bolt.MaxKeySize }

// enqueue applies fn to the pending change of ref under the lock and wakes
// the batcher. If the store is closed or invalid is not empty (it says why the
// call is invalid; invalid calls are logged) it only counts a rejection.
func (s *Store) enqueue(ref bucketRef, invalid string, fn func(c *change) *change) {
	s.mu.Lock()
	if s.closed || invalid != "" {
		s.rejected++
		s.mu.Unlock()
		if invalid != "" {
			s.opts.Logf("snapshot: ignoring change to %s: %s", ref, invalid)
		}
		return
	}
	c := s.pending[ref]
	if c == nil {
		c = newChange()
	}
	s.pending[ref] = fn(c)
	s.mu.Unlock()

	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func checkSource(source string) string {
	if !validName(source) {
		return fmt.Sprintf("source name must be 1 to %d bytes", bolt.MaxKeySize)
	}
	return ""
}

func checkRecord(source, key string, value []byte) string {
	if msg := checkSource(source); msg != "" {
		return msg
	}
	if !validName(key) {
		return fmt.Sprintf("key must be 1 to %d bytes", bolt.MaxKeySize)
	}
	if len(value) > bolt.MaxValueSize {
		return fmt.Sprintf("value of key %.64q is larger than %d bytes", key, bolt.MaxValueSize)
	}
	return ""
}

// Put records key = value for source. It copies value and never waits for
// the disk; a later Put or Delete of the same key replaces this one.
func (s *Store) Put(source, key string, value []byte) {
	v := append([]byte{}, value...)
	s.enqueue(sourceRef(source), checkRecord(source, key, value), func(c *change) *change {
		c.ops[key] = op{value: v}
		return c
	})
}

// Delete removes key from source.
func (s *Store) Delete(source, key string) {
	s.enqueue(sourceRef(source), checkRecord(source, key, nil), func(c *change) *change {
		c.ops[key] = op{del: true}
		return c
	})
}

// ReplaceSource makes records (copied) and meta the whole content of source:
// committed records absent from records are deleted, in the same transaction
// as the new ones are written, so the file never holds a partial source.
//
// An invalid record (empty or oversized key, oversized value) is left out,
// logged and counted in Stats.Rejected; the others are still applied.
func (s *Store) ReplaceSource(source string, records map[string][]byte, meta Meta) {
	s.replace(sourceRef(source), checkSource(source), records, &meta)
}

// replace queues records (and meta, for a source) as the whole content of
// ref; invalid says why ref itself is invalid ("" when it is not).
func (s *Store) replace(ref bucketRef, invalid string, records map[string][]byte, meta *Meta) {
	next := &change{reset: true, ops: make(map[string]op, len(records)), meta: meta}
	bad, firstBad := 0, ""
	for k, v := range records {
		if msg := checkRecord("-", k, v); msg != "" {
			if bad++; bad == 1 {
				firstBad = msg
			}
			continue
		}
		next.ops[k] = op{value: append([]byte{}, v...)}
	}
	if bad > 0 && invalid == "" {
		s.mu.Lock()
		s.rejected += uint64(bad)
		s.mu.Unlock()
		s.opts.Logf("snapshot: replacing %s: left out %d invalid records (%s)", ref, bad, firstBad)
	}
	s.enqueue(ref, invalid, func(*change) *change { return next })
}

// SetMeta replaces source's meta (Records is ignored: it is counted on Load).
func (s *Store) SetMeta(source string, m Meta) {
	s.enqueue(sourceRef(source), checkSource(source), func(c *change) *change {
		c.meta = &m
		return c
	})
}

// DropSource removes source, its meta and all its records.
func (s *Store) DropSource(source string) {
	s.enqueue(sourceRef(source), checkSource(source), func(*change) *change {
		next := newChange()
		next.reset = true
		return next
	})
}

// run is the batcher: the only goroutine that writes to the file.
func (s *Store) run() {
	defer close(s.done)
	// A page fault while writing (the file damaged underneath us) becomes a
	// panic that commit recovers, rather than a crash of the server.
	debug.SetPanicOnFault(true)

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	failures := 0
	arm := func(d time.Duration) {
		timer.Reset(d)
		armed = true
	}
	after := func(err error) {
		if err == nil {
			failures = 0
			return
		}
		failures++
		if !armed {
			arm(s.backoff(failures))
		}
	}
	for {
		select {
		case <-s.wake:
			if !armed {
				arm(s.opts.BatchInterval)
			}
		case <-timer.C:
			armed = false
			after(s.commit(failures))
		case reply := <-s.flushReq:
			err := s.commit(failures)
			after(err)
			reply <- err
		case <-s.stop:
			timer.Stop()
			s.finalErr = s.commit(failures)
			if n := s.Stats().Pending; n > 0 {
				s.opts.Logf("snapshot: closing %s with %d changes not written: %v", s.path, n, s.finalErr)
			}
			return
		}
	}
}

// backoff returns the wait before retry number failures: BatchInterval
// doubled per consecutive failure, capped at MaxRetryInterval.
func (s *Store) backoff(failures int) time.Duration {
	d := s.opts.BatchInterval
	for i := 1; i < failures && d < s.opts.MaxRetryInterval; i++ {
		d *= 2
	}
	return min(d, s.opts.MaxRetryInterval)
}

// commit writes everything pending in one transaction. On failure the batch
// is put back under whatever was enqueued meanwhile, so nothing is lost and
// newer changes still win. failures is the number of consecutive failed
// attempts before this one, for logging.
func (s *Store) commit(failures int) error {
	s.mu.Lock()
	batch := s.pending
	if len(batch) == 0 {
		s.mu.Unlock()
		return nil
	}
	s.pending = make(map[bucketRef]*change)
	s.inflight = countPending(batch)
	s.mu.Unlock()

	start := time.Now()
	written, err := s.apply(batch)
	end := time.Now()

	if err != nil {
		s.mu.Lock()
		for source, newer := range s.pending {
			batch[source] = batch[source].then(newer)
		}
		s.pending = batch
		s.inflight = 0
		n := countPending(batch)
		s.mu.Unlock()

		s.statsMu.Lock()
		s.stats.WriteErrors++
		s.stats.LastError = err
		s.stats.LastBatchDuration = end.Sub(start)
		s.statsMu.Unlock()
		if !errors.Is(err, ErrDamaged) { // logged once, by markDamaged
			s.opts.Logf("snapshot: writing %d changes to %s failed (attempt %d), keeping them to retry in %s: %v",
				n, s.path, failures+1, s.backoff(failures+1), err)
		}
		return err
	}

	if failures > 0 {
		s.opts.Logf("snapshot: writing to %s works again after %d failed attempts", s.path, failures)
	}
	s.statsMu.Lock()
	s.stats.Commits++
	s.stats.RecordsWritten += uint64(written)
	s.stats.LastError = nil
	s.stats.LastWrite = end
	s.stats.LastBatchDuration = end.Sub(start)
	s.statsMu.Unlock()
	// Only now, so that whoever sees Pending drop sees the commit counted.
	s.mu.Lock()
	s.inflight = 0
	s.mu.Unlock()
	return nil
}

// apply writes batch in one bbolt Update and returns the number of record
// puts and deletes it made. It does not modify batch.
func (s *Store) apply(batch map[bucketRef]*change) (written int, err error) {
	if err := s.damagedErr(); err != nil {
		return 0, err
	}
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return 0, ErrClosed
	}
	defer func() {
		if r := recover(); r != nil {
			written, err = 0, s.markDamaged("writing", r)
		}
	}()
	err = s.db.Update(func(tx *bolt.Tx) error {
		written = 0
		sources := tx.Bucket([]byte(sourcesBucket))
		if sources == nil {
			return fmt.Errorf("no %q bucket", sourcesBucket)
		}
		// Sorted, so that a batch always touches pages in the same order.
		refs := slices.SortedFunc(maps.Keys(batch), func(a, b bucketRef) int {
			return cmp.Or(cmp.Compare(a.kind, b.kind), strings.Compare(a.name, b.name))
		})
		for _, ref := range refs {
			var n int
			var err error
			switch ref.kind {
			case kindSource:
				n, err = applySource(sources, ref.name, batch[ref])
			case kindClients:
				n, err = applyRecords(tx.Bucket([]byte(clientsBucket)), batch[ref])
			case kindClusterSetIPs:
				n, err = applyRecords(tx.Bucket([]byte(clusterSetIPsBucket)), batch[ref])
			case kindReplay:
				n, err = applyReplay(tx, ref.name, batch[ref])
			}
			written += n
			if err != nil {
				return fmt.Errorf("%s: %w", ref, err)
			}
		}
		return nil
	})
	return written, err
}

func applySource(sources *bolt.Bucket, name string, c *change) (written int, err error) {
	// Only puts and meta create a source; deletes alone never do.
	if !c.createsSource() {
		if c.reset {
			err := sources.DeleteBucket([]byte(name))
			if errors.Is(err, berrors.ErrBucketNotFound) {
				err = nil
			}
			return 0, err
		}
		if sources.Bucket([]byte(name)) == nil {
			return 0, nil
		}
	}
	sb, err := sources.CreateBucketIfNotExists([]byte(name))
	if err != nil {
		return 0, err
	}
	rb, err := sb.CreateBucketIfNotExists([]byte(recordsBucket))
	if err != nil {
		return 0, err
	}
	if c.reset && c.meta == nil {
		if err := sb.Delete([]byte(sourceMetaKey)); err != nil {
			return 0, err
		}
	}
	written, err = applyRecords(rb, c)
	if err != nil {
		return written, err
	}
	if c.meta != nil {
		b, err := encodeMeta(*c.meta)
		if err != nil {
			return written, err
		}
		if err := sb.Put([]byte(sourceMetaKey), b); err != nil {
			return written, err
		}
	}
	return written, nil
}

// applyRecords applies c's record changes to rb (a source's records bucket
// or a typed bucket). With c.reset, records c does not write are deleted.
func applyRecords(rb *bolt.Bucket, c *change) (written int, err error) {
	if rb == nil {
		return 0, errors.New("bucket missing")
	}
	if c.reset {
		// Delete what the new content does not have. Collect first:
		// deleting under a live cursor can skip keys.
		var stale [][]byte
		cur := rb.Cursor()
		for k, _ := cur.First(); k != nil; k, _ = cur.Next() {
			if o, ok := c.ops[string(k)]; !ok || o.del {
				stale = append(stale, append([]byte(nil), k...))
			}
		}
		for _, k := range stale {
			if err := rb.Delete(k); err != nil {
				return written, err
			}
			written++
		}
	}
	// Sorted keys fill leaf pages in order and keep the commit cheap.
	cur := rb.Cursor()
	for _, k := range slices.Sorted(maps.Keys(c.ops)) {
		o := c.ops[k]
		if o.del && c.reset {
			continue // removed above
		}
		// Seek rather than Get: Get cannot tell an empty value from no key.
		ck, cv := cur.Seek([]byte(k))
		exists := ck != nil && string(ck) == k
		switch {
		case o.del && !exists:
			continue
		case o.del:
			err = rb.Delete([]byte(k))
		case exists && bytes.Equal(cv, o.value):
			continue // unchanged: do not dirty the page
		default:
			err = rb.Put([]byte(k), o.value)
		}
		if err != nil {
			return written, err
		}
		written++
	}
	return written, nil
}
