package source

import (
	"crypto/ed25519"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// slimPod is what the store keeps instead of a v1.Pod: its key and version,
// the parsed record, and the parse result. A full Pod costs kilobytes; this
// keeps about a hundred bytes.
type slimPod struct {
	ingest.Meta
	rec      *store.Pod
	annoHash uint64 // of the raw export annotation (and signature, when verified), to log each change once
	rejected []annotation.Rejection
}

// GetObjectKind and DeepCopyObject make slimPod a runtime.Object.
func (p *slimPod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (p *slimPod) DeepCopyObject() runtime.Object {
	c := *p
	return &c // rec and rejected are never mutated after the transform
}

// toSlim is the reflector's transform: it runs before anything is stored, so
// the full Pod is dropped at once.
//
// With a key, an export annotation counts only when the Pod's signature
// annotation verifies with it, over the cluster, the Pod's namespace, name and
// UID and the annotation (docs/DESIGN.md#security); otherwise the Pod exports
// nothing and the one rejection says why. The check is per Pod (the signature
// covers its name and UID), before the parse cache, which a verified Pod
// shares with the others. A nil key verifies nothing.
func toSlim(cluster string, key ed25519.PublicKey) func(*v1.Pod) *slimPod {
	return toSlimProof(cluster, key, false)
}

// toSlimProof is toSlim that, with keep, also gives each record a Common of
// its own with the Pod's Proof (for a relay hub, Options.KeepProof): its UID,
// its raw export annotation (the string of the parse cache, so that the Pods
// of a service share one), its endpoint statement and signature.
func toSlimProof(cluster string, key ed25519.PublicKey, keep bool) func(*v1.Pod) *slimPod {
	parsed := newParseCache(cluster)
	return func(pod *v1.Pod) *slimPod {
		raw, present := pod.Annotations[annotation.ExportAnnotation]
		var common *store.Common
		var rejected []annotation.Rejection
		annoHash := hash(raw)
		if key != nil && present {
			sig := pod.Annotations[annotation.SignatureAnnotation]
			annoHash = hash(raw, sig)
			if r, ok := annotation.Verify(key, sig, cluster, pod.Namespace, pod.Name, string(pod.UID), raw); !ok {
				common, rejected = parsed.none(pod.Namespace), []annotation.Rejection{r}
			}
		}
		if common == nil {
			common, rejected, raw = parsed.parse(raw, pod.Namespace)
		}
		rec := &store.Pod{
			Common:   common,
			Name:     pod.Name,
			Hostname: pod.Spec.Hostname,
			IPs:      PodIPs(pod),
			Ready:    PodReady(pod),
		}
		if keep {
			// The record's own Common: the parse's, with its proof.
			c := *common
			var r *annotation.Rejection
			c.Proof, r = proofOf(pod, raw)
			rec.Common = &c
			if r != nil {
				rejected = append(slices.Clip(rejected), *r)
				annoHash = hash(raw, pod.Annotations[annotation.SignatureAnnotation], r.Detail) // reported once, not per update
			}
		}
		return &slimPod{
			Meta:     ingest.MetaOf(pod),
			rec:      rec,
			annoHash: annoHash,
			rejected: rejected,
		}
	}
}

// maxSignatureBytes bounds an endpoint signature a hub keeps (an ed25519
// one is 96 bytes).
const maxSignatureBytes = 256

// proofOf is the proof of pod, whose export annotation is raw. A statement
// or signature over its bound (which no reader would take) is not kept,
// so that the hub writes its own unsigned statement in its place; the
// rejection says so.
func proofOf(pod *v1.Pod, raw string) (*store.Proof, *annotation.Rejection) {
	p := &store.Proof{
		UID:               string(pod.UID),
		Export:            raw,
		Endpoint:          pod.Annotations[annotation.EndpointAnnotation],
		EndpointSignature: pod.Annotations[annotation.EndpointSignatureAnnotation],
	}
	if len(p.Endpoint) > annotation.MaxEndpointBytes || len(p.EndpointSignature) > maxSignatureBytes {
		r := &annotation.Rejection{Index: -1, Reason: annotation.ReasonSize, Detail: fmt.Sprintf(
			"endpoint statement of %d bytes or signature of %d, over %d or %d: not relayed, the hub states the endpoint unsigned",
			len(p.Endpoint), len(p.EndpointSignature), annotation.MaxEndpointBytes, maxSignatureBytes)}
		p.Endpoint, p.EndpointSignature = "", ""
		return p, r
	}
	return p, nil
}

// parseCache remembers the parse of recent export annotations, so that the
// Pods of one service, which carry the same annotation, share one
// store.Common (records are immutable) and each annotation is parsed once.
// It holds at most maxCachedBytes of annotation text, then starts over.
type parseCache struct {
	cluster string
	mu      sync.Mutex
	bytes   int
	m       map[parseKey]parseResult
}

// parseKey: refused keys the empty record of a Pod whose annotation was
// refused before any parse (a signature that does not verify).
type parseKey struct {
	raw, namespace string
	refused        bool
}

type parseResult struct {
	common   *store.Common
	rejected []annotation.Rejection
	raw      string // the key's annotation, which the Pods that carry it share
}

const maxCachedBytes = 1 << 20

func newParseCache(cluster string) *parseCache {
	return &parseCache{cluster: cluster, m: map[parseKey]parseResult{}}
}

// parse returns the record part that the annotation raw on a Pod in
// namespace gives, what the parse rejected, and raw as the first Pod that
// carried it had it (one string for all, not one per Pod).
func (c *parseCache) parse(raw, namespace string) (*store.Common, []annotation.Rejection, string) {
	k := parseKey{raw: raw, namespace: namespace}
	c.mu.Lock()
	r, ok := c.m[k]
	c.mu.Unlock()
	if ok {
		return r.common, r.rejected, r.raw
	}
	r.common = &store.Common{Cluster: c.cluster, Namespace: namespace}
	r.common.Exports, r.rejected = annotation.ParseExports(raw, namespace, c.cluster)
	r.raw = raw
	c.mu.Lock()
	c.add(k, r)
	c.mu.Unlock()
	return r.common, r.rejected, r.raw
}

// add stores a result, starting over when the cache is full; c.mu is held.
func (c *parseCache) add(k parseKey, r parseResult) {
	if c.bytes+len(k.raw)+len(k.namespace) > maxCachedBytes {
		c.m, c.bytes = map[parseKey]parseResult{}, 0
	}
	c.m[k] = r
	c.bytes += len(k.raw) + len(k.namespace)
}

// none returns the record part of a Pod in namespace that exports nothing
// (its annotation is refused as a whole), shared like a parse.
func (c *parseCache) none(namespace string) *store.Common {
	k := parseKey{namespace: namespace, refused: true}
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.m[k]
	if !ok {
		r.common = &store.Common{Cluster: c.cluster, Namespace: namespace}
		c.add(k, r)
	}
	return r.common
}

// PodReady tells whether the Pod's Ready condition is True and it is not
// terminating.
func PodReady(pod *v1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// PodIPs returns status.podIPs (falling back to status.podIP), skipping any
// that do not parse, without duplicates.
func PodIPs(pod *v1.Pod) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return
		}
		a = a.Unmap()
		for _, b := range out {
			if a == b {
				return
			}
		}
		out = append(out, a)
	}
	for _, ip := range pod.Status.PodIPs {
		add(ip.IP)
	}
	if len(out) == 0 && pod.Status.PodIP != "" {
		add(pod.Status.PodIP)
	}
	return out
}

// hash is FNV-1a (64 bits) of strs, each after its length, so that moving
// bytes from one to the next changes it.
func hash(strs ...string) uint64 {
	h := fnv.New64a()
	var n [4]byte
	for _, s := range strs {
		binary.BigEndian.PutUint32(n[:], uint32(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	return h.Sum64()
}
