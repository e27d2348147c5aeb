package annotator

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// Pod lists (annotation.PodList, docs/DESIGN.md#relay-hubs): with each
// heartbeat the annotator signs the list of the Pods it states endpoints
// for, at the heartbeat's time T. A reader drops a relayed record older than
// T whose Pod the list does not name, so the list must name every Pod that
// has a statement older than T and still exists, and a statement signed
// after the list must not be older than T. podLister keeps both:
//
//   - the Pods listed are those of the informer's cache that carry an
//     endpoint statement, and those the annotator stated (its statement
//     may not have reached the cache yet) while the cache holds them (a
//     Pod it signed for was in the cache, so one gone from it was deleted,
//     and is forgotten);
//   - under one lock, a list takes its time T and the Pods stated so far,
//     and a new statement takes its Seq (at least T) and is noted: a
//     statement is either noted before the list (and named by it) or has
//     Seq >= T.
//
// The list by UID (annotation.PodUIDHash), written beside it, names the
// same Pods by their UIDs: a stated Pod whose name the cache holds under
// another UID was deleted (the cache holds a newer object only), so its
// UID is not named, and its entry is forgotten unless the Pod now there was
// stated since.

// podLister is what the heartbeat's Pod list is made of.
type podLister struct {
	mu    sync.Mutex
	floor uint64               // the time of the last list: the least Seq of a new statement
	names map[string]types.UID // "namespace/name" of the Pods stated, and the UID stated, until the cache no longer holds them
	over  atomic.Bool          // the last list was over annotation.MaxPodListPods (logged once)
}

// stated notes that pod has a statement of the annotator's, and returns
// seq raised to the time of the last list (0 for a statement kept).
func (p *podLister) stated(pod *corev1.Pod, seq uint64) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.names == nil {
		p.names = map[string]types.UID{}
	}
	p.names[pod.Namespace+"/"+pod.Name] = pod.UID
	if seq == 0 {
		return 0
	}
	return max(seq, p.floor)
}

// list returns the hashes of the Pods of a list of time t, by name
// (annotation.PodHash) and by UID (annotation.PodUIDHash), from pods,
// sorted, none twice. The time is the heartbeat's own (a floor seeded from
// another replica's heartbeat raises the Seq of statements, never the
// heartbeat, which readers refuse when ahead of their clocks).
func (p *podLister) list(pods corelisters.PodLister, t int64) (names, uids []uint64) {
	type stated struct {
		key string
		uid types.UID
	}
	p.mu.Lock()
	p.floor = max(p.floor, uint64(t))
	all := make([]stated, 0, len(p.names))
	for n, uid := range p.names {
		all = append(all, stated{n, uid})
	}
	p.mu.Unlock()

	cached, _ := pods.List(labels.Everything())
	for _, pod := range cached {
		if pod.Annotations[annotation.EndpointAnnotation] != "" {
			names = append(names, annotation.PodHash(pod.Namespace, pod.Name))
			uids = append(uids, annotation.PodUIDHash(pod.Namespace, pod.Name, string(pod.UID)))
		}
	}
	var gone []stated
	for _, n := range all {
		ns, name, _ := strings.Cut(n.key, "/")
		pod, err := pods.Pods(ns).Get(name)
		if err != nil {
			gone = append(gone, n) // deleted since: not listed, forgotten
			continue
		}
		names = append(names, annotation.PodHash(ns, name))
		if pod.UID != n.uid {
			gone = append(gone, n) // deleted and made again under its name: the stated UID is not listed
			continue
		}
		uids = append(uids, annotation.PodUIDHash(ns, name, string(n.uid)))
	}
	p.mu.Lock()
	for _, n := range gone {
		if p.names[n.key] == n.uid { // not stated again since
			delete(p.names, n.key)
		}
	}
	p.mu.Unlock()
	slices.Sort(names)
	slices.Sort(uids)
	return slices.Compact(names), slices.Compact(uids)
}

// seedListFloor raises the least Seq of new statements to the time of the
// heartbeat the Lease carries, when it is the cluster's (the last leader's
// list), so that a statement this replica signs is not older than a list
// another replica wrote with a clock ahead of its own. Bounded: without an
// answer within a few seconds, it goes on without.
func (c *Controller) seedListFloor(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := c.client.CoordinationV1().Leases(annotation.HeartbeatLeaseNamespace).Get(ctx, annotation.HeartbeatLeaseName, metav1.GetOptions{})
	if err != nil {
		return
	}
	hb, _, ok := annotation.VerifyHeartbeat(c.public, l.Annotations[annotation.HeartbeatSignatureAnnotation], c.cfg.Cluster, l.Annotations[annotation.HeartbeatAnnotation])
	if !ok {
		return
	}
	c.listed.mu.Lock()
	c.listed.floor = max(c.listed.floor, uint64(hb.Time))
	c.listed.mu.Unlock()
	klog.V(2).Infof("heartbeat %s/%s: new statements are not older than the last heartbeat, %d", annotation.HeartbeatLeaseNamespace, annotation.HeartbeatLeaseName, hb.Time)
}
