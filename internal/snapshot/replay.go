package snapshot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// The replay memory of the relayed origins (internal/relay's Remembered):
// for each origin an edge reads through hubs under verify, the statement it
// accepted last for each Pod, and when a deleted Pod went, so that after a
// restart a hub cannot present a statement older than one accepted. One
// nested bucket per origin in replayBucket, keyed "<namespace>/<name>";
// changes are batched like a source's records. A file written before the
// bucket existed has none: it loads with an empty memory.

// Replay is what the snapshot keeps of one Pod of a relayed origin.
type Replay struct {
	Pod  string // "<namespace>/<name>"
	Seq  uint64
	Hash uint64
	Gone time.Time // zero while the Pod is held
}

// replayFormat is the first byte of an encoded Replay; another one does not
// decode.
const replayFormat = 1

// EncodeReplay encodes r's Seq, Hash and Gone (its Pod is the key): the
// format byte, Seq as a uvarint, Hash as 8 bytes big-endian, Gone as a
// uvarint of Unix nanoseconds (0 while held).
func EncodeReplay(r Replay) []byte {
	b := make([]byte, 0, 1+binary.MaxVarintLen64+8+binary.MaxVarintLen64)
	b = append(b, replayFormat)
	b = binary.AppendUvarint(b, r.Seq)
	b = binary.BigEndian.AppendUint64(b, r.Hash)
	var gone uint64
	if !r.Gone.IsZero() && r.Gone.UnixNano() > 0 {
		gone = uint64(r.Gone.UnixNano())
	}
	return binary.AppendUvarint(b, gone)
}

// DecodeReplay decodes what EncodeReplay wrote, for the Pod key.
func DecodeReplay(key, b []byte) (Replay, error) {
	if !validPodKey(key) {
		return Replay{}, fmt.Errorf("replay entry key %.64q is not <namespace>/<name>", key)
	}
	if len(b) == 0 || b[0] != replayFormat {
		return Replay{}, errors.New("replay entry of an unknown format")
	}
	rd := reader{b: b[1:]}
	r := Replay{Pod: string(key), Seq: rd.uvarint(^uint64(0))}
	if h := rd.bytes(8); h != nil {
		r.Hash = binary.BigEndian.Uint64(h)
	}
	gone := rd.uvarint(1<<63 - 1)
	if rd.err != nil {
		return Replay{}, fmt.Errorf("replay entry: %w", rd.err)
	}
	if len(rd.b) > 0 {
		return Replay{}, fmt.Errorf("replay entry: %d bytes past its end", len(rd.b))
	}
	if gone > 0 {
		r.Gone = time.Unix(0, int64(gone))
	}
	return r, nil
}

// validPodKey reports whether k is "<namespace>/<name>", both non-empty.
func validPodKey(k []byte) bool {
	ns, name, ok := strings.Cut(string(k), "/")
	return ok && ns != "" && name != "" && !strings.Contains(name, "/")
}

func replayRef(origin string) bucketRef { return bucketRef{kindReplay, origin} }

// PutReplay records what the memory of origin holds of r.Pod.
func (s *Store) PutReplay(origin string, r Replay) {
	v := EncodeReplay(r)
	s.enqueue(replayRef(origin), checkRecord(origin, r.Pod, v), func(c *change) *change {
		c.ops[r.Pod] = op{value: v}
		return c
	})
}

// DeleteReplay forgets pod from the memory of origin.
func (s *Store) DeleteReplay(origin, pod string) {
	s.enqueue(replayRef(origin), checkRecord(origin, pod, nil), func(c *change) *change {
		c.ops[pod] = op{del: true}
		return c
	})
}

// ReplaceReplay makes mem the whole memory of origin (none: the origin's
// bucket goes).
func (s *Store) ReplaceReplay(origin string, mem []Replay) {
	recs := make(map[string][]byte, len(mem))
	for _, r := range mem {
		recs[r.Pod] = EncodeReplay(r)
	}
	s.replace(replayRef(origin), checkSource(origin), recs, nil)
}

// DropReplay forgets the memory of origin.
func (s *Store) DropReplay(origin string) { s.ReplaceReplay(origin, nil) }

// LoadReplay calls fn with the memory of every origin committed to the file
// (a file without the bucket has none). An entry that does not decode (or a
// nested bucket in its place) is skipped, logged and counted in bad, and
// queued for deletion (the whole origin's bucket, rewritten with its good
// entries, when a nested bucket stands among them); so is an origin's
// bucket whose place holds a value. The good entries always load.
func (s *Store) LoadReplay(fn func(origin string, mem []Replay)) (bad int, err error) {
	type rewrite struct {
		origin string
		mem    []Replay
	}
	var stale [][2]string // origin, key
	var rewrites []rewrite
	var dropped []string // values where an origin's bucket belongs
	err = s.view(func(tx *bolt.Tx) error {
		top := tx.Bucket([]byte(replayBucket))
		if top == nil {
			return nil
		}
		return top.ForEach(func(name, v []byte) error {
			origin := string(name)
			if v != nil {
				s.opts.Logf("snapshot: replay memory: %.64q is not a bucket: skipped", name)
				dropped = append(dropped, origin)
				return nil
			}
			ob := top.Bucket(name)
			var mem []Replay
			nested := false
			err := ob.ForEach(func(k, v []byte) error {
				if v == nil {
					nested = true
					s.opts.Logf("snapshot: replay memory of %.64q: %.64q is a bucket, not an entry: skipped", name, k)
					bad++
					return nil
				}
				r, err := DecodeReplay(k, v)
				if err != nil {
					s.opts.Logf("snapshot: replay memory of %.64q: %.64q: %v: skipped", name, k, err)
					stale = append(stale, [2]string{origin, string(k)})
					return nil
				}
				mem = append(mem, r)
				return nil
			})
			if err != nil {
				return err
			}
			if nested {
				rewrites = append(rewrites, rewrite{origin, mem})
			}
			fn(origin, mem)
			return nil
		})
	})
	for _, k := range stale {
		s.DeleteReplay(k[0], k[1])
	}
	for _, r := range rewrites {
		s.ReplaceReplay(r.origin, r.mem)
	}
	for _, o := range dropped {
		s.DropReplay(o)
	}
	return bad + len(stale) + len(dropped), err
}

// applyReplay applies c to the memory of origin. A replacement deletes the
// origin's bucket and writes it anew (whatever stood in it, even a nested
// bucket, goes); one with nothing to write leaves no bucket.
func applyReplay(tx *bolt.Tx, origin string, c *change) (written int, err error) {
	top, err := tx.CreateBucketIfNotExists([]byte(replayBucket))
	if err != nil {
		return 0, err
	}
	if c.reset {
		switch err := top.DeleteBucket([]byte(origin)); {
		case err == nil:
			written++
		case errors.Is(err, berrors.ErrIncompatibleValue):
			// A value where the bucket belongs (a damaged entry).
			if err := top.Delete([]byte(origin)); err != nil {
				return written, err
			}
			written++
		case !errors.Is(err, berrors.ErrBucketNotFound):
			return written, err
		}
		if !c.createsSource() {
			return written, nil
		}
	} else if !c.createsSource() && top.Bucket([]byte(origin)) == nil {
		return 0, nil // deletes alone create nothing
	}
	ob, err := top.CreateBucketIfNotExists([]byte(origin))
	if err != nil {
		return written, err
	}
	n, err := applyRecords(ob, c)
	return written + n, err
}
