package mcscontroller

import (
	"context"
	"iter"
	"time"

	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// The snapshot (mcs-annotator --snapshot-dir) is the controller's own
// memory of every cluster's share across a restart, as CoreDNS's is
// (internal/snapshot, the same file format): the record store's records,
// journaled from its change feed, and each source's last contact and last
// full list. At start, before any source runs, RestoreSnapshot puts back
// the records of each cluster that had listed completely: such a cluster
// counts as current (Config.Restored), so a cluster that stays cut keeps
// exactly its records, planned like a current one's, and its expiry and
// stale policies count from the last contact the file kept. Nothing of a
// cluster's share is ever read back from the objects the controller wrote.

// snapshotErrorKinds are the kind label values of mcs_controller_snapshot_errors_total.
var snapshotErrorKinds = []string{"open", "moved_aside", "load", "bad_record", "encode"}

// contactSaveEvery is how far a connected source's last contact may run
// ahead of the one in the file before it is written (a change of state or a
// full list writes it at once): a controller killed while connected and
// started again while cut counts the cluster's expiry and stale policies
// from at most this much before the contact was lost.
var contactSaveEvery = 30 * time.Second

// metaPoll is how often the sources' contact and state are looked at for
// the file.
var metaPoll = time.Second

// seeder is what RestoreSnapshot sets on a source (internal/source.Source):
// the last contact and full list from before the restart, unless the source
// has its own already.
type seeder interface {
	SeedLastContact(time.Time)
	SeedLastFullSync(time.Time)
}

// fullSyncer tells when a source last listed completely (internal/source.Source).
type fullSyncer interface{ LastFullSync() time.Time }

// OpenSnapshot opens the snapshot file at path, logging and counting a
// failure (nil: the controller runs without it) and a file moved aside.
func OpenSnapshot(path string, m *Metrics) *snapshot.Store {
	st, res, err := snapshot.Open(path, snapshot.Options{Logf: klog.Warningf})
	if err != nil {
		m.SnapshotErrors.WithLabelValues("open").Inc()
		klog.Errorf("mcs-controller: snapshot %s: %v: running without it (a cluster cut at a restart keeps its slices as they are, see the README)", path, err)
		return nil
	}
	if res.MovedAside != "" {
		m.SnapshotErrors.WithLabelValues("moved_aside").Inc()
		klog.Warningf("mcs-controller: snapshot %s was unusable (%s): moved aside to %s; starting empty", path, res.Reason, res.MovedAside)
	}
	return st
}

// RestoreSnapshot puts into rs the records st holds of each cluster of
// srcs that had listed completely, seeds its source's last contact and full
// list, and returns those clusters (Config.Restored). The records of a
// cluster no source reads are dropped from the file; a record that does not
// decode, or that claims another cluster, key or namespace than the one it
// was stored under, is skipped, deleted from the file, logged and counted.
// It must run before the sources start.
func RestoreSnapshot(st *snapshot.Store, rs *store.Store, srcs []Source, m *Metrics) map[string]bool {
	bySource := make(map[string]Source, len(srcs))
	for _, s := range srcs {
		bySource[s.Cluster()] = s
	}
	restored := map[string]bool{}
	err := st.Scan(func(cluster string, meta snapshot.Meta, records iter.Seq2[[]byte, []byte]) error {
		s := bySource[cluster]
		if s == nil {
			st.DropSource(cluster)
			klog.Infof("mcs-controller: snapshot: dropping the records of cluster %s, which is no longer read", cluster)
			return nil
		}
		pods, bad, err := snapshot.DecodeRecords(st, cluster, meta.Records, records)
		if err != nil {
			return err
		}
		for _, k := range bad {
			m.SnapshotErrors.WithLabelValues("bad_record").Inc()
			st.Delete(cluster, k)
		}
		if len(bad) > 0 {
			klog.Warningf("mcs-controller: snapshot: cluster %s: skipped %d records that do not decode or do not belong to it", cluster, len(bad))
		}
		if sd, ok := s.(seeder); ok {
			sd.SeedLastContact(meta.LastContact)
			sd.SeedLastFullSync(meta.LastFullSync)
		}
		if meta.LastFullSync.IsZero() {
			// Never listed completely: what the file holds is not its share.
			klog.Infof("mcs-controller: snapshot: cluster %s never listed completely: not restored", cluster)
			return nil
		}
		rs.ReplaceCluster(cluster, pods)
		restored[cluster] = true
		klog.Infof("mcs-controller: snapshot: cluster %s: %d records restored, last full list %s, last contact %s",
			cluster, len(pods), stamp(meta.LastFullSync), stamp(meta.LastContact))
		return nil
	})
	if err != nil {
		// The clusters restored before the error are whole and stay; the
		// others wait for their API servers.
		m.SnapshotErrors.WithLabelValues("load").Inc()
		klog.Errorf("mcs-controller: snapshot %s: %v: %d clusters restored before it", st.Path(), err, len(restored))
	}
	return restored
}

// SeedReplay seeds the replay memory of hubs, the reader of relay hubs,
// from st, before hubs start (relay.(*Relay).SeedSnapshot): after a
// restart, a hub presenting a statement older than one the controller
// accepted before (a deleted Pod's too, for relay.TombstoneTTL) is still
// refused. Entries that do not decode, and a failed load, are logged and
// counted. Journal the memory's changes with relay.JournalSnapshot.
func SeedReplay(st *snapshot.Store, hubs *relay.Relay, m *Metrics) {
	bad, err := hubs.SeedSnapshot(st, func(format string, args ...any) { klog.Infof("mcs-controller: "+format, args...) },
		func(format string, args ...any) { klog.V(2).Infof("mcs-controller: "+format, args...) })
	if bad > 0 {
		m.SnapshotErrors.WithLabelValues("bad_record").Add(float64(bad))
		klog.Warningf("mcs-controller: snapshot %s: replay memory: skipped %d entries that do not decode", st.Path(), bad)
	}
	if err != nil {
		m.SnapshotErrors.WithLabelValues("load").Inc()
		klog.Errorf("mcs-controller: snapshot %s: loading the replay memory: %v", st.Path(), err)
	}
}

// ReplayOnlySnapshot makes st the file of a relay hub's replay memory
// alone (mcs-annotator --relay --hub --verify --snapshot-dir): the records
// of every cluster an earlier run kept are dropped (a hub's slices carry
// the origins' bytes, which the file does not keep, so they are never
// restored), and st is closed once ctx is done. Call it before SeedReplay.
// The channel it returns is closed once the file is closed.
func ReplayOnlySnapshot(ctx context.Context, st *snapshot.Store) <-chan struct{} {
	var dropped []string
	err := st.Scan(func(cluster string, _ snapshot.Meta, _ iter.Seq2[[]byte, []byte]) error {
		dropped = append(dropped, cluster)
		return nil
	})
	for _, cluster := range dropped {
		st.DropSource(cluster)
	}
	if len(dropped) > 0 {
		klog.Infof("mcs-controller: snapshot: --relay keeps only the replay memory: dropping the records of %d clusters an earlier run kept", len(dropped))
	}
	if err != nil {
		klog.Errorf("mcs-controller: snapshot %s: listing the clusters it holds: %v", st.Path(), err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		if err := st.Close(); err != nil {
			klog.Errorf("mcs-controller: snapshot %s: close: %v", st.Path(), err)
		}
	}()
	return done
}

// JournalSnapshot keeps st current until ctx is done, then closes it:
// every change of the records of srcs' clusters (the records read through
// relay hubs are not kept, their replay memory is: SeedReplay), and each
// source's last contact, full list and state. Call it after RestoreSnapshot and before the sources start. The
// channel it returns is closed once the file is closed.
func JournalSnapshot(ctx context.Context, st *snapshot.Store, rs *store.Store, srcs []Source, m *Metrics) <-chan struct{} {
	read := make(map[string]bool, len(srcs))
	for _, s := range srcs {
		read[s.Cluster()] = true
	}
	rs.Subscribe(func(changes []store.Change) {
		if n := st.Journal(changes, func(cluster string) bool { return read[cluster] }); n > 0 {
			m.SnapshotErrors.WithLabelValues("encode").Add(float64(n))
		}
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		saved := map[string]snapshot.Meta{}
		save := func(all bool) {
			for _, s := range srcs {
				mt := sourceMeta(s)
				old, ok := saved[s.Cluster()]
				if !all && ok && mt.State == old.State && mt.LastFullSync.Equal(old.LastFullSync) &&
					(mt.State != "connected" || mt.LastContact.Sub(old.LastContact) < contactSaveEvery) {
					continue
				}
				st.SetMeta(s.Cluster(), mt)
				saved[s.Cluster()] = mt
			}
		}
		t := time.NewTicker(metaPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				save(true)
				if err := st.Close(); err != nil {
					klog.Errorf("mcs-controller: snapshot %s: close: %v", st.Path(), err)
				}
				return
			case <-t.C:
				save(false)
			}
		}
	}()
	return done
}

// sourceMeta is what the file keeps of a source besides its records.
func sourceMeta(s Source) snapshot.Meta {
	mt := snapshot.Meta{ClusterID: s.Cluster(), LastContact: s.LastContact(), State: "disconnected"}
	if s.Connected() {
		mt.State = "connected"
	}
	if f, ok := s.(fullSyncer); ok {
		mt.LastFullSync = f.LastFullSync()
	}
	return mt
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}
