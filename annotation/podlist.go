package annotation

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Pod lists (docs/DESIGN.md#relay-hubs). A heartbeat proves an origin is
// alive, not which Pods it has: a hub could keep presenting a deleted Pod's
// last signed statement. So with each heartbeat the origin's annotator also
// signs the list of the Pods it states endpoints for, at the heartbeat's
// time, on the same Lease (PodListAnnotation, PodListSignatureAnnotation:
// annotations of their own, so that a reader that parses the heartbeat
// strictly is unaffected). A reader holding a verified list of time T drops
// a relayed record of the origin whose statement is older than T (Seq < T)
// and whose Pod the list does not name: the Pod was gone at T. A statement
// signed after the list has Seq >= T and is kept.
//
// A list names Pods by namespace and name; a second list, written beside it
// with the same time (PodUIDListAnnotation, signed on its own), names them
// by namespace, name and UID, so that the old statement of a Pod deleted and
// made again under its name (a StatefulSet's) is not named by the new Pod's
// entry. Readers of an older version read the first list only; a reader
// that has seen an origin's list by UID takes no other from then on.
const (
	PodListAnnotation          = "multicluster.kubernetes.io/heartbeat-pods"
	PodListSignatureAnnotation = "multicluster.kubernetes.io/heartbeat-pods-signature"
	// PodUIDListAnnotation and PodUIDListSignatureAnnotation carry the
	// list by UID (PodUIDHash), in PodList's format.
	PodUIDListAnnotation          = "multicluster.kubernetes.io/heartbeat-pod-uids"
	PodUIDListSignatureAnnotation = "multicluster.kubernetes.io/heartbeat-pod-uids-signature"

	// PodListSignatureContext starts the signed message of a Pod list.
	PodListSignatureContext = "mcsannotations heartbeat pods v1\n"
	// PodUIDListSignatureContext starts the signed message of a list by
	// UID: no list by name verifies as one by UID, nor the reverse.
	PodUIDListSignatureContext = "mcsannotations heartbeat pod uids v1\n"

	// MaxPodListPods bounds the Pods of a list: an origin that states more
	// writes a list that names none and says how many it has (PodList.Over):
	// readers drop nothing on its word, as without lists, but see that the
	// origin still writes lists (a reader that has seen lists of an origin
	// takes a hub's word that it is connected only with a list as new as
	// the heartbeat).
	MaxPodListPods = 4096
	// PodHashBytes is the size of a Pod's hash in a list.
	PodHashBytes = 8
	// MaxPodListBytes bounds a list's value: MaxPodListPods hashes in
	// base64, with the cluster ID and the time.
	MaxPodListBytes = (MaxPodListPods*PodHashBytes+2)/3*4 + 256
)

// PodList is PodListAnnotation's value (FormatPodList, ParsePodList: JSON
// as podListWire).
type PodList struct {
	// Cluster is the origin's cluster ID.
	Cluster string
	// Time is the time of the heartbeat written with it, in Unix
	// milliseconds.
	Time int64
	// Pods are the hashes (PodHash) of the Pods, each PodHashBytes,
	// concatenated in increasing order, none twice, in base64 (standard,
	// padded); "" for none. Absent from a list over MaxPodListPods.
	Pods string
	// Over is, in a list of an origin with more than MaxPodListPods Pods,
	// their number; such a list names none. 0 (absent) otherwise.
	Over int
}

// maxPodListOver bounds PodList.Over: a number, not an allocation, but
// one that is said in a log line.
const maxPodListOver = 1 << 30

// podListWire is a list as it is written and read: Pods is present (""
// for none) in a list that names its Pods, absent in one over
// MaxPodListPods, which has Over instead.
type podListWire struct {
	Cluster string  `json:"cluster"`
	Time    int64   `json:"time"`
	Pods    *string `json:"pods,omitempty"`
	Over    int     `json:"over,omitempty"`
}

// PodHash is a Pod's hash in a list: the first PodHashBytes of SHA-256
// over "namespace/name", as a number (big-endian). A Pod is named by its
// namespace and name, as a reader keys relayed records.
func PodHash(namespace, name string) uint64 {
	s := sha256.Sum256([]byte(namespace + "/" + name))
	return binary.BigEndian.Uint64(s[:PodHashBytes])
}

// PodUIDHash is a Pod's hash in a list by UID: as PodHash, over
// "namespace/name/uid".
func PodUIDHash(namespace, name, uid string) uint64 {
	s := sha256.Sum256([]byte(namespace + "/" + name + "/" + uid))
	return binary.BigEndian.Uint64(s[:PodHashBytes])
}

// NewPodList makes the list of cluster at time t naming the Pods of
// hashes (in any order; duplicates are dropped); false when there are more
// than MaxPodListPods, with the list that says so and names none.
func NewPodList(cluster string, t int64, hashes []uint64) (PodList, bool) {
	hs := slices.Clone(hashes)
	slices.Sort(hs)
	hs = slices.Compact(hs)
	if len(hs) > MaxPodListPods {
		return PodList{Cluster: cluster, Time: t, Over: min(len(hs), maxPodListOver)}, false
	}
	b := make([]byte, 0, len(hs)*PodHashBytes)
	for _, h := range hs {
		b = binary.BigEndian.AppendUint64(b, h)
	}
	return PodList{Cluster: cluster, Time: t, Pods: base64.StdEncoding.EncodeToString(b)}, true
}

// FormatPodList is a list's annotation value: pods, or over for a list
// over MaxPodListPods.
func FormatPodList(l PodList) string {
	w := podListWire{Cluster: l.Cluster, Time: l.Time, Over: l.Over}
	if l.Over == 0 {
		w.Pods = &l.Pods
	}
	b, _ := json.Marshal(w)
	return string(b)
}

// PodSet is a parsed list's Pods.
type PodSet struct {
	hashes []uint64 // increasing
	over   bool
	uids   bool // of a list by UID (VerifyPodUIDList)
}

// Has tells whether the set, of a list by name, names the Pod
// namespace/name. A set of a list by UID is asked with HasHash of the
// Pod's PodUIDHash.
func (s PodSet) Has(namespace, name string) bool {
	return s.HasHash(PodHash(namespace, name))
}

// HasHash tells whether the set names the Pod of hash (PodHash, or
// PodUIDHash for a set of a list by UID).
func (s PodSet) HasHash(h uint64) bool {
	_, ok := slices.BinarySearch(s.hashes, h)
	return ok
}

// ByUID tells whether the set is of a list by UID.
func (s PodSet) ByUID() bool { return s.uids }

// Len is the number of Pods in the set.
func (s PodSet) Len() int { return len(s.hashes) }

// Over tells whether the set is of a list over MaxPodListPods, which names
// no Pod: nothing is dropped on its word.
func (s PodSet) Over() bool { return s.over }

// ParsePodList reads a list and checks it: bounded, one JSON value with no
// unknown field, a valid cluster ID, a positive time, and either Pods that
// decode to at most MaxPodListPods hashes in increasing order, none twice,
// or (without pods) an Over above MaxPodListPods.
func ParsePodList(raw string) (PodList, PodSet, error) {
	var w podListWire
	if len(raw) > MaxPodListBytes {
		return PodList{}, PodSet{}, fmt.Errorf("Pod list of %d bytes, over %d", len(raw), MaxPodListBytes)
	}
	d := json.NewDecoder(strings.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&w); err != nil {
		return PodList{}, PodSet{}, fmt.Errorf("Pod list: %s", Clip(err.Error()))
	}
	if _, err := d.Token(); err != io.EOF {
		return PodList{}, PodSet{}, fmt.Errorf("Pod list: data after the value")
	}
	if !ValidClusterID(w.Cluster) {
		return PodList{}, PodSet{}, fmt.Errorf("Pod list: cluster %q is not a cluster ID", Clip(w.Cluster))
	}
	if w.Time <= 0 {
		return PodList{}, PodSet{}, fmt.Errorf("Pod list without time")
	}
	l := PodList{Cluster: w.Cluster, Time: w.Time, Over: w.Over}
	switch {
	case w.Pods != nil && w.Over != 0:
		return PodList{}, PodSet{}, fmt.Errorf("Pod list with both pods and over")
	case w.Pods == nil && w.Over == 0:
		// A list without pods would name no Pod: every older record of
		// the origin would go on it.
		return PodList{}, PodSet{}, fmt.Errorf("Pod list without pods")
	case w.Pods == nil:
		if w.Over <= MaxPodListPods || w.Over > maxPodListOver {
			return PodList{}, PodSet{}, fmt.Errorf("Pod list over %d Pods says %d", MaxPodListPods, w.Over)
		}
		return l, PodSet{over: true}, nil
	}
	l.Pods = *w.Pods
	b, err := base64.StdEncoding.Strict().DecodeString(l.Pods)
	if err != nil || len(b)%PodHashBytes != 0 {
		return PodList{}, PodSet{}, fmt.Errorf("Pod list: pods are not base64 of %d-byte hashes", PodHashBytes)
	}
	if n := len(b) / PodHashBytes; n > MaxPodListPods {
		return PodList{}, PodSet{}, fmt.Errorf("Pod list of %d Pods, over %d", n, MaxPodListPods)
	}
	set := PodSet{hashes: make([]uint64, 0, len(b)/PodHashBytes)}
	for c := range slices.Chunk(b, PodHashBytes) {
		h := binary.BigEndian.Uint64(c)
		if n := len(set.hashes); n > 0 && set.hashes[n-1] >= h {
			return PodList{}, PodSet{}, fmt.Errorf("Pod list: pods not in increasing order, or one twice")
		}
		set.hashes = append(set.hashes, h)
	}
	return l, set, nil
}

// PodListSignedMessage is the message a list signature covers: the
// cluster ID and the list, each preceded by its length (as in
// SignedMessage), after PodListSignatureContext, so that no export,
// endpoint or heartbeat signature is a list signature, nor the reverse.
func PodListSignedMessage(cluster, list string) []byte {
	return signedMessage(PodListSignatureContext, cluster, list)
}

// SignPodList returns PodListSignatureAnnotation's value for a list of
// cluster.
func SignPodList(key ed25519.PrivateKey, cluster, list string) string {
	return signature(key, PodListSignedMessage(cluster, list))
}

// PodUIDListSignedMessage is the message a list by UID's signature
// covers, as PodListSignedMessage's after PodUIDListSignatureContext.
func PodUIDListSignedMessage(cluster, list string) []byte {
	return signedMessage(PodUIDListSignatureContext, cluster, list)
}

// SignPodUIDList returns PodUIDListSignatureAnnotation's value for a list
// by UID of cluster.
func SignPodUIDList(key ed25519.PrivateKey, cluster, list string) string {
	return signature(key, PodUIDListSignedMessage(cluster, list))
}

// VerifyPodList checks a list of cluster and its signature and returns it
// parsed: signed with key over cluster and the bytes, well formed, and
// naming cluster. The Rejection says why it fails (Index -1).
func VerifyPodList(key ed25519.PublicKey, sig, cluster, list string) (PodList, PodSet, Rejection, bool) {
	return verifyPodList(key, sig, cluster, list, false)
}

// VerifyPodUIDList checks a list by UID as VerifyPodList does a list by
// name; the set it returns is by UID (PodSet.ByUID).
func VerifyPodUIDList(key ed25519.PublicKey, sig, cluster, list string) (PodList, PodSet, Rejection, bool) {
	return verifyPodList(key, sig, cluster, list, true)
}

func verifyPodList(key ed25519.PublicKey, sig, cluster, list string, uids bool) (PodList, PodSet, Rejection, bool) {
	what, msg, sigAnnotation := "Pod list", PodListSignedMessage(cluster, list), PodListSignatureAnnotation
	if uids {
		what, msg, sigAnnotation = "Pod list by UID", PodUIDListSignedMessage(cluster, list), PodUIDListSignatureAnnotation
	}
	if list == "" {
		return PodList{}, PodSet{}, Rejection{-1, ReasonUnsigned, "no " + what}, false
	}
	if len(list) > MaxPodListBytes {
		// Refused before the signature is computed over it.
		return PodList{}, PodSet{}, Rejection{-1, ReasonSize, fmt.Sprintf("%s of %d bytes, over %d", what, len(list), MaxPodListBytes)}, false
	}
	if r, ok := verify(key, sig, msg,
		"no "+sigAnnotation+": the "+what+" is ignored",
		what+" does not verify with cluster "+cluster+"'s key: it is ignored"); !ok {
		return PodList{}, PodSet{}, r, false
	}
	l, set, err := ParsePodList(list)
	if err != nil {
		return PodList{}, PodSet{}, Rejection{-1, ReasonJSON, err.Error()}, false
	}
	if l.Cluster != cluster {
		return PodList{}, PodSet{}, Rejection{-1, ReasonClusterOutside, fmt.Sprintf("%s of cluster %s where %s's was expected", what, l.Cluster, cluster)}, false
	}
	set.uids = uids
	return l, set, Rejection{}, true
}
