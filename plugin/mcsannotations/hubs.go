package mcsannotations

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// Relayed origins (docs/DESIGN.md#relay-hubs): with hub words, the records
// of clusters the plugin does not read itself come through the hubs' MCS
// controllers (internal/relay), each still tagged with its origin cluster.
// An origin counts as a cluster like a source does for every rule that
// follows contact: the stale mark, the stale policies, the snapshot's last
// contact and the metrics. Its state and last contact are the relay's: what
// the hubs say of it, and how current the hubs are.

// hubsInformer names the informers of the hubs in the informer metrics.
const hubsInformer = "hubs"

// originContact is one relayed origin as the stale rules read it: the
// relay's view of it as of the relay's last event on it (or the last pass
// over every origin). Its last contact is that of then: while it is
// connected, which is when that view's last contact is behind, no stale
// rule reads it.
type originContact struct {
	cluster string
	started time.Time // the relay's start: the first grace, as a source's start gives
	view    atomic.Pointer[relay.Origin]
}

func (o *originContact) Cluster() string { return o.cluster }
func (o *originContact) Started() time.Time {
	return o.started
}

func (o *originContact) State() source.State {
	if v := o.view.Load(); v != nil {
		return v.State
	}
	return source.Syncing
}

func (o *originContact) LastContact() time.Time {
	if v := o.view.Load(); v != nil {
		return v.LastContact
	}
	return time.Time{}
}

// origins is the set of relayed origins, replaced whole when an origin comes
// or goes, so that the query path reads it without a lock. An origin's
// view changes in place (originContact.view).
type origins struct {
	by map[string]*clusterContact
}

// originSet keeps the relayed origins of m. The relay's events
// (relay.Events.OriginChanged) bring each origin's changes as they happen;
// the stale loop does only what time changes: every second, the time out
// of contact of the origins not connected (lagging); every originPassEvery,
// one pass over every origin that writes the snapshot's last contact of the
// connected ones.
type originSet struct {
	mu      sync.Mutex // serialises changes, and the stale policies of origins
	started time.Time
	cur     atomic.Pointer[origins]
	down    atomic.Int64 // origins not connected
	// lagging are the origins not connected, whose time out of contact
	// grows; under mu.
	lagging map[string]*clusterContact
	pass    time.Time // the last pass over every origin; under mu
	// passing is, during a pass, the origins it builds (copied once, and
	// published at its end); nil otherwise. Under mu.
	passing *origins
	// seeded: what the snapshot said of origins before the relay started:
	// last contact, and whether they were out of contact then.
	seededLost map[string]bool
	saved      map[string]time.Time // last contact last written to the snapshot, by origin
	via        map[string][]string  // the hubs that last held each origin (also from the snapshot), sorted
}

// originPassEvery is how often the stale loop passes over every relayed
// origin: the last contact of each connected one reaches the snapshot
// within contactSaveAfter and this of its contact.
func (m *MCS) originPassEvery() time.Duration { return m.contactSaveAfter() / 2 }

// edit applies f to the origins: to a copy then published, or during a
// pass to the pass's copy, so that a pass that meets many new origins (the
// first, from the snapshot) copies the set once, not once per origin. s.mu
// is held.
func (s *originSet) edit(f func(by map[string]*clusterContact)) {
	if s.passing != nil {
		f(s.passing.by)
		return
	}
	next := &origins{by: map[string]*clusterContact{}}
	if cur := s.cur.Load(); cur != nil {
		next.by = maps.Clone(cur.by)
	}
	f(next.by)
	s.cur.Store(next)
}

// held returns the origins as they stand under s.mu (a pass's copy during
// a pass).
func (s *originSet) held() map[string]*clusterContact {
	if s.passing != nil {
		return s.passing.by
	}
	if cur := s.cur.Load(); cur != nil {
		return cur.by
	}
	return nil
}

// get returns the contact of a relayed origin, or nil.
func (s *originSet) get(cluster string) *clusterContact {
	if o := s.cur.Load(); o != nil {
		return o.by[cluster]
	}
	return nil
}

// each calls f with every relayed origin's contact.
func (s *originSet) each(f func(*clusterContact)) {
	if o := s.cur.Load(); o != nil {
		for _, c := range o.by {
			f(c)
		}
	}
}

// anyDown reports whether some relayed origin is not connected.
func (s *originSet) anyDown() bool { return s.down.Load() > 0 }

// newRelay builds the relay of cfg's hubs, which writes the records of the
// origins it relays into m's record store; nil without hub words.
func (m *MCS) newRelay(cfg config, local string) error {
	if len(cfg.hubs) == 0 {
		return nil
	}
	direct := map[string]bool{}
	for _, p := range cfg.peers {
		direct[p.name] = true
	}
	r := relay.New(m.records, relay.Config{
		Local:      local,
		Direct:     func(cluster string) bool { return direct[cluster] },
		Keys:       cfg.keys,
		Namespaces: cfg.hubNS,
		// Under verify, a hub's word that an origin is connected counts
		// only with the origin's recent heartbeat.
		HeartbeatTimeout:   cfg.hubBeat,
		RequirePodLists:    cfg.hubLists,
		RequirePodUIDLists: cfg.hubUIDLists,
		Events: relay.Events{
			Refused:     logRelayRefused,
			HubState:    m.hubStateChanged,
			OriginState: m.originStateChanged,
			Remembered:  relay.JournalSnapshot(m.store.Load),
			// An origin's changes come as they happen, not with the
			// stale loop's next pass.
			OriginChanged: m.originChanged,
		},
		Ingest: ingestOptions(hubsInformer),
	})
	for _, h := range cfg.hubs {
		client, err := clientFor(h.kubeconfig, h.kubecontext)
		if err != nil {
			return clientError("hub "+h.name, h.kubeconfig, err)
		}
		if err := r.AddHub(h.name, client, ""); err != nil {
			return err
		}
	}
	if len(cfg.hubNS) > 0 {
		log.Infof("hubs: reading the relayed records of namespaces %s only", strings.Join(cfg.hubNS, ","))
	}
	if cfg.keys != nil {
		log.Infof("hubs: relayed records count only when their origin cluster's key signed their endpoint statement")
	}
	m.relay = r
	m.origins.seededLost = map[string]bool{}
	m.origins.saved = map[string]time.Time{}
	m.origins.via = map[string][]string{}
	return nil
}

// logRelayRefused logs and counts a relayed record, or a hub's word on an
// origin's state (no namespace), refused.
func logRelayRefused(hub, origin, namespace, pod string, r annotation.Rejection) {
	relayRefused.WithLabelValues(hub, string(r.Reason)).Inc()
	if namespace == "" { // not a record: the hub's word on the origin (a heartbeat)
		log.Warningf("hub %s: origin %s: refused: %s", hub, origin, r)
		return
	}
	log.Warningf("hub %s: origin %s: Pod %s/%s: relayed record refused: %s", hub, origin, namespace, pod, r)
}

func (m *MCS) hubStateChanged(hub string, from, to source.State, err error) {
	if err != nil {
		log.Warningf("hub %s: %s -> %s: %v", hub, from, to, err)
		return
	}
	log.Infof("hub %s: %s -> %s", hub, from, to)
}

func (m *MCS) originStateChanged(origin string, from, to source.State) {
	log.Infof("origin %s (through hubs): %s -> %s", origin, from, to)
}

// originChanged takes the relay's view of one origin after the relay wrote
// it (relay.Events.OriginChanged).
func (m *MCS) originChanged(name string) {
	s := &m.origins
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := m.relay.Origin(name)
	if s.lagging == nil {
		// Not started: the first pass takes every origin. One forgotten
		// before it leaves the file now: the pass will not meet it.
		if !ok {
			m.dropOriginFile(name)
		}
		return
	}
	m.takeOriginLocked(name, o, ok, m.staleState().now())
}

// passOrigins takes the relay's view of every origin, once the relay has
// started, at once the first time and then every originPassEvery: what
// time alone changes (the connected origins' last contact, for the
// snapshot), and anything an event did not bring.
func (m *MCS) passOrigins(now time.Time) {
	if m.relay == nil {
		return
	}
	s := &m.origins
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started.IsZero() || (!s.pass.IsZero() && now.Sub(s.pass) < m.originPassEvery()) {
		return
	}
	first := s.lagging == nil
	if first {
		s.lagging = map[string]*clusterContact{}
	}
	s.pass = now
	s.passing = &origins{by: maps.Clone(s.held())}
	if s.passing.by == nil {
		s.passing.by = map[string]*clusterContact{}
	}
	held := map[string]bool{}
	for _, o := range m.relay.Origins() {
		held[o.Cluster] = true
		m.takeOriginLocked(o.Cluster, o, true, now)
	}
	for name := range s.passing.by {
		if !held[name] {
			m.takeOriginLocked(name, relay.Origin{}, false, now)
		}
	}
	s.cur.Store(s.passing)
	s.passing = nil
}

// takeOriginLocked takes the relay's view of one origin (ok false: the
// relay forgot it): a new origin gets a contact (and its series); the
// table its time out of contact when its state or last contact changed;
// the snapshot its meta when its state or hubs changed, or its contact ran
// contactSaveAfter ahead of the one written. s.mu is held.
func (m *MCS) takeOriginLocked(name string, o relay.Origin, ok bool, now time.Time) {
	s := &m.origins
	c := s.held()[name]
	if !ok {
		// The snapshot drops it too: else it is seeded again at every
		// start (and forgotten again once every hub has listed), and the
		// file keeps an entry per origin ever taken out. Its records went
		// with the relay's removals; its replay memory, if any, stays.
		m.dropOriginFile(name)
		if c == nil {
			return
		}
		s.edit(func(by map[string]*clusterContact) { delete(by, name) })
		if _, lag := s.lagging[name]; lag {
			delete(s.lagging, name)
			s.down.Add(-1)
		}
		m.table.SetStaleFor(name, 0) // it holds no records any more
		delete(s.saved, name)
		delete(s.via, name)
		delete(s.seededLost, name)
		log.Infof("origin %s: no hub holds it any more: forgotten", name)
		return
	}
	if c == nil {
		oc := &originContact{cluster: name, started: s.started}
		c = &clusterContact{contact: oc, answers: staleAnswers.WithLabelValues(name)}
		c.lost.Store(s.seededLost[name])
		// Only the series an origin's alerts follow: its annotations'
		// refusals are counted by hub (relay_refused_total), and a series
		// per reason and origin would grow an edge's heap with every
		// origin.
		sourceExpirations.WithLabelValues(name)
		s.edit(func(by map[string]*clusterContact) { by[name] = c })
	}
	oc := c.contact.(*originContact)
	prev := oc.view.Swap(&o)
	_, wasLagging := s.lagging[name]
	if lag := o.State != source.Connected; lag != wasLagging {
		if lag {
			s.lagging[name] = c
			s.down.Add(1)
		} else {
			delete(s.lagging, name)
			s.down.Add(-1)
		}
	}
	changed := prev == nil || prev.State != o.State
	if changed || o.State != source.Connected && !o.LastContact.Equal(prev.LastContact) {
		m.applyStalePolicy(c, now)
	}
	// The path is the hubs holding it now, else those that last did.
	if len(o.Hubs) > 0 && !slices.Equal(o.Hubs, s.via[name]) {
		log.Infof("origin %s: relayed through %s", name, strings.Join(o.Hubs, ","))
		s.via[name] = slices.Clone(o.Hubs)
		changed = true
	}
	st := m.store.Load()
	if st == nil {
		return
	}
	if changed || o.LastContact.Sub(s.saved[name]) >= m.contactSaveAfter() {
		st.SetMeta(name, m.originMeta(o))
		s.saved[name] = o.LastContact
	}
}

// applyLaggingOrigins hands the table the time out of contact of each
// relayed origin that is not connected.
func (m *MCS) applyLaggingOrigins(now time.Time) {
	s := &m.origins
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.lagging {
		m.applyStalePolicy(c, now)
	}
}

// originMeta is the snapshot's meta of a relayed origin: its state, last
// contact and the hubs that last held it.
func (m *MCS) originMeta(o relay.Origin) snapshot.Meta {
	return snapshot.Meta{ClusterID: o.Cluster, LastContact: o.LastContact, State: o.State.String(), Via: m.origins.via[o.Cluster]}
}

// isOrigin says whether records of cluster, not read by a source of m, may
// come through its hubs (and so are kept from the snapshot).
func (m *MCS) isOrigin(cluster string) bool {
	return m.relay != nil && m.sourceFor(cluster) == nil
}

// dropOriginFile drops a relayed origin the relay forgot from the
// snapshot, unless it is a cluster m reads itself (isOrigin), whose entry
// is not the relay's.
func (m *MCS) dropOriginFile(name string) {
	if st := m.store.Load(); st != nil && m.isOrigin(name) {
		st.DropSource(name)
	}
}

// seedOrigin notes what the snapshot recorded of a relayed origin.
func (m *MCS) seedOrigin(cluster string, meta snapshot.Meta) {
	m.relay.Seed(cluster, meta.LastContact)
	m.origins.mu.Lock()
	m.origins.seededLost[cluster] = meta.State == source.Disconnected.String()
	if len(meta.Via) > 0 {
		m.origins.via[cluster] = slices.Clone(meta.Via)
	}
	m.origins.mu.Unlock()
}

// hubsSynced: every hub has applied its first complete list.
func (m *MCS) hubsSynced() bool {
	if m.relay == nil {
		return true
	}
	for _, h := range m.relay.Hubs() {
		if !h.Synced {
			return false
		}
	}
	return true
}

// collectHubs reports the hubs' and the relayed origins' gauges.
func (m *MCS) collectHubs(ch chan<- prometheus.Metric, seen map[string]bool, counts map[string]int) {
	if m.relay == nil {
		return
	}
	for _, h := range m.relay.Hubs() {
		collectContact(ch, hubStateDesc, hubContactDesc, h.State, h.LastContact, h.Name)
	}
	for _, o := range m.relay.Origins() {
		if seen[o.Cluster] {
			continue
		}
		seen[o.Cluster] = true
		ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.GaugeValue, float64(counts[o.Cluster]), o.Cluster)
		collectContact(ch, stateDesc, contactDesc, o.State, o.LastContact, o.Cluster)
		for _, h := range o.Hubs {
			ch <- prometheus.MustNewConstMetric(originViaDesc, prometheus.GaugeValue, 1, o.Cluster, h)
		}
	}
}
