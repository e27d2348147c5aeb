package mcsannotations

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// staleGrace: see source.StaleGrace.
const staleGrace = source.StaleGrace

// maxStaleNamed is the most clusters an EXTRA-TEXT names; the others are
// counted ("+3 more").
const maxStaleNamed = 3

// contact is what the stale mark reads of a cluster's source.
type contact interface {
	Cluster() string
	State() source.State
	LastContact() time.Time
	Started() time.Time
}

// staleness tells, for the clusters of an answer, which ones are served from
// records that their API server has not confirmed for longer than
// staleGrace: those of a source that is not connected.
type staleness struct {
	once sync.Once
	all  []*clusterContact
	by   map[string]*clusterContact
	now  func() time.Time
}

// clusterContact is one cluster's source with its series of
// stale_answers_total.
type clusterContact struct {
	contact
	answers prometheus.Counter
	// lost: the snapshot this instance started from recorded the source
	// out of contact, so its last contact is when contact was lost, and
	// the records are stale from the start (no grace after the start).
	lost atomic.Bool
}

// seedLost notes what the snapshot recorded of cluster's source when it
// was last written: its state ("disconnected": out of contact since its
// last contact).
func (st *staleness) seedLost(cluster, state string) {
	if c := st.by[cluster]; c != nil {
		c.lost.Store(state == source.Disconnected.String())
	}
}

// init sets the sources, from sources() the first time it is called; later
// calls change nothing.
func (st *staleness) init(sources func() []contact) {
	st.once.Do(func() {
		cs := sources()
		st.by = make(map[string]*clusterContact, len(cs))
		for _, s := range cs {
			c := &clusterContact{contact: s, answers: staleAnswers.WithLabelValues(s.Cluster())}
			st.all = append(st.all, c)
			st.by[s.Cluster()] = c
		}
		if st.now == nil {
			st.now = time.Now
		}
	})
}

// staleState returns the stale tracking of m's sources (fixed when m is
// built).
func (m *MCS) staleState() *staleness {
	m.stale.init(func() []contact {
		cs := make([]contact, len(m.sources))
		for i, s := range m.sources {
			cs[i] = s
		}
		return cs
	})
	return &m.stale
}

// age is how long c's records have gone unconfirmed, and whether they are
// stale: c is not connected, and its last contact (or start, when later) is
// more than staleGrace ago. The age is from the last contact, 0 when there
// was none. After a restart from a snapshot that recorded c out of contact,
// the start gives no grace: the last contact is when contact was lost, and
// a restart while cut keeps marking, and dropping where the exporter said
// so, from the first answer.
func (c *clusterContact) age(now time.Time) (time.Duration, bool) {
	if c.State() == source.Connected {
		return 0, false
	}
	last := c.LastContact()
	since := last
	if started := c.Started(); started.After(since) && (last.IsZero() || !c.lost.Load()) {
		since = started
	}
	if now.Sub(since) <= staleGrace {
		return 0, false
	}
	if last.IsZero() {
		return 0, true
	}
	return now.Sub(last), true
}

// outOfContact is how long c has been out of contact for the services'
// stale policies: 0 while its records are not stale, else the time since
// its last contact (since its start when it never had one).
func (c *clusterContact) outOfContact(now time.Time) time.Duration {
	age, stale := c.age(now)
	switch {
	case !stale:
		return 0
	case age == 0:
		return now.Sub(c.Started())
	}
	return age
}

// staleEvery is how often staleLoop hands the table each cluster's time out
// of contact.
const staleEvery = time.Second

// staleLoop hands the table, every staleEvery, how long each cluster has
// been out of contact, for the services whose export entries drop a stale
// cluster's endpoints (table.SetStaleFor), and logs each change it makes
// to the answers. Of the relayed origins it looks only at those not
// connected: a change of an origin's state comes from the relay as it
// happens (originChanged); what the loop adds is the time that passes.
func (m *MCS) staleLoop(ctx context.Context) {
	st := m.staleState()
	wait.UntilWithContext(ctx, func(context.Context) {
		now := st.now()
		m.passOrigins(now)
		m.applyStalePolicies(now)
	}, staleEvery)
}

func (m *MCS) applyStalePolicies(now time.Time) {
	for _, c := range m.staleState().all {
		m.applyStalePolicy(c, now)
	}
	m.applyLaggingOrigins(now)
}

// applyStalePolicy hands the table how long c has been out of contact.
func (m *MCS) applyStalePolicy(c *clusterContact, now time.Time) {
	d := c.outOfContact(now)
	n := m.table.SetStaleFor(c.Cluster(), d)
	switch {
	case n == 0:
	case d == 0:
		log.Infof("cluster %s: in contact again: %d services whose exporters drop stale endpoints answer with its endpoints again", c.Cluster(), n)
	default:
		log.Infof("cluster %s: out of contact for %s: %d services answer with or without its endpoints as their exporters' stale policy says", c.Cluster(), d.Round(time.Second), n)
	}
}

// markStale counts the stale clusters of an answer holding the records of
// clusters and, when the query r carries EDNS0, adds to the reply msg an
// Extended DNS Error 3 (Stale Answer) naming them. The common case, every
// source connected, costs a look at each source's state and no allocation.
func (m *MCS) markStale(msg, r *dns.Msg, clusters []string) {
	st := m.staleState()
	down := m.origins.anyDown()
	for _, c := range st.all {
		if c.State() != source.Connected {
			down = true
			break
		}
	}
	if !down {
		return
	}
	now := st.now()
	opt := r.IsEdns0()
	var text staleText
	for _, cluster := range clusters {
		c := st.by[cluster]
		if c == nil {
			if c = m.origins.get(cluster); c == nil {
				continue // no source, no relayed origin: the table holds no records of it
			}
		}
		age, stale := c.age(now)
		if !stale {
			continue
		}
		c.answers.Inc()
		if opt != nil {
			text.add(cluster, age)
		}
	}
	if text.stale == 0 {
		return
	}
	msg.SetEdns0(opt.UDPSize(), opt.Do())
	reply := msg.IsEdns0()
	reply.Option = append(reply.Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeStaleAnswer, ExtraText: text.String()})
}

// staleText builds the EXTRA-TEXT of a stale answer: "stale: edge-b 2m14s,
// edge-c 40s +2 more", at most table.MaxEDEText octets (what replies leave
// room for), naming at most maxStaleNamed clusters.
type staleText struct {
	b     []byte
	named int // clusters named
	stale int // stale clusters, named or not
}

// moreRoom is the room kept for the count of the clusters not named
// (" +" and up to 10 digits and " more").
const moreRoom = 2 + 10 + 5

func (t *staleText) add(cluster string, age time.Duration) {
	t.stale++
	if t.named == maxStaleNamed {
		return
	}
	if len(t.b) == 0 {
		t.b = append(make([]byte, 0, table.MaxEDEText), "stale:"...)
	}
	n := len(t.b)
	if t.named > 0 {
		t.b = append(t.b, ',')
	}
	t.b = append(t.b, ' ')
	t.b = append(t.b, cluster...)
	if age > 0 {
		t.b = append(t.b, ' ')
		t.b = append(t.b, age.Round(time.Second).String()...)
	}
	if len(t.b) > table.MaxEDEText-moreRoom {
		t.b = t.b[:n] // does not fit: counted, not named
		return
	}
	t.named++
}

func (t *staleText) String() string {
	b := t.b
	if len(b) == 0 {
		b = append(b, "stale:"...)
	}
	if more := t.stale - t.named; more > 0 {
		b = append(b, " +"...)
		b = strconv.AppendInt(b, int64(more), 10)
		b = append(b, " more"...)
	}
	return string(b)
}
