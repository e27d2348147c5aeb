package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Bucket and key names. Every access to the file goes through these.
const (
	// metaBucket holds file-level metadata.
	metaBucket = "meta"
	// schemaVersionKey, in metaBucket, holds schemaVersion.
	schemaVersionKey = "schema_version"
	// schemaVersion is the layout this package writes. A file of
	// schemaVersion1 is migrated to it in place when opened (see migrate1);
	// any other value makes the file unusable (it is moved aside and
	// rebuilt: the snapshot is a cache).
	schemaVersion  = "2"
	schemaVersion1 = "1"

	// sourcesBucket holds one nested bucket per source: a cluster's Pods.
	sourcesBucket = "sources"
	// clientsBucket holds the local Pods as DNS clients, keyed
	// "<namespace>/<name>" (clientcodec.go).
	clientsBucket = "clients"
	// clusterSetIPsBucket holds the ClusterSetIP services, keyed
	// "<namespace>/<name>" (clustersetipcodec.go).
	clusterSetIPsBucket = "clustersetips"
	// replayBucket holds one nested bucket per relayed origin: its replay
	// memory, keyed "<namespace>/<name>" (replay.go). A schema 2 file
	// written before it existed has none: it is made on the first write.
	replayBucket = "replay"
	// sourceMetaKey, in a source bucket, holds the JSON encoded Meta.
	sourceMetaKey = "meta"
	// recordsBucket, in a source bucket, holds the source's records.
	recordsBucket = "records"
)

// Schema 1 kept the clients and the ClusterSetIP services as sources of
// these names (a cluster ID cannot start with "~").
const (
	v1ClientsSource       = "~clients"
	v1ClusterSetIPsSource = "~serviceimports"
)

// storedMeta is the on-disk form of Meta. Records is not stored: it is
// counted on Load. Unknown JSON fields are ignored, so fields can be added
// without a schema version change.
type storedMeta struct {
	ClusterID    string    `json:"clusterID,omitempty"`
	LastContact  time.Time `json:"lastContact"`
	LastFullSync time.Time `json:"lastFullSync"`
	State        string    `json:"state,omitempty"`
	Via          []string  `json:"via,omitempty"`
}

func encodeMeta(m Meta) ([]byte, error) {
	return json.Marshal(storedMeta{
		ClusterID:    m.ClusterID,
		LastContact:  m.LastContact.UTC(),
		LastFullSync: m.LastFullSync.UTC(),
		State:        m.State,
		Via:          m.Via,
	})
}

func decodeMeta(b []byte) (Meta, error) {
	var sm storedMeta
	if err := json.Unmarshal(b, &sm); err != nil {
		return Meta{}, err
	}
	return Meta{ClusterID: sm.ClusterID, LastContact: sm.LastContact, LastFullSync: sm.LastFullSync, State: sm.State, Via: sm.Via}, nil
}

// errUnusable marks a problem with the file's contents (as opposed to an I/O
// error): the file should be moved aside.
var errUnusable = errors.New("unusable snapshot")

func unusable(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUnusable}, args...)...)
}

// inspect checks a freshly opened file inside tx. It reports empty when the
// file holds no bucket at all (new, or a crash before initSchema committed),
// and an error wrapping errUnusable when the file is not a usable snapshot.
// It reads every bucket, key and value, so a damaged page is hit here, under
// the caller's fault protection, rather than later in Load, in a write, or
// in tx.Check's goroutine, which has no such protection.
func inspect(tx *bolt.Tx, fileSize int64) (empty bool, version string, err error) {
	if hw := tx.Size(); hw > fileSize {
		return false, "", unusable("file is %d bytes but its pages extend to %d bytes (truncated)", fileSize, hw)
	}
	if err := checkPages(tx); err != nil {
		return false, "", err
	}
	_ = tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
		touchAll(b)
		return nil
	})

	meta := tx.Bucket([]byte(metaBucket))
	if meta == nil {
		if k, _ := tx.Cursor().First(); k == nil {
			return true, "", nil
		}
		return false, "", unusable("no %q bucket: not a snapshot file", metaBucket)
	}
	switch v := meta.Get([]byte(schemaVersionKey)); {
	case v == nil:
		return false, "", unusable("no schema version")
	case string(v) == schemaVersion:
		for _, name := range []string{clientsBucket, clusterSetIPsBucket} {
			if tx.Bucket([]byte(name)) == nil {
				return false, "", unusable("no %q bucket", name)
			}
		}
	case string(v) != schemaVersion1:
		return false, "", unusable("unknown schema version %q (this build reads %q and %q)", v, schemaVersion1, schemaVersion)
	}
	version = string(meta.Get([]byte(schemaVersionKey)))
	sources := tx.Bucket([]byte(sourcesBucket))
	if sources == nil {
		return false, "", unusable("no %q bucket", sourcesBucket)
	}
	return false, version, sources.ForEach(func(name, v []byte) error {
		if v != nil {
			return unusable("%q in %q is not a bucket", name, sourcesBucket)
		}
		sb := sources.Bucket(name)
		if mv := sb.Get([]byte(sourceMetaKey)); mv != nil {
			if _, err := decodeMeta(mv); err != nil {
				return unusable("source %q: meta: %v", name, err)
			}
		}
		if sb.Get([]byte(recordsBucket)) != nil {
			return unusable("source %q: %q is not a bucket", name, recordsBucket)
		}
		return nil
	})
}

// touchSink keeps touchAll's reads from being optimised away; atomic, as
// two Opens may run at once.
var touchSink atomic.Uint32

// touchAll reads every key, and the first and last byte of every value, in
// b and the buckets nested in it: every page, and every value's extent.
func touchAll(b *bolt.Bucket) {
	var x byte
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil {
			if nb := b.Bucket(k); nb != nil {
				touchAll(nb)
			}
			continue
		}
		if len(v) > 0 {
			x ^= v[0] ^ v[len(v)-1]
		}
	}
	touchSink.Add(uint32(x))
}

// initSchema writes the layout into an empty file.
func initSchema(tx *bolt.Tx) error {
	meta, err := tx.CreateBucketIfNotExists([]byte(metaBucket))
	if err != nil {
		return err
	}
	if err := meta.Put([]byte(schemaVersionKey), []byte(schemaVersion)); err != nil {
		return err
	}
	for _, name := range []string{sourcesBucket, clientsBucket, clusterSetIPsBucket, replayBucket} {
		if _, err := tx.CreateBucketIfNotExists([]byte(name)); err != nil {
			return err
		}
	}
	return nil
}

// migrate1 turns a schema 1 file into schema 2 in one transaction: the
// records of the "~clients" and "~serviceimports" sources move, unchanged
// (the codecs did not change), into their own buckets, and those sources go.
func migrate1(tx *bolt.Tx) error {
	if err := initSchema(tx); err != nil {
		return err
	}
	sources := tx.Bucket([]byte(sourcesBucket))
	for name, to := range map[string]string{v1ClientsSource: clientsBucket, v1ClusterSetIPsSource: clusterSetIPsBucket} {
		sb := sources.Bucket([]byte(name))
		if sb == nil {
			continue
		}
		dst := tx.Bucket([]byte(to))
		if rb := sb.Bucket([]byte(recordsBucket)); rb != nil {
			if err := rb.ForEach(func(k, v []byte) error { return dst.Put(k, v) }); err != nil {
				return err
			}
		}
		if err := sources.DeleteBucket([]byte(name)); err != nil {
			return err
		}
	}
	return nil
}
