package annotator

import (
	"context"
	"encoding/json"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// Heartbeats (--sign-endpoints, annotation.Heartbeat): the annotator keeps
// the Lease annotation.HeartbeatLeaseNamespace/HeartbeatLeaseName, whose
// annotations carry a heartbeat of its cluster signed with its key,
// rewritten every Config.HeartbeatInterval. A relay hub copies the bytes
// into its Lease of the cluster; an edge under verify counts the hub's
// word that the cluster is in contact only while the heartbeat is recent.
// Each write reaches every edge of every hub as one Lease event, so the
// interval is minutes, not seconds. The same apply writes the signed list
// of the Pods the annotator states endpoints for (podlist.go).

// DefaultHeartbeatInterval is Config.HeartbeatInterval's default: a fifth
// of the readers' default timeout (relay.DefaultHeartbeatTimeout), so that
// a write or two that fail, or a leader's handover, do not make the
// cluster look stale.
const DefaultHeartbeatInterval = time.Minute

// FieldManagerHeartbeat is the field manager of the heartbeat Lease.
const FieldManagerHeartbeat = "mcs-annotator-heartbeat"

// heartbeatInterval is Config.HeartbeatInterval or its default.
func (c *Controller) heartbeatInterval() time.Duration {
	if c.cfg.HeartbeatInterval > 0 {
		return c.cfg.HeartbeatInterval
	}
	return DefaultHeartbeatInterval
}

// runHeartbeat writes the heartbeat at once and then every interval until
// ctx is done; a write that fails is tried again after a tenth of the
// interval (at least a second), so that one lost write does not cost a
// whole interval.
func (c *Controller) runHeartbeat(ctx context.Context) {
	interval := c.heartbeatInterval()
	var last int64
	failing := false
	for {
		wait := interval
		t, err := c.writeHeartbeat(ctx, last)
		switch {
		case err == nil:
			last = t
			if failing {
				klog.Infof("heartbeat %s/%s written again", annotation.HeartbeatLeaseNamespace, annotation.HeartbeatLeaseName)
			}
			failing = false
		case ctx.Err() != nil:
			return
		default:
			if !failing {
				klog.Warningf("heartbeat %s/%s: %v (retrying)", annotation.HeartbeatLeaseNamespace, annotation.HeartbeatLeaseName, err)
			}
			failing = true
			wait = max(interval/10, time.Second)
		}
		result := "ok"
		if err != nil {
			result = "error"
		}
		c.metrics.HeartbeatWrites.WithLabelValues(result).Inc()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// writeHeartbeat applies the heartbeat Lease with a heartbeat of now (in
// Unix milliseconds, or last plus one when the clock is not past last), and
// returns its time.
func (c *Controller) writeHeartbeat(ctx context.Context, last int64) (int64, error) {
	now := time.Now()
	t := max(now.UnixMilli(), last+1)
	pods, uids := c.listed.list(c.pods, t)
	hb := annotation.FormatHeartbeat(annotation.Heartbeat{Cluster: c.cfg.Cluster, Time: t})
	l := &coordinationv1.Lease{
		TypeMeta: metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: annotation.HeartbeatLeaseNamespace,
			Name:      annotation.HeartbeatLeaseName,
			Annotations: map[string]string{
				annotation.HeartbeatAnnotation:          hb,
				annotation.HeartbeatSignatureAnnotation: annotation.SignHeartbeat(c.cfg.SignKey, c.cfg.Cluster, hb),
			},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &c.cfg.Cluster, RenewTime: &metav1.MicroTime{Time: now}},
	}
	// A list is written with every heartbeat, one that names no Pod when
	// there are too many: readers that saw lists of this cluster take a
	// hub's word that it is connected only with one.
	pl, ok := annotation.NewPodList(c.cfg.Cluster, t, pods)
	if ok {
		c.listed.over.Store(false)
	} else if !c.listed.over.Swap(true) {
		klog.Warningf("heartbeat %s/%s: %d Pods with endpoint statements, over %d: the Pod list names none (readers drop no relayed record on its word)",
			annotation.HeartbeatLeaseNamespace, annotation.HeartbeatLeaseName, len(pods), annotation.MaxPodListPods)
	}
	v := annotation.FormatPodList(pl)
	l.Annotations[annotation.PodListAnnotation] = v
	l.Annotations[annotation.PodListSignatureAnnotation] = annotation.SignPodList(c.cfg.SignKey, c.cfg.Cluster, v)
	// The same Pods by UID, at the same time (over the cap when the list
	// by name is: the UIDs of one name are one Pod's at a time).
	ul, _ := annotation.NewPodList(c.cfg.Cluster, t, uids)
	if !ok {
		ul = pl
	}
	u := annotation.FormatPodList(ul)
	l.Annotations[annotation.PodUIDListAnnotation] = u
	l.Annotations[annotation.PodUIDListSignatureAnnotation] = annotation.SignPodUIDList(c.cfg.SignKey, c.cfg.Cluster, u)
	body, err := json.Marshal(l)
	if err != nil {
		return 0, err
	}
	force := true
	_, err = c.client.CoordinationV1().Leases(l.Namespace).Patch(ctx, l.Name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: FieldManagerHeartbeat, Force: &force})
	return t, err
}
