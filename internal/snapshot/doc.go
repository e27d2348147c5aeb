// Package snapshot persists the plugin's records (internal/store) in a bbolt
// file so that the plugin can answer from its last known records when the
// Kubernetes API is unreachable, including straight after a restart. It is
// the one home of persistence: the file's layout, the batched writer, and the
// codecs of what it holds.
//
// # Layout
//
//	meta/                     bucket
//	  schema_version = "2"
//	sources/                  bucket
//	  <cluster>/              one nested bucket per source (a cluster)
//	    meta    = JSON {clusterID, lastContact, lastFullSync, state}
//	    records/              bucket: <namespace>/<name> = a Pod (podcodec.go)
//	clients/                  bucket: <namespace>/<name> = a DNS client (clientcodec.go)
//	clustersetips/            bucket: <namespace>/<name> = a ClusterSetIP service (clustersetipcodec.go)
//	replay/                   bucket (optional: made on the first write)
//	  <origin>/               one nested bucket per relayed origin: its replay memory
//	    <namespace>/<name>    = 0x01, Seq (uvarint), hash (8 bytes, big-endian),
//	                            gone (uvarint Unix nanoseconds, 0 while held) (replay.go)
//
// A source's records are opaque bytes to the store (Put, ReplaceSource,
// Scan: the plugin decodes them on every CPU at start-up); the clients and
// the ClusterSetIP services have typed methods (typed.go).
//
// The compact forms share their pieces (strings, counts, addresses, a reader
// whose first error sticks) in wire.go.
//
// The replay bucket keeps, for each origin an edge reads through relay hubs
// under verify, what internal/relay remembers of each Pod (Replay), so that a
// restart does not forget which statements are older than one accepted. A
// schema 2 file written before it existed has none and loads with an empty
// memory (no version change: the bucket is only added); an entry that does
// not decode, or a nested bucket in an entry's place, is skipped, logged,
// counted by LoadReplay and forgotten, and never costs the file or the
// other entries.
//
// Bucket and key names are declared once in schema.go. A file of schema "1"
// (the clients and ClusterSetIP services kept as sources "~clients" and
// "~serviceimports") is migrated in place when opened: the records move
// unchanged. A file whose schema version is missing or unknown is treated as
// unusable: the snapshot is a cache, so it is moved aside and rebuilt from
// the API rather than migrated.
//
// # Writes
//
// Put, Delete, ReplaceSource, SetMeta, DropSource and the typed buckets'
// changes only record the change in memory, coalescing it with changes to
// the same key that are still pending, and return at once. A single goroutine commits everything pending in one
// bbolt Update per batch (every Options.BatchInterval, 100ms by default, the
// interval etcd uses). A ReplaceSource's deletions and writes are committed
// in the same transaction, so the file never holds a source half replaced.
// If a commit fails (disk full, read-only file system, closed database) the
// error is logged and counted in Stats, and the changes stay pending and are
// retried with a capped exponential backoff; callers are never blocked, and
// nothing is dropped unless the store is closed while writes still fail.
//
// # Crash safety
//
// NoSync is never set: every commit is fsynced before Flush or the batcher
// reports success. bbolt is copy-on-write, so a crash in the middle of a commit
// leaves the previous committed state in place; only what was still pending in
// memory (normally under BatchInterval of changes) is lost, and the plugin
// resyncs it from the API.
//
// A crash during bbolt's own first initialisation, a truncated copy, disk
// corruption or a file from an incompatible version can leave a file bbolt
// rejects or, worse, one whose pages point past its end. Open therefore
// checks the file before handing it out: bbolt's own validation, the file
// size against the high-water mark, a walk of the page tree from the
// file's bytes before bbolt trusts any length, count or page number in it
// (each page once, so a damaged file costs O(its size); the freelist page
// is checked before a writable bolt.Open reads it: pages.go), one read of
// every bucket, key and value with page faults turned into recoverable panics
// (runtime/debug.SetPanicOnFault), the schema version, and bbolt's
// consistency check (tx.Check). A file that fails any of these is renamed to
// <path>.corrupt-<UTC time> (kept for inspection; this package never deletes
// one) and a fresh empty store is created in its place. A file that is merely
// locked by another open Store is never moved: Open waits
// Options.OpenTimeout and returns an error wrapping ErrLocked. Nor is one
// that cannot be opened for another reason (permissions, a read-only file
// system): that is an error too. A zero-length file (the crash happened
// before bbolt wrote its first pages) holds nothing to keep: bbolt
// initialises it in place and LoadResult.Reason says so.
//
// If the file is damaged while open (truncated underneath, a bad disk), the
// first read or write that hits the damage gets an error wrapping ErrDamaged
// instead of crashing the server; from then on the Store makes no bbolt call
// (a panic can leave bbolt's internal locks held) and Close releases the file
// without bbolt's help, so the next Open can move it aside.
//
// # Reload
//
// bbolt locks the file with flock, which also excludes a second Open of the
// same path in the same process. CoreDNS starts the new server instance (and
// runs its setup and OnStartup) before it runs the old instance's OnShutdown,
// so the old Store must be closed in an OnRestart hook (and reopened in
// OnRestartFailed), or the new instance must retry Open, or it will wait
// OpenTimeout and get ErrLocked.
package snapshot
