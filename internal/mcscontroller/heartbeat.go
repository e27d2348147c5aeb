package mcscontroller

import (
	"context"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
)

// Heartbeats a relay hub passes on (annotation.Heartbeat): for each source
// cluster with a client in Config.Heartbeats, the hub watches that one
// Lease, annotation.HeartbeatLeaseNamespace/HeartbeatLeaseName (a field
// selector on its name), and copies its heartbeat and signature, the bytes
// unchanged, into its own Lease of the cluster (relay.HeartbeatAnnotation),
// written again when they change. The hub verifies nothing and needs no
// key: the edges verify.

// maxBeatSignatureBytes bounds a heartbeat signature a hub copies: the
// prefix and the base64 of 64 bytes, with room to spare. What is larger is
// no signature and is not copied, so that an origin cannot make the hub
// write large Leases that every edge receives.
const maxBeatSignatureBytes = 128

// beat is a heartbeat and its signature, and the Pod lists written with it
// (by name, by UID) and their signatures (annotation.PodList; "" when the
// origin writes none), as the origin wrote them.
type beat struct{ value, sig, pods, podsSig, uids, uidsSig string }

// slimBeat is what the heartbeat store keeps of an origin's Lease.
type slimBeat struct {
	ingest.Meta
	beat
}

func (b *slimBeat) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (b *slimBeat) DeepCopyObject() runtime.Object {
	c := *b
	return &c
}

// toBeat is the transform of an origin's heartbeat Lease: its heartbeat
// and signature, or none when either is over its bound; and its Pod lists
// (by name, by UID) and signatures, each none when it or its signature is
// over its bound (the heartbeat is relayed without it: an edge then drops no
// record on the list's word).
func toBeat(cluster string) func(*coordinationv1.Lease) (runtime.Object, error) {
	return func(l *coordinationv1.Lease) (runtime.Object, error) {
		b := &slimBeat{Meta: ingest.MetaOf(l)}
		v, s := l.Annotations[annotation.HeartbeatAnnotation], l.Annotations[annotation.HeartbeatSignatureAnnotation]
		if len(v) > annotation.MaxHeartbeatBytes || len(s) > maxBeatSignatureBytes {
			klog.Warningf("mcs-controller: cluster %s: heartbeat of %d bytes, signature of %d: over %d and %d, not relayed",
				cluster, len(v), len(s), annotation.MaxHeartbeatBytes, maxBeatSignatureBytes)
			return b, nil
		}
		b.beat = beat{value: v, sig: s}
		b.pods, b.podsSig = boundedList(cluster, "Pod list", l, annotation.PodListAnnotation, annotation.PodListSignatureAnnotation)
		b.uids, b.uidsSig = boundedList(cluster, "Pod list by UID", l, annotation.PodUIDListAnnotation, annotation.PodUIDListSignatureAnnotation)
		return b, nil
	}
}

// boundedList returns the value of l's annotation list and of its
// signature annotation sig, both empty when either is over its bound
// (logged, what naming the list).
func boundedList(cluster, what string, l *coordinationv1.Lease, list, sig string) (string, string) {
	v, s := l.Annotations[list], l.Annotations[sig]
	if len(v) > annotation.MaxPodListBytes || len(s) > maxBeatSignatureBytes {
		klog.Warningf("mcs-controller: cluster %s: %s of %d bytes, signature of %d: over %d and %d, not relayed",
			cluster, what, len(v), len(s), annotation.MaxPodListBytes, maxBeatSignatureBytes)
		return "", ""
	}
	return v, s
}

// DefaultHeartbeatWait is Config.HeartbeatWait's default: how long a
// cluster's first Lease write waits for the first list of its heartbeat. A
// write before it would drop the heartbeat the Lease carries (the apply
// owns those annotations), and the edges that verify would take the origin
// as cut off until the next one.
const DefaultHeartbeatWait = 10 * time.Second

// heartbeats holds the last heartbeat read of each source cluster.
type heartbeats struct {
	mu     sync.Mutex
	m      map[string]beat
	listed map[string]bool // its first list arrived
	wait   map[string]bool // it has a reader
	start  time.Time
	max    time.Duration // Config.HeartbeatWait
}

func (h *heartbeats) get(cluster string) beat {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.m[cluster]
}

// ready reports whether cluster's Lease may be written: its heartbeat has
// listed once, it has no reader, or the wait (Config.HeartbeatWait) passed.
func (h *heartbeats) ready(cluster string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.wait[cluster] || h.listed[cluster] || time.Since(h.start) >= h.max
}

func (h *heartbeats) set(cluster string, b beat, listed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m[cluster] = b
	h.listed[cluster] = h.listed[cluster] || listed
}

// watchHeartbeats starts one reflector per client of Config.Heartbeats,
// each of one Lease, until ctx is done. A deleted Lease keeps the heartbeat
// held (the edges see it age); a Lease that may not be read is retried,
// the hub's Lease of the cluster carrying no heartbeat meanwhile.
func (c *Controller) watchHeartbeats(ctx context.Context) *heartbeats {
	hb := &heartbeats{m: map[string]beat{}, listed: map[string]bool{}, wait: map[string]bool{}, start: time.Now(), max: c.cfg.HeartbeatWait}
	if hb.max <= 0 {
		hb.max = DefaultHeartbeatWait
	}
	for cluster, client := range c.cfg.Heartbeats {
		hb.wait[cluster] = true
		st := &ingest.Store[*slimBeat]{
			Changed: func(_, b *slimBeat) { hb.set(cluster, b.beat, false) },
			Deleted: func(*slimBeat) {},
			Replaced: func(_, objs map[string]*slimBeat) {
				held := hb.get(cluster)
				for _, b := range objs {
					held = b.beat
				}
				hb.set(cluster, held, true)
			},
		}
		lw := ingest.Lease(client, annotation.HeartbeatLeaseNamespace, annotation.HeartbeatLeaseName, toBeat(cluster))
		run := ingest.Start(lw, st, ingest.Options{Name: "heartbeat/" + cluster})
		go func() {
			<-ctx.Done()
			st.Close()
			_ = run.Stop()
		}()
	}
	return hb
}
