package mcsannotations

import (
	"context"
	"errors"
	"iter"
	"math"
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// The snapshot is a cache on disk of what the plugin holds (the record
// store's records, the DNS clients, the ClusterSetIP services): loaded before
// any source starts, so names resolve from the first query even when no API
// server answers, and kept current by journaling every change (for records,
// from the record store's feed).

// openSnapshot opens the snapshot file and, when load is true, loads it into
// the record store. Any failure leaves the plugin serving without a snapshot: it
// never stops start-up. A file that cannot be opened (a full disk, a
// permission, a lock another process holds, a directory in its place) is
// tried again in the background until it opens (retrySnapshot).
func (m *MCS) openSnapshot(load bool) {
	m.snapMu.Lock()
	defer m.snapMu.Unlock()
	if m.snapshotPath == "" || m.store.Load() != nil {
		return
	}
	m.snapClosed = false
	start := time.Now()
	st, err := m.openStore()
	if err != nil {
		log.Errorf("snapshot %s: %v: serving without a snapshot, trying again in the background", m.snapshotPath, err)
		m.retrySnapshot(load)
		return
	}
	if load {
		m.loadSnapshot(st)
		snapshotLoadSeconds.Set(time.Since(start).Seconds())
	}
	m.store.Store(st)
	snapshotOpen.Set(1)
}

// openStore opens the file, counting failures and a file moved aside.
func (m *MCS) openStore() (*snapshot.Store, error) {
	st, res, err := snapshot.Open(m.snapshotPath, snapshot.Options{Logf: log.Warningf})
	if err != nil {
		snapshotErrors.WithLabelValues("open").Inc()
		snapshotOpen.Set(0)
		return nil, err
	}
	if res.MovedAside != "" {
		snapshotErrors.WithLabelValues("moved_aside").Inc()
		log.Warningf("snapshot %s was unusable (%s): moved aside to %s; starting empty, resyncing from the API", m.snapshotPath, res.Reason, res.MovedAside)
	}
	return st, nil
}

// snapshotRetry is the backoff between attempts to open a snapshot that
// could not be opened: 1 s doubling to at most a minute; tests shorten it.
var snapshotRetry = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: time.Minute}

// retrySnapshot starts the background attempts to open the file (m.snapMu
// is held), unless they run already. When the file opens, the table is
// written to it; if nothing is held yet (no source has listed and the table
// is empty: the start found the file locked while the API is unreachable),
// the file is loaded instead, as at start. closeSnapshot stops them.
func (m *MCS) retrySnapshot(load bool) {
	if m.snapRetry != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	m.snapRetry, m.snapRetryDone = cancel, done
	go func() {
		defer close(done)
		attempts := 1
		_ = wait.ExponentialBackoffWithContext(ctx, snapshotRetry, func(context.Context) (bool, error) {
			attempts++
			st, err := m.openStore()
			if err != nil {
				log.Warningf("snapshot %s: attempt %d: %v: still serving without a snapshot", m.snapshotPath, attempts, err)
				return false, nil
			}
			m.snapMu.Lock()
			defer m.snapMu.Unlock()
			if m.snapClosed || ctx.Err() != nil {
				_ = st.Close() // closed meanwhile (reload, shutdown): not ours to keep
				return true, nil
			}
			how := "wrote the current table to it"
			if load && m.holdsNothing() {
				m.loadSnapshot(st)
				how = "loaded it (nothing was held yet)"
			} else {
				m.writeTable(st)
			}
			m.store.Store(st)
			snapshotOpen.Set(1)
			log.Infof("snapshot %s: opened after %d attempts; %s", m.snapshotPath, attempts, how)
			return true, nil
		})
	}()
}

// stopRetry ends the background attempts and waits for them (m.snapMu must
// not be held: an attempt takes it).
func (m *MCS) stopRetry() {
	m.snapMu.Lock()
	cancel, done := m.snapRetry, m.snapRetryDone
	m.snapRetry, m.snapRetryDone = nil, nil
	m.snapMu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// holdsNothing: no source has listed and the record store holds no record.
func (m *MCS) holdsNothing() bool {
	for _, s := range m.sources {
		if s.HasSynced() {
			return false
		}
	}
	for _, n := range m.records.Len() {
		if n > 0 {
			return false
		}
	}
	return true
}

// loadSnapshot fills the record store from the file. Records of clusters this
// instance does not watch are dropped from the file; records that do not
// decode, or that claim another cluster or namespace than the one they were
// stored under, are skipped and counted.
func (m *MCS) loadSnapshot(st *snapshot.Store) {
	total := 0
	// Relayed origins are summed up in one line (a thousand of them would
	// be a thousand lines at every start); each is logged with debug.
	var origins, originRecords int
	var oldest, newest time.Time
	// Records are decoded straight from the file's memory map, on every
	// CPU: nothing is copied out first (a start-up's cost is mostly fresh
	// memory).
	err := st.Scan(func(cluster string, meta snapshot.Meta, records iter.Seq2[[]byte, []byte]) error {
		s := m.sourceFor(cluster)
		if s == nil && !m.isOrigin(cluster) {
			st.DropSource(cluster)
			log.Infof("snapshot: dropping records of cluster %s, which is no longer configured", cluster)
			return nil
		}
		pods, bad, err := snapshot.DecodeRecords(st, cluster, meta.Records, records)
		if err != nil {
			return err
		}
		for _, k := range bad {
			snapshotErrors.WithLabelValues("bad_record").Inc()
			st.Delete(cluster, k)
		}
		m.records.ReplaceCluster(cluster, pods)
		if s != nil {
			s.SeedLastContact(meta.LastContact)
			s.SeedLastFullSync(meta.LastFullSync)
			m.staleState().seedLost(cluster, meta.State)
		} else {
			m.seedOrigin(cluster, meta)
		}
		total += len(pods)
		if !meta.LastFullSync.IsZero() {
			m.snapshotLoaded.Store(true)
		}
		if s != nil {
			log.Infof("snapshot: cluster %s: %d records, last full sync %s, last contact %s",
				cluster, len(pods), stamp(meta.LastFullSync), stamp(meta.LastContact))
			return nil
		}
		origins++
		originRecords += len(pods)
		if c := meta.LastContact; !c.IsZero() {
			if oldest.IsZero() || c.Before(oldest) {
				oldest = c
			}
			if c.After(newest) {
				newest = c
			}
		}
		log.Debugf("snapshot: origin %s (through hubs): %d records, last contact %s", cluster, len(pods), stamp(meta.LastContact))
		return nil
	})
	if origins > 0 {
		log.Infof("snapshot: %d origins through hubs: %d records, last contacts from %s to %s", origins, originRecords, stamp(oldest), stamp(newest))
	}
	if err != nil {
		// The clusters loaded before the error are whole and stay; the
		// others resync from their API servers.
		snapshotErrors.WithLabelValues("load").Inc()
		log.Errorf("snapshot %s: load: %v: serving the %d records loaded before it, the rest waits for the API servers", m.snapshotPath, err, total)
	}
	m.loadClients(st)
	m.loadImports(st)
	m.loadReplay(st)
	// The stale policies apply to the first index served: a cluster the
	// snapshot recorded out of contact drops at once what its exporters
	// said to drop.
	m.applyStalePolicies(m.staleState().now())
	ix := m.table.Rebuild()
	log.Infof("snapshot %s: loaded %d records, %d services, serving them now", m.snapshotPath, total, ix.Len())
}

// loadClients seeds the client index from the snapshot; the watcher's first
// list then forgets the clients it does not mention.
func (m *MCS) loadClients(st *snapshot.Store) {
	n := 0
	bad, err := st.LoadClients(func(c *clients.Client, ips []netip.Addr) {
		m.clients.Seed(c, ips)
		n++
	})
	snapshotErrors.WithLabelValues("bad_record").Add(float64(bad))
	if err != nil {
		snapshotErrors.WithLabelValues("load").Inc()
		log.Errorf("snapshot %s: loading the DNS clients: %v", m.snapshotPath, err)
	}
	log.Infof("snapshot: %d local Pods as DNS clients (for alias names and imports)", n)
}

// journalClient is the client index's change hook: it queues the change
// for the next batch write.
func (m *MCS) journalClient(namespace, name string, c *clients.Client, ips []netip.Addr) {
	st := m.store.Load()
	if st == nil {
		return
	}
	if c == nil {
		st.DeleteClient(namespace, name)
		return
	}
	st.PutClient(c, ips)
}

// loadReplay seeds the relay's replay memory from the snapshot, before the
// hubs start (relay.(*Relay).SeedSnapshot): after a restart, a hub
// presenting a statement older than one accepted before is still refused.
// Without hubs the file's memory is forgotten; an entry that does not
// decode is skipped, logged and counted.
func (m *MCS) loadReplay(st *snapshot.Store) {
	var bad int
	var err error
	if m.relay == nil {
		bad, err = st.LoadReplay(func(origin string, _ []snapshot.Replay) { st.DropReplay(origin) })
	} else {
		bad, err = m.relay.SeedSnapshot(st, log.Infof, log.Debugf)
	}
	if bad > 0 {
		snapshotErrors.WithLabelValues("bad_record").Add(float64(bad))
		log.Warningf("snapshot %s: replay memory: skipped %d entries that do not decode", m.snapshotPath, bad)
	}
	if err != nil {
		snapshotErrors.WithLabelValues("load").Inc()
		log.Errorf("snapshot %s: loading the replay memory: %v", m.snapshotPath, err)
	}
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

// closeSnapshot flushes and closes the file: before a reload (the new
// instance opens the same file) and at shutdown. Attempts to open it stop.
func (m *MCS) closeSnapshot() error {
	m.snapMu.Lock()
	m.snapClosed = true
	m.snapMu.Unlock()
	m.stopRetry()
	m.snapMu.Lock()
	defer m.snapMu.Unlock()
	if st := m.store.Swap(nil); st != nil {
		if err := st.Close(); err != nil {
			log.Errorf("snapshot %s: close: %v", m.snapshotPath, err)
		}
	}
	return nil
}

// reopenSnapshot runs when a reload failed and this instance goes on: the
// file is reopened and rewritten from the table, which stayed current.
func (m *MCS) reopenSnapshot() error {
	m.openSnapshot(false)
	if st := m.store.Load(); st != nil {
		m.writeTable(st)
	}
	return nil
}

// writeTable replaces the file's content with the table's: every source that
// has listed or holds records (the others keep what the file has: written
// while the API is unreachable, an empty table would wipe a good snapshot),
// the DNS clients and the ClusterSetIP services.
func (m *MCS) writeTable(st *snapshot.Store) {
	held := m.records.Len()
	write := func(cluster string, meta snapshot.Meta) {
		recs := map[string][]byte{}
		for _, p := range m.records.Pods(cluster) {
			if b, err := snapshot.EncodePod(p); err == nil {
				recs[p.Namespace+"/"+p.Name] = b
			}
		}
		st.ReplaceSource(cluster, recs, meta)
	}
	for _, s := range m.sources {
		if !s.HasSynced() && held[s.Cluster()] == 0 {
			continue
		}
		write(s.Cluster(), m.meta(s))
	}
	if m.relay != nil {
		// Every relayed origin, also one that holds nothing now: the file
		// must not keep records the hubs have since removed. Its replay
		// memory too.
		for _, o := range m.relay.Origins() {
			write(o.Cluster, m.originMeta(o))
			st.ReplaceReplay(o.Cluster, m.relay.SnapshotMemory(o.Cluster))
		}
	}
	st.ReplaceClients(func(yield func(*clients.Client, []netip.Addr) bool) {
		m.clients.Each(func(c *clients.Client, ips []netip.Addr) { yield(c, ips) })
	})
	m.saveImports(st, m.table.ClusterSetIPs())
}

// watchSnapshot replaces a store whose file turned out damaged while open
// (the store then stops touching it): closing and reopening moves the file
// aside, and the table, which stayed current, is written out again.
func (m *MCS) watchSnapshot(ctx context.Context) {
	t := time.NewTicker(m.snapshotCheck)
	defer t.Stop()
	saved := map[string]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.saveContacts(saved)
		st := m.store.Load()
		if st == nil || !errors.Is(st.Stats().LastError, snapshot.ErrDamaged) {
			continue
		}
		snapshotErrors.WithLabelValues("damaged").Inc()
		log.Errorf("snapshot %s was damaged while open: reopening (it is moved aside) and rewriting it from memory", m.snapshotPath)
		m.closeSnapshot()
		m.reopenSnapshot()
	}
}

// journal follows the record store's feed: it queues each change for the
// next batch write. It never blocks on the disk.
func (m *MCS) journal(changes []store.Change) {
	st := m.store.Load()
	if st == nil {
		return
	}
	if n := st.Journal(changes, nil); n > 0 {
		snapshotErrors.WithLabelValues("encode").Add(float64(n))
	}
}

// contactSaveEvery is how far a connected source's last contact may run ahead
// of the one in the snapshot before it is written (state changes and syncs
// write it too). A CoreDNS killed while connected and started again while
// cut then counts the cluster's staleness (its mark, expire and the stale
// policies) from at most this much before the contact was lost, rather than
// from the last change of state, days before. Read once by newMCS (a
// variable for tests, set before the server starts; its goroutines read
// MCS.contactSave).
var contactSaveEvery = defaultContactSave

const defaultContactSave = 30 * time.Second

// contactSaveAfter is m's contactSaveEvery (the default for an MCS not made
// by newMCS).
func (m *MCS) contactSaveAfter() time.Duration {
	if m.contactSave > 0 {
		return m.contactSave
	}
	return defaultContactSave
}

// saveContacts writes the meta of each connected source whose last contact
// is contactSaveAfter past the one last written here (saved, by cluster).
func (m *MCS) saveContacts(saved map[string]time.Time) {
	for _, s := range m.sources {
		c := s.LastContact()
		if s.State() != source.Connected || c.Sub(saved[s.Cluster()]) < m.contactSaveAfter() {
			continue
		}
		m.saveMeta(s)
		saved[s.Cluster()] = c
	}
}

// saveMeta records a source's contact and sync times.
func (m *MCS) saveMeta(s *source.Source) {
	if st := m.store.Load(); st != nil {
		st.SetMeta(s.Cluster(), m.meta(s))
	}
}

func (m *MCS) meta(s *source.Source) snapshot.Meta {
	return snapshot.Meta{ClusterID: s.Cluster(), LastContact: s.LastContact(), LastFullSync: s.LastFullSync(), State: s.State().String()}
}
