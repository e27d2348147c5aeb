package mcscontroller

import (
	"context"
	"fmt"
	"maps"

	"k8s.io/apimachinery/pkg/util/wait"
)

// A hub that reads hubs writes a Lease of each origin it relays from them,
// as it does of each source it reads (runLeases): the origin's state and
// last contact as its Relay sees them, and the annotations of the hub Lease
// that told it, copied unchanged (relay.(*Relay).OriginLeaseExtra), so that
// the next tier's staleness per origin works as through one hub. An origin
// it also reads directly is runLeases's.

// relayedLease is what a hub's Lease of a relayed origin says.
type relayedLease struct {
	leaseState
	extra map[string]string
}

// runRelayedLeases writes the Lease of each relayed origin when what it
// says changes, looking every StatePoll, until ctx is done.
func (c *Controller) runRelayedLeases(ctx context.Context) {
	written := map[string]relayedLease{}
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		for _, o := range c.cfg.Hubs.Origins() {
			if c.direct(o.Cluster) || o.Cluster == c.cfg.LocalCluster {
				continue
			}
			want := relayedLease{leaseState{state: o.State.String(), contact: o.LastContact}, c.cfg.Hubs.OriginLeaseExtra(o.Cluster)}
			if w, ok := written[o.Cluster]; ok && w.state == want.state && maps.Equal(w.extra, want.extra) {
				continue
			}
			if err := c.applyLease(ctx, o.Cluster, want.leaseState, want.extra); err != nil {
				c.logOnce(fmt.Errorf("relay Lease of relayed cluster %s: %w", o.Cluster, err))
				return
			}
			written[o.Cluster] = want
		}
	}, c.cfg.StatePoll)
}
