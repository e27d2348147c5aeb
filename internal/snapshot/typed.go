package snapshot

import (
	"errors"
	"fmt"
	"iter"
	"net/netip"

	bolt "go.etcd.io/bbolt"

	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/clustersetip"
)

// The typed buckets: the local Pods as DNS clients (who imports what, by IP,
// so that alias names and imports enforce work after a restart while the API
// server is unreachable) and the ClusterSetIP services. Both are keyed
// "<namespace>/<name>" and written through their codecs (clientcodec.go,
// clustersetipcodec.go); like a source's records, changes are batched.

var (
	clientsRef       = bucketRef{kind: kindClients}
	clusterSetIPsRef = bucketRef{kind: kindClusterSetIPs}
)

func nameKey(namespace, name string) string { return namespace + "/" + name }

// IsNameKey reports whether key is "<namespace>/<name>": the key every
// record of this package is stored under.
func IsNameKey(key []byte, namespace, name string) bool {
	return len(key) == len(namespace)+1+len(name) && key[len(namespace)] == '/' &&
		string(key[:len(namespace)]) == namespace && string(key[len(namespace)+1:]) == name
}

// PutClient records a local Pod's client record and IPs.
func (s *Store) PutClient(c *clients.Client, ips []netip.Addr) {
	key, v := nameKey(c.Namespace, c.Name), EncodeClient(c, ips)
	s.enqueue(clientsRef, checkRecord("-", key, v), func(ch *change) *change {
		ch.ops[key] = op{value: v}
		return ch
	})
}

// DeleteClient removes the client record of the Pod namespace/name.
func (s *Store) DeleteClient(namespace, name string) {
	s.deleteKey(clientsRef, nameKey(namespace, name))
}

func (s *Store) deleteKey(ref bucketRef, key string) {
	s.enqueue(ref, checkRecord("-", key, nil), func(ch *change) *change {
		ch.ops[key] = op{del: true}
		return ch
	})
}

// ReplaceClients makes all the whole content of the clients bucket.
func (s *Store) ReplaceClients(all iter.Seq2[*clients.Client, []netip.Addr]) {
	recs := map[string][]byte{}
	for c, ips := range all {
		recs[nameKey(c.Namespace, c.Name)] = EncodeClient(c, ips)
	}
	s.replace(clientsRef, "", recs, nil)
}

// LoadClients calls fn for every client record committed to the file.
// Records that do not decode, or that are stored under another key than
// their namespace/name, are skipped, queued for deletion and counted in bad.
func (s *Store) LoadClients(fn func(c *clients.Client, ips []netip.Addr)) (bad int, err error) {
	var stale []string
	err = s.view(func(tx *bolt.Tx) error {
		return forEach(typedBucket(tx, kindClients), func(k, v []byte) {
			c, ips, err := DecodeClient(v)
			if err != nil || !IsNameKey(k, c.Namespace, c.Name) {
				stale = append(stale, string(k))
				return
			}
			fn(c, ips)
		})
	})
	for _, k := range stale {
		s.deleteKey(clientsRef, k)
	}
	return len(stale), err
}

// importStateKey, in the ClusterSetIP bucket, holds whether ServiceImports
// were served (clustersetip.ImportState's String): after a restart while the API
// server is unreachable, services exported as ClusterSetIP answer as they
// did. It has no "/", so it is never a record's key.
const importStateKey = "import-state"

// ReplaceClusterSetIPs makes list the whole content of the ClusterSetIP
// bucket, without an import state. An entry that does not encode is left out
// and counted in bad.
func (s *Store) ReplaceClusterSetIPs(list []clustersetip.ClusterSetIP) (bad int) {
	return s.ReplaceImports(list, clustersetip.ImportsUnknown)
}

// ReplaceImports makes list and state the whole content of the ClusterSetIP
// bucket (ImportsUnknown is not stored). An entry that does not encode is
// left out and counted in bad.
func (s *Store) ReplaceImports(list []clustersetip.ClusterSetIP, state clustersetip.ImportState) (bad int) {
	recs := make(map[string][]byte, len(list)+1)
	if state != clustersetip.ImportsUnknown {
		recs[importStateKey] = []byte(state.String())
	}
	for _, ci := range list {
		b, err := EncodeClusterSetIP(ci)
		if err != nil {
			bad++
			continue
		}
		recs[nameKey(ci.Namespace, ci.Name)] = b
	}
	s.replace(clusterSetIPsRef, "", recs, nil)
	return bad
}

// LoadClusterSetIPs returns the ClusterSetIP services committed to the file.
// Records that do not decode, or that are stored under another key than
// their namespace/name, are skipped, queued for deletion and counted in bad.
func (s *Store) LoadClusterSetIPs() (list []clustersetip.ClusterSetIP, bad int, err error) {
	var stale []string
	err = s.view(func(tx *bolt.Tx) error {
		return forEach(typedBucket(tx, kindClusterSetIPs), func(k, v []byte) {
			if string(k) == importStateKey {
				return
			}
			ci, err := DecodeClusterSetIP(v)
			if err != nil || !IsNameKey(k, ci.Namespace, ci.Name) {
				stale = append(stale, string(k))
				return
			}
			list = append(list, ci)
		})
	})
	for _, k := range stale {
		s.deleteKey(clusterSetIPsRef, k)
	}
	return list, len(stale), err
}

// LoadImportState returns the import state committed to the file
// (ImportsUnknown when none, or one this version does not know).
func (s *Store) LoadImportState() (state clustersetip.ImportState, err error) {
	err = s.view(func(tx *bolt.Tx) error {
		if b := typedBucket(tx, kindClusterSetIPs); b != nil {
			switch string(b.Get([]byte(importStateKey))) {
			case clustersetip.ImportsServed.String():
				state = clustersetip.ImportsServed
			case clustersetip.ImportsAbsent.String():
				state = clustersetip.ImportsAbsent
			}
		}
		return nil
	})
	return state, err
}

// typedBucket returns the bucket of a typed kind; in a schema 1 file (read
// by OpenReadOnly, which does not migrate), the source that held it.
func typedBucket(tx *bolt.Tx, k kind) *bolt.Bucket {
	name, v1 := clientsBucket, v1ClientsSource
	if k == kindClusterSetIPs {
		name, v1 = clusterSetIPsBucket, v1ClusterSetIPsSource
	}
	if b := tx.Bucket([]byte(name)); b != nil {
		return b
	}
	if sources := tx.Bucket([]byte(sourcesBucket)); sources != nil {
		if sb := sources.Bucket([]byte(v1)); sb != nil {
			return sb.Bucket([]byte(recordsBucket))
		}
	}
	return nil
}

var errNoBucket = errors.New("bucket missing")

// forEach calls fn for every key and value of b; a missing bucket (a schema
// 1 file that never had that source) holds nothing.
func forEach(b *bolt.Bucket, fn func(k, v []byte)) error {
	if b == nil {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			return fmt.Errorf("%q: %w (a nested bucket in its place)", k, errNoBucket)
		}
		fn(k, v)
		return nil
	})
}
