package mcscontroller

import (
	"context"
	"fmt"
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/pager"
	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/internal/relay"
)

// A hub that reads hubs writes a Lease of each origin it relays from them,
// as it does of each source it reads (runLeases): the origin's state and
// last contact as its Relay sees them, and the annotations of the hub Lease
// that told it, copied unchanged (relay.(*Relay).OriginLeases), so that
// the next tier's staleness per origin works as through one hub. An origin
// it also reads directly is runLeases's.
//
// Every hub deletes the Leases of clusters it no longer reads or relays (a
// peer taken out of its configuration, an origin no hub it reads holds any
// more), once they have been so for Config.LeaseGrace: the edges reading it
// then forget such a cluster rather than keep its last word for ever, and
// a hub reading this one deletes its own Lease of it in turn.

// relayedLease is what a hub's Lease of a relayed origin says.
type relayedLease struct {
	leaseState
	extra map[string]string
}

// runRelayedLeases writes the Lease of each relayed origin when what it
// says changes, and deletes the Leases of clusters the hub no longer reads
// or relays (pruneLeases), looking every StatePoll, until ctx is done. The
// writes and the deletes of relayed origins' Leases are made here only, so
// that no delete races a write of the same Lease; runLeases writes those of
// the sources, which are never deleted while the controller runs.
func (c *Controller) runRelayedLeases(ctx context.Context) {
	written := map[string]relayedLease{}
	p := &leasePruner{unwanted: map[string]time.Time{}}
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		relayed := c.relayedLeases()
		// An origin no longer relayed (the Relay may have forgotten it):
		// pruneLeases deletes its Lease, written again if it comes back.
		maps.DeleteFunc(written, func(cluster string, _ relayedLease) bool { _, ok := relayed[cluster]; return !ok })
		for cluster, want := range relayed {
			if w, ok := written[cluster]; ok && w.state == want.state && maps.Equal(w.extra, want.extra) {
				continue
			}
			if err := c.applyLease(ctx, cluster, want.leaseState, want.extra); err != nil {
				c.logOnce(fmt.Errorf("relay Lease of relayed cluster %s: %w", cluster, err))
				return
			}
			written[cluster] = want
			p.exists(cluster)
		}
		c.pruneLeases(ctx, p, relayed, time.Now())
	}, c.cfg.StatePoll)
}

// relayedLeases are the Leases the hub writes of the origins it relays from
// its hubs (none without hubs), by origin: not one it reads itself; one some
// hub holds (its Lease or slices) or whose records are still held (until
// they expire; a verifying Relay remembers an origin no hub holds); and
// whose Lease it copies crossed fewer than relay.MaxPath hubs (its own
// would be one more, which readers ignore). Each says the origin's state
// and last contact as the Relay sees them, with the annotations of the hub
// Lease that told it and their path, this hub added.
func (c *Controller) relayedLeases() map[string]relayedLease {
	if c.cfg.Hubs == nil {
		return nil
	}
	out := map[string]relayedLease{}
	for _, o := range c.cfg.Hubs.OriginLeases() {
		if c.direct(o.Cluster) || o.Cluster == c.cfg.LocalCluster || len(o.Hubs) == 0 && o.Records == 0 {
			continue
		}
		extra := o.Extra
		path := relay.SplitPath(extra[relay.LeasePathAnnotation])
		if len(path) >= relay.MaxPath {
			continue
		}
		out[o.Cluster] = relayedLease{leaseState{state: o.State.String(), contact: o.LastContact, path: relay.JoinPath(append(path, c.cfg.LocalCluster))}, extra}
	}
	return out
}

// leasePruner is what pruneLeases keeps between its looks.
type leasePruner struct {
	listed   bool                 // the Leases there were at the start are known
	read     map[string]bool      // the clusters the controller reads (fixed for its lifetime)
	tried    time.Time            // the last list that failed
	have     map[string]bool      // clusters whose Lease the controller knows to exist
	unwanted map[string]time.Time // since when each of them has been neither read nor relayed
}

// exists notes that cluster's Lease exists (the controller wrote it).
func (p *leasePruner) exists(cluster string) {
	if p.have != nil {
		p.have[cluster] = true
	}
}

// pruneLeases deletes the Lease of each cluster that has been neither read
// nor relayed (relayed: relayedLeases) for LeaseGrace. The
// Leases are those listed once at the start (labelled with their cluster,
// by name: mcs-origin.<cluster>) and those written since. Nothing is
// deleted, and no grace counts, while some hub has not listed once: its
// origins are not known yet. A failed delete, or list, is tried again
// after a grace.
func (c *Controller) pruneLeases(ctx context.Context, p *leasePruner, relayed map[string]relayedLease, now time.Time) {
	if c.hubsPending() {
		clear(p.unwanted)
		return
	}
	if !p.listed {
		if now.Sub(p.tried) < c.cfg.LeaseGrace {
			return // a failed list is tried again after a grace, not at every look
		}
		have, err := c.listLeases(ctx)
		if err != nil {
			p.tried = now
			c.logOnce(fmt.Errorf("relay Leases: list (the Leases of clusters no longer read or relayed are not deleted until it succeeds): %w", err))
			return
		}
		for cluster := range relayed {
			have[cluster] = true // written by now, or at the next look
		}
		for _, s := range c.sources {
			have[s.Cluster()] = true
		}
		p.have, p.listed = have, true
	}
	if p.read == nil {
		p.read = map[string]bool{c.cfg.LocalCluster: true}
		for _, s := range c.sources {
			p.read[s.Cluster()] = true
		}
	}
	for cluster := range p.have {
		if _, ok := relayed[cluster]; ok || p.read[cluster] {
			delete(p.unwanted, cluster)
			continue
		}
		since, ok := p.unwanted[cluster]
		if !ok {
			p.unwanted[cluster] = now
			continue
		}
		if now.Sub(since) < c.cfg.LeaseGrace {
			continue
		}
		err := c.client.CoordinationV1().Leases(c.cfg.RelayNamespace).Delete(ctx, relay.LeasePrefix+cluster, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			err = nil
		}
		c.metrics.write("lease_delete", err)
		if err != nil {
			p.unwanted[cluster] = now // tried again after a grace
			c.logOnce(fmt.Errorf("relay Lease of cluster %s, neither read nor relayed since %s: delete: %w", cluster, since.UTC().Format(time.RFC3339), err))
			continue
		}
		klog.Infof("mcs-controller: deleted the relay Lease of cluster %s: neither read nor relayed since %s", cluster, since.UTC().Format(time.RFC3339))
		delete(p.have, cluster)
		delete(p.unwanted, cluster)
	}
}

// listLeases returns the clusters of the relay Leases in RelayNamespace:
// those labelled relay.OriginLabel and named for their cluster, in pages
// (each Lease may carry a heartbeat and a Pod list of tens of KB).
func (c *Controller) listLeases(ctx context.Context) (map[string]bool, error) {
	have := map[string]bool{}
	leases := c.client.CoordinationV1().Leases(c.cfg.RelayNamespace)
	pg := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return leases.List(ctx, opts)
	})
	pg.PageSize = 100
	err := pg.EachListItem(ctx, metav1.ListOptions{LabelSelector: relay.OriginLabel}, func(obj runtime.Object) error {
		l, ok := obj.(*coordinationv1.Lease)
		if !ok {
			return nil
		}
		if cluster := l.Labels[relay.OriginLabel]; l.Name == relay.LeasePrefix+cluster {
			have[cluster] = true
		}
		return nil
	})
	return have, err
}
