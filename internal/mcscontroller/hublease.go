package mcscontroller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/mcsannotations/mcsannotations/internal/relay"
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
			if err := c.applyRelayedLease(ctx, o.Cluster, want); err != nil {
				c.logOnce(fmt.Errorf("relay Lease of relayed cluster %s: %w", o.Cluster, err))
				return
			}
			written[o.Cluster] = want
		}
	}, c.cfg.StatePoll)
}

// applyRelayedLease is applyLease with the copied annotations: the state
// is written last, so a copied one never overrides it.
func (c *Controller) applyRelayedLease(ctx context.Context, cluster string, l relayedLease) error {
	if len(l.extra) == 0 {
		return c.applyLease(ctx, cluster, l.leaseState)
	}
	return c.applyLeaseAnnotated(ctx, cluster, l.leaseState, l.extra)
}

// applyLeaseAnnotated is applyLease with extra annotations beside the
// state (which wins over an extra of its name).
func (c *Controller) applyLeaseAnnotated(ctx context.Context, cluster string, st leaseState, extra map[string]string) error {
	annotations := maps.Clone(extra)
	annotations[relay.OriginStateAnnotation] = st.state
	l := &coordinationv1.Lease{
		TypeMeta: metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   c.cfg.RelayNamespace,
			Name:        relay.LeasePrefix + cluster,
			Labels:      map[string]string{relay.OriginLabel: cluster},
			Annotations: annotations,
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &c.cfg.LocalCluster},
	}
	if !st.contact.IsZero() {
		l.Spec.RenewTime = &metav1.MicroTime{Time: st.contact}
	}
	body, err := json.Marshal(l)
	if err != nil {
		return err
	}
	_, err = c.client.CoordinationV1().Leases(l.Namespace).Patch(ctx, l.Name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: FieldManager, Force: ptrTrue()})
	c.metrics.write("lease", err)
	return err
}
