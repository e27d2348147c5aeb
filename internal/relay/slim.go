package relay

import (
	"fmt"
	"hash/maphash"
	"time"
	"unsafe"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// slimSlice is what a hub's slice store keeps of an EndpointSlice: its key
// and version, its origin, and the records its relay annotation makes, each
// checked (and, under verify, verified) as the slice arrives; the slice
// itself is dropped at once.
type slimSlice struct {
	ingest.Meta
	origin   string // "" when the slice relays nothing the reader takes
	entries  []entry
	bad      *refused // what the transform refused; nil for nothing (a pointer: a hub holds many slices)
	annoHash uint64   // of the relay annotation and the origin
	cut      bool     // Namespace and Name are cut from one "namespace/name" (cutNames)
}

// cutNames makes the slice's namespace, name and key ("namespace/name", the
// key ingest.Store keeps it under), its version and UID, and the origin name
// one string, and returns the origin cut from it: a hub holds many slices,
// and the decoder gave each of these strings an allocation of its own (the
// store one more for the key).
func (s *slimSlice) cutNames(origin string) string {
	key := len(s.Namespace) + 1 + len(s.Name)
	rv := key + len(s.ResourceVersion)
	uid := rv + len(s.UID)
	all := s.Namespace + "/" + s.Name + s.ResourceVersion + string(s.UID) + origin
	s.Namespace, s.Name, s.cut = all[:len(s.Namespace)], all[len(s.Namespace)+1:key], true
	s.ResourceVersion, s.UID = all[key:rv], types.UID(all[rv:uid])
	return all[uid:]
}

// Key is ingest.Store's key of s, without an allocation when cutNames made
// it.
func (s *slimSlice) Key() string {
	if !s.cut {
		return s.Meta.Key()
	}
	return unsafe.String(unsafe.StringData(s.Namespace), len(s.Namespace)+1+len(s.Name))
}

// refused is what the transform of a slice refused, reported once per
// change, and the slice's source-cluster label, which the report names.
type refused struct {
	label string
	list  []refusal
}

// entry is one relayed Pod record.
type entry struct {
	rec  *store.Pod
	seq  uint64
	hash uint64 // statementHash of the export annotation and the statement
	uid  uint64 // under verify, annotation.PodUIDHash of the Pod (a list by UID names it so)
}

type refusal struct {
	pod string
	r   annotation.Rejection
}

func (s *slimSlice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (s *slimSlice) DeepCopyObject() runtime.Object {
	c := *s
	return &c // bad is never changed after the transform, entries only by Relay.share (under r.mu, each to an equal record; they may be another hub's slice's, see shareEntries)
}

// refusals is what the transform of s refused.
func (s *slimSlice) refusals() []refusal {
	if s.bad == nil {
		return nil
	}
	return s.bad.list
}

// toSlim returns the transform of a hub's slices.
func (r *Relay) toSlim(es *discoveryv1.EndpointSlice) *slimSlice {
	s := &slimSlice{Meta: ingest.MetaOf(es)}
	raw, ok := es.Annotations[SliceAnnotation]
	if !ok {
		return s // a slice of the hub's own, or of a hub that relays nothing
	}
	origin := s.cutNames(es.Labels[mcsv1beta1.LabelSourceCluster])
	s.annoHash = hash(origin, raw)
	add := func(f refusal) {
		if s.bad == nil {
			s.bad = &refused{label: annotation.Clip(origin)}
		}
		s.bad.list = append(s.bad.list, f)
	}
	refuse := func(pod string, reason annotation.Reason, format string, a ...any) {
		add(refusal{pod, annotation.Rejection{Index: -1, Reason: reason, Detail: fmt.Sprintf(format, a...)}})
	}
	if msgs := validation.IsDNS1123Subdomain(origin); len(msgs) > 0 || len(origin) > 127 {
		refuse("", ReasonMalformed, "slice %s: source-cluster label %q is no cluster ID", es.Name, annotation.Clip(origin))
		return s
	}
	if r.ignored(origin) {
		return s // read directly, or the reader's own
	}
	var key []byte
	if r.cfg.Keys != nil {
		key = r.cfg.Keys[origin]
		if key == nil {
			refuse("", ReasonNoKey, "slice %s: no key for cluster %s: its records are ignored", es.Name, origin)
			return s
		}
	}
	sl, err := Parse(raw)
	if err != nil {
		refuse("", ReasonMalformed, "slice %s: %v", es.Name, err)
		return s
	}
	s.origin = origin
	type parsed struct {
		common   *store.Common
		rejected []annotation.Rejection
	}
	commons := make([]*parsed, len(sl.Exports))
	seen := make(map[string]bool, len(sl.Pods))
	for i, p := range sl.Pods {
		if msgs := validation.IsDNS1123Subdomain(p.Name); len(msgs) > 0 {
			refuse(annotation.Clip(p.Name), ReasonMalformed, "slice %s: %q is no Pod name", es.Name, annotation.Clip(p.Name))
			continue
		}
		if seen[p.Name] {
			refuse(p.Name, ReasonMalformed, "slice %s lists the Pod twice", es.Name)
			continue
		}
		seen[p.Name] = true
		export := sl.Exports[p.Export]
		path := sl.PodPath(i)
		if reason, detail := r.checkPath(path); reason != "" {
			refuse(p.Name, reason, "slice %s: %s", es.Name, detail)
			continue
		}
		if key != nil {
			if rej, ok := annotation.VerifyEndpoint(key, p.Signature, origin, s.Namespace, p.Name, p.UID, export, p.Endpoint); !ok {
				add(refusal{p.Name, rej})
				continue
			}
		}
		ep, ips, err := annotation.ParseEndpoint(p.Endpoint)
		if err != nil {
			refuse(p.Name, ReasonMalformed, "%v", err)
			continue
		}
		c := commons[p.Export]
		if c == nil {
			c = &parsed{common: &store.Common{Cluster: origin, Namespace: s.Namespace}}
			c.common.Exports, c.rejected = annotation.ParseExports(export, s.Namespace, origin)
			commons[p.Export] = c
		}
		for _, rej := range c.rejected {
			add(refusal{p.Name, rej})
		}
		if s.entries == nil {
			s.entries = make([]entry, 0, len(sl.Pods)) // at its size: a hub holds many slices
		}
		rec := &store.Pod{Common: c.common, Name: p.Name, Hostname: ep.Hostname, IPs: ips, Ready: ep.Ready}
		if r.cfg.KeepProof {
			rec.Common = withProof(c.common, p, export, path)
		}
		var uid uint64
		if key != nil {
			uid = annotation.PodUIDHash(s.Namespace, p.Name, p.UID)
		}
		s.entries = append(s.entries, entry{
			rec:  rec,
			seq:  ep.Seq,
			uid:  uid,
			hash: statementHash(export, p.Endpoint), // stable: remembered across restarts
		})
	}
	return s
}

// slimLease is what a hub's Lease store keeps of an origin Lease.
type slimLease struct {
	ingest.Meta
	origin string
	state  source.State
	renew  time.Time
	// Under verify (heartbeat.go): the time of the origin's heartbeat the
	// Lease carries, zero when it carries none that verifies; beatRefused
	// says why not. beatHash is of the heartbeat's bytes and signature.
	beat        time.Time
	beatRefused annotation.Rejection
	beatHash    uint64
	// Under verify (podlist.go): the origin's Pod list the Lease carries,
	// by UID when that verifies, nil when it carries none that verifies;
	// listRefused says why not (or why its list by UID did not verify).
	list        *podList
	listRefused annotation.Rejection
	extra       map[string]string // kept only for a hub (leasecopy.go)
	// A Lease refused for its relay path (origin empty) keeps the origin
	// it named and why, when that is no routine loop (the path naming the
	// reader): reported once per change (notePath).
	pathOrigin  string
	pathRefused annotation.Rejection
}

func (l *slimLease) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (l *slimLease) DeepCopyObject() runtime.Object {
	c := *l
	return &c
}

// toLease is the transform of a hub's Leases. A Lease whose origin label is
// not its name's, or whose relay path checkPath refuses
// (LeasePathAnnotation), says nothing of any origin; one whose state is
// unknown says the origin is disconnected as of its renewTime. Under
// verify, the heartbeat it carries is verified with the origin's key as it
// arrives (checkBeat).
func (r *Relay) toLease(l *coordinationv1.Lease) *slimLease {
	s := &slimLease{Meta: ingest.MetaOf(l), origin: l.Labels[OriginLabel], state: source.Disconnected}
	if l.Name != LeasePrefix+s.origin {
		s.origin = ""
	}
	// Its word went round through the reader, or the path is not one (not
	// split at all past what MaxPath cluster IDs take).
	if path := l.Annotations[LeasePathAnnotation]; len(path) > MaxPath*128 {
		s.refusePath(ReasonMalformed, fmt.Sprintf("relay path of %d bytes, over what %d cluster IDs take", len(path), MaxPath))
	} else if p := SplitPath(path); r.throughReader(p) {
		s.origin = "" // hubs reading each other: routine, not reported
	} else if reason, detail := r.checkPath(p); reason != "" {
		s.refusePath(reason, detail)
	}
	for _, st := range source.States {
		if l.Annotations[OriginStateAnnotation] == st.String() {
			s.state = st
		}
	}
	if l.Spec.RenewTime != nil {
		s.renew = l.Spec.RenewTime.Time
	}
	if s.origin != "" && r.cfg.Keys != nil {
		r.checkBeat(s, l.Annotations[HeartbeatAnnotation], l.Annotations[HeartbeatSignatureAnnotation])
		r.checkList(s, l.Annotations[PodListAnnotation], l.Annotations[PodListSignatureAnnotation],
			l.Annotations[PodUIDListAnnotation], l.Annotations[PodUIDListSignatureAnnotation])
	}
	return s
}

// refusePath makes l say nothing of its origin, for its relay path.
func (l *slimLease) refusePath(reason annotation.Reason, detail string) {
	if l.origin != "" {
		l.pathOrigin = l.origin
		l.pathRefused = annotation.Rejection{Index: -1, Reason: reason,
			Detail: fmt.Sprintf("the hub's Lease of cluster %s: %s: its word on the origin is ignored", l.origin, detail)}
	}
	l.origin = ""
}

// seed keys hash: its values never leave the process.
var seed = maphash.MakeSeed()

// hash is a 64-bit hash of strs, each after its length.
func hash(strs ...string) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	for _, s := range strs {
		maphash.WriteComparable(&h, len(s))
		h.WriteString(s)
	}
	return h.Sum64()
}
