package table

import (
	"slices"
	"time"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Stale policy: the endpoints of a cluster out of contact stay in every
// service's answers as last seen, unless the cluster's export entry of the
// service says otherwise (annotation.Service.StaleEndpoints): Drop leaves them
// out once the cluster has been out of contact for longer than the entry's
// grace, DropIfLocal too, but only while the service has ready endpoints in
// the local cluster. As with a health change, a change that crosses a grace
// marks the services it concerns, and the builder renders them again off
// the query path.

// SetStaleFor records that cluster has been out of contact for d (0: it is
// in contact, or within the grace a consumer gives every cluster), and
// returns how many services this renders again: those with an entry of that
// cluster whose grace d crosses. A call that crosses no grace of any entry
// costs a look at the sorted graces (gathered again, in a pass over the
// records, only after records changed).
func (t *Table) SetStaleFor(cluster string, d time.Duration) int {
	d = max(d, 0)
	t.mu.Lock()
	old := t.staleFor[cluster]
	if old == d {
		t.mu.Unlock()
		return 0
	}
	if d == 0 {
		delete(t.staleFor, cluster)
	} else {
		if t.staleFor == nil {
			t.staleFor = make(map[string]time.Duration)
		}
		t.staleFor[cluster] = d
	}
	lo, hi := min(old, d), max(old, d)
	if !t.gracesLocked().crossed(lo, hi) {
		t.mu.Unlock()
		return 0
	}
	changed := 0
	for sk, l := range t.bySvc {
		for _, p := range l.pods {
			if p.Cluster != cluster {
				continue
			}
			if g, _, ok := dropGrace(p, sk); ok && lo <= g && g < hi {
				t.dirty[sk] = struct{}{}
				changed++
				break
			}
		}
	}
	if changed > 0 {
		t.gen++
	}
	t.mu.Unlock()
	if changed > 0 {
		t.signal()
	}
	return changed
}

// graces are the distinct graces of the entries that drop stale endpoints,
// sorted, as of the table's write generation gen.
type graces struct {
	gen   uint64
	valid bool
	all   []time.Duration
}

// crossed reports whether a grace g lies in [lo, hi): a time out of contact
// going from lo to hi, or back, changes whether g has passed.
func (g *graces) crossed(lo, hi time.Duration) bool {
	i, _ := slices.BinarySearch(g.all, lo)
	return i < len(g.all) && g.all[i] < hi
}

// gracesLocked returns the graces of the current records, gathering them
// again when a write came since they were last gathered.
func (t *Table) gracesLocked() *graces {
	if t.graces.valid && t.graces.gen == t.gen {
		return &t.graces
	}
	t.graces = graces{gen: t.gen, valid: true, all: t.graces.all[:0]}
	for sk, l := range t.bySvc {
		for _, p := range l.pods {
			if g, _, ok := dropGrace(p, sk); ok {
				t.graces.all = append(t.graces.all, g)
			}
		}
	}
	slices.Sort(t.graces.all)
	t.graces.all = slices.Compact(t.graces.all)
	return &t.graces
}

// dropGrace is the grace of p's export entry of sk when its policy drops
// stale endpoints, and whether it drops them only while the service has
// local endpoints (DropIfLocal).
func dropGrace(p *store.Pod, sk svcKey) (grace time.Duration, ifLocal, ok bool) {
	if e := entryOf(p, sk); e != nil {
		return e.DropGrace()
	}
	return 0, false, false
}

// entryOf is p's export entry of sk (nil: none).
func entryOf(p *store.Pod, sk svcKey) *annotation.Export {
	for i := range p.Exports {
		if e := &p.Exports[i]; e.Namespace == sk.Namespace && e.Name == sk.Name {
			return e
		}
	}
	return nil
}

// freshLocked returns the Pods of sk without those its stale policy drops
// (pods itself when it drops none).
func (t *Table) freshLocked(sk svcKey, pods []*store.Pod) []*store.Pod {
	if len(t.staleFor) == 0 {
		return pods
	}
	local := -1 // whether the service has ready local endpoints; -1: not looked yet
	hasLocal := func() bool {
		if local < 0 {
			local = 0
			for _, p := range pods {
				if p.Cluster == t.cfg.LocalCluster && serves(sk, []*store.Pod{p}) {
					local = 1
					break
				}
			}
		}
		return local == 1
	}
	var out []*store.Pod
	for i, p := range pods {
		e := entryOf(p, sk)
		drop := e != nil && e.DropsStale(t.staleFor[p.Cluster], hasLocal)
		switch {
		case drop && out == nil:
			out = append(make([]*store.Pod, 0, len(pods)), pods[:i]...)
		case !drop && out != nil:
			out = append(out, p)
		}
	}
	if out == nil {
		return pods
	}
	return out
}
