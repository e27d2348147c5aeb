package mcscontroller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// A relay hub (Config.Relay) writes, beside each EndpointSlice's standard
// fields, the origin Pods' own bytes (relay.SliceAnnotation, internal/relay)
// and one Lease per source cluster saying when the hub last heard from it.
// It relays what it reads directly (the local cluster and its peers) and,
// reading hubs too, what they relay (hubs.go).

// relaySlices is the bound of a hub's slices of one cluster's share: at most
// clusterset.RelayEndpointsPerSlice endpoints, and no more than the relay
// annotation holds. byAddr finds the records behind an endpoint.
func relaySlices(byAddr map[string][]*store.Pod, hub string) clusterset.SliceLimit {
	return clusterset.SliceLimit{Max: clusterset.RelayEndpointsPerSlice, Fits: func(eps []discoveryv1.Endpoint) bool {
		_, fits, _ := relay.AnnotationVia(relayPods(eps, byAddr), hub)
		return fits
	}}
}

// byAddress indexes a share's records by endpoint address (as a slice
// writes it).
func (s *share) byAddress() map[string][]*store.Pod {
	m := make(map[string][]*store.Pod, len(s.recs))
	for _, p := range s.recs {
		for _, a := range p.IPs {
			k := a.Unmap().String()
			m[k] = append(m[k], p)
		}
	}
	return m
}

// relayPods are the records behind a slice's endpoints (each once).
func relayPods(eps []discoveryv1.Endpoint, byAddr map[string][]*store.Pod) []*store.Pod {
	var out []*store.Pod
	seen := map[*store.Pod]bool{}
	for _, ep := range eps {
		for _, a := range ep.Addresses {
			if ip, err := netip.ParseAddr(a); err == nil {
				a = ip.Unmap().String()
			}
			for _, p := range byAddr[a] {
				if !seen[p] {
					seen[p] = true
					out = append(out, p)
				}
			}
		}
	}
	return out
}

// relayAnnotate sets a hub's slice's relay annotation, hub being the hub's
// cluster ID (the last of each record's path).
func relayAnnotate(sl *discoveryv1.EndpointSlice, byAddr map[string][]*store.Pod, hub string) {
	v, _, skipped := relay.AnnotationVia(relayPods(sl.Endpoints, byAddr), hub)
	if skipped > 0 {
		klog.V(2).Infof("mcs-controller: slice %s/%s: %d records without proof or past relay.MaxPath hubs not relayed", sl.Namespace, sl.Name, skipped)
	}
	sl.Annotations[relay.SliceAnnotation] = v
}

// leaseState is what a hub's Lease says of an origin: its state, the
// hub's last contact, the origin's last heartbeat (heartbeat.go), and the
// relay path of that word (relay.LeasePathAnnotation).
type leaseState struct {
	state   string
	contact time.Time
	beat    beat
	path    string
}

// stateOf is a source's state as a Lease names it (source.State's names).
func stateOf(s Source) string {
	if st, ok := s.(interface{ State() source.State }); ok {
		return st.State().String()
	}
	switch {
	case s.Connected() && s.HasSynced():
		return source.Connected.String()
	case s.Connected():
		return source.Syncing.String()
	}
	return source.Disconnected.String()
}

// runLeases writes each source cluster's Lease once at the start and then
// on each change of its state or its heartbeat, looking every StatePoll,
// until ctx is done. A cluster's first write waits for the first list of its
// heartbeat, at most Config.HeartbeatWait. A write that fails is tried again at the next look;
// the others of that look wait too (the local API server does not answer,
// most likely).
func (c *Controller) runLeases(ctx context.Context) {
	written := map[string]leaseState{}
	beats := c.watchHeartbeats(ctx)
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		for _, s := range c.sources {
			if !beats.ready(s.Cluster()) {
				continue // its heartbeat is not known yet
			}
			want := leaseState{state: stateOf(s), contact: s.LastContact(), beat: beats.get(s.Cluster()), path: c.cfg.LocalCluster}
			if w, ok := written[s.Cluster()]; ok && w.state == want.state && w.beat == want.beat {
				continue
			}
			if err := c.applyLease(ctx, s.Cluster(), want, nil); err != nil {
				c.logOnce(fmt.Errorf("relay Lease of cluster %s: %w", s.Cluster(), err))
				return
			}
			written[s.Cluster()] = want
		}
	}, c.cfg.StatePoll)
}

// applyLease applies the Lease of origin cluster. A cluster not heard from
// since the controller started keeps the renewTime its Lease has (the last
// contact of the controller before): its state is merge-patched, as an
// apply without renewTime would drop it, and only a Lease that does not
// exist yet is applied without one. The origin's heartbeat, when the hub
// holds one, is copied as it is, with the Pod lists written with it (by
// name, by UID); the merge patch keeps the one the Lease has when the hub
// holds none yet, and removes a list of the Lease when the heartbeat comes
// without one. extra are annotations beside those (the state, path and
// heartbeat win over an extra of their name).
func (c *Controller) applyLease(ctx context.Context, cluster string, st leaseState, extra map[string]string) error {
	annotations := maps.Clone(extra)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[relay.OriginStateAnnotation] = st.state
	if st.path != "" {
		annotations[relay.LeasePathAnnotation] = st.path
	}
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
	if st.beat.value != "" {
		l.Annotations[relay.HeartbeatAnnotation] = st.beat.value
		l.Annotations[relay.HeartbeatSignatureAnnotation] = st.beat.sig
	}
	if st.beat.value != "" && st.beat.pods != "" {
		l.Annotations[relay.PodListAnnotation] = st.beat.pods
		l.Annotations[relay.PodListSignatureAnnotation] = st.beat.podsSig
	}
	if st.beat.value != "" && st.beat.uids != "" {
		l.Annotations[relay.PodUIDListAnnotation] = st.beat.uids
		l.Annotations[relay.PodUIDListSignatureAnnotation] = st.beat.uidsSig
	}
	leases := c.client.CoordinationV1().Leases(l.Namespace)
	if st.contact.IsZero() {
		ann := make(map[string]any, len(l.Annotations)+2)
		for k, v := range l.Annotations {
			ann[k] = v
		}
		if _, beat := l.Annotations[relay.HeartbeatAnnotation]; beat {
			// A heartbeat without a list: the list the Lease has is
			// older, and goes (null), as an apply would drop it.
			if l.Annotations[relay.PodListAnnotation] == "" {
				ann[relay.PodListAnnotation], ann[relay.PodListSignatureAnnotation] = nil, nil
			}
			if l.Annotations[relay.PodUIDListAnnotation] == "" {
				ann[relay.PodUIDListAnnotation], ann[relay.PodUIDListSignatureAnnotation] = nil, nil
			}
		}
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": l.Labels, "annotations": ann}, "spec": l.Spec})
		if err != nil {
			return err
		}
		_, err = leases.Patch(ctx, l.Name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
		if !apierrors.IsNotFound(err) {
			c.metrics.write("lease", err)
			return err
		}
	} else {
		l.Spec.RenewTime = &metav1.MicroTime{Time: st.contact}
	}
	body, err := json.Marshal(l)
	if err != nil {
		return err
	}
	_, err = leases.Patch(ctx, l.Name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: FieldManager, Force: ptrTrue()})
	c.metrics.write("lease", err)
	return err
}
