package mcscontroller

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// An edge's controller may read relay hubs (Config.Hubs, internal/relay)
// beside its direct sources: the Relay writes each origin's records into the
// same record store, and each origin it knows counts as a source cluster
// (relayedOrigin): its state and last contact are those the hubs report,
// so --peer-expire and the services' stale policies apply to it per origin
// as to a peer. An origin is current once a hub holding it has listed its
// slices; until then its share stays as its slices hold it. Until every hub
// has listed once, a cluster the controller does not know (neither a direct
// source nor an origin a hub holds) is kept from its slices too, so that a
// restart with a hub out of reach loses no relayed share (still subject to
// Expire, counted from the start). Once every hub listed, an origin no hub
// holds goes, as a peer no longer configured.
//
// A controller that is itself a hub (Config.Relay) relays its relayed
// origins too (regions of regions): its Relay keeps each record's proof and
// path (relay.Config.KeepProof), the slices of a relayed origin carry them
// with the hub added to the path (relay.EncodeVia), and each relayed origin
// gets a Lease saying what the hub's Relay knows of it (hublease.go). A
// record whose path names the hub is refused by its Relay, and one that
// crossed relay.MaxPath hubs is not relayed (internal/relay/path.go): that
// is what keeps hubs reading each other from looping a record.

// relayedOrigin is an origin read through hubs, as a Source.
type relayedOrigin struct {
	o      relay.Origin
	synced bool // a hub holding it has listed
}

func (r relayedOrigin) Cluster() string        { return r.o.Cluster }
func (r relayedOrigin) HasSynced() bool        { return r.synced }
func (r relayedOrigin) LastContact() time.Time { return r.o.LastContact }
func (r relayedOrigin) Connected() bool        { return r.o.State == source.Connected }

// relayed returns the origins of the hubs as sources, and whether some hub
// has not listed yet (pending).
func (c *Controller) relayed() (srcs []Source, pending bool) {
	if c.cfg.Hubs == nil {
		return nil, false
	}
	synced := map[string]bool{}
	for _, h := range c.cfg.Hubs.Hubs() {
		synced[h.Name] = h.Synced
		pending = pending || !h.Synced
	}
	for _, o := range c.cfg.Hubs.Origins() {
		if len(o.Hubs) == 0 && !pending {
			continue // no hub holds it (a verifying Relay remembers it still)
		}
		s := relayedOrigin{o: o}
		for _, h := range o.Hubs {
			s.synced = s.synced || synced[h]
		}
		srcs = append(srcs, s)
	}
	return srcs, pending
}

// hubsPending says whether some hub has not listed yet (false without
// hubs), as relayed does, without looking at the origins.
func (c *Controller) hubsPending() bool {
	if c.cfg.Hubs == nil {
		return false
	}
	for _, h := range c.cfg.Hubs.Hubs() {
		if !h.Synced {
			return true
		}
	}
	return false
}

// allSources are the direct sources and the relayed origins, and whether
// some hub has not listed yet.
func (c *Controller) allSources() ([]Source, bool) {
	r, pending := c.relayed()
	if len(r) == 0 {
		return c.sources, pending
	}
	return append(slices.Clone(c.sources), r...), pending
}

// relays says whether a hub relays cluster's records: those it reads
// itself, and those of origins read through hubs (each record's path and
// proof kept when the Relay keeps them; without, they are not relayed).
func (c *Controller) relays(cluster string) bool {
	return c.direct(cluster) || c.cfg.Hubs != nil
}

// direct says whether cluster is one the controller reads itself.
func (c *Controller) direct(cluster string) bool { return c.directs[cluster] }

var (
	hubStateDesc = prometheus.NewDesc("mcs_controller_hub_state",
		"State of each relay hub the controller reads (1 for its current state: syncing, connected, disconnected).", []string{"hub", "state"}, nil)
	hubContactDesc = prometheus.NewDesc("mcs_controller_hub_last_contact_seconds",
		"Seconds since each relay hub's API server last answered (-1 if never).", []string{"hub"}, nil)
	originViaDesc = prometheus.NewDesc("mcs_controller_origin_via",
		"1 for each relay hub an origin cluster is read through now (direct peers are not listed).", []string{"origin", "hub"}, nil)
)

// hubCollector is the collector of the hubs' metrics, read at scrape time.
type hubCollector struct{ m *Metrics }

func (h hubCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- hubStateDesc
	ch <- hubContactDesc
	ch <- originViaDesc
}

func (h hubCollector) Collect(ch chan<- prometheus.Metric) {
	r := h.m.hubs.Load()
	if r == nil {
		return
	}
	for _, hub := range r.Hubs() {
		for _, st := range []source.State{source.Syncing, source.Connected, source.Disconnected} {
			v := 0.0
			if hub.State == st {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(hubStateDesc, prometheus.GaugeValue, v, hub.Name, st.String())
		}
		since := -1.0
		if !hub.LastContact.IsZero() {
			since = time.Since(hub.LastContact).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(hubContactDesc, prometheus.GaugeValue, since, hub.Name)
	}
	for _, o := range r.Origins() {
		for _, hub := range o.Hubs {
			ch <- prometheus.MustNewConstMetric(originViaDesc, prometheus.GaugeValue, 1, o.Cluster, hub)
		}
	}
}
