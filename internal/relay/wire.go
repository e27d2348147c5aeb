// Package relay carries the records of many clusters through hubs
// (docs/DESIGN.md#relay-hubs). A hub is a cluster whose MCS controller writes,
// on each EndpointSlice it keeps for an exporting cluster (the origin), the
// origin's own signed bytes for every Pod behind the slice (SliceAnnotation),
// and one Lease per origin it reads saying when it last heard from it. An
// edge that reads a hub's slices and Leases instead of every origin gets every
// origin's records, still tagged with the origin and, under verify, accepted
// only when the origin's key signed them.
package relay

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Names of what a hub writes.
const (
	// SliceAnnotation on an EndpointSlice a hub's controller writes: a Slice,
	// as JSON. The slice's namespace and its
	// multicluster.kubernetes.io/source-cluster label name the origin's
	// namespace and cluster: a record is accepted only when its signature
	// covers those two.
	SliceAnnotation = "multicluster.mcsannotations.io/relay"

	// OriginLabel on a hub's Lease names the origin it reports on; the Lease
	// is LeasePrefix + origin, in the namespace the hub's controller runs in.
	// spec.holderIdentity is the hub's cluster ID, spec.renewTime the hub's
	// last contact with the origin as of the Lease's last write, and
	// OriginStateAnnotation the origin's state then (syncing, connected,
	// disconnected). The hub writes a Lease when the origin's state or
	// heartbeat changes, not on every contact: while the Lease says
	// connected (under verify, with a recent heartbeat), the origin is as
	// current as the hub is to its reader.
	OriginLabel           = "multicluster.mcsannotations.io/relay-origin"
	OriginStateAnnotation = "multicluster.mcsannotations.io/origin-state"
	LeasePrefix           = "mcs-origin."
	// LeasePathAnnotation on a hub's Lease is the relay path of what it
	// says (JoinPath), as Slice.Paths is of a record: the hubs the
	// origin's state crossed, the Lease's writer last. A hub writes its
	// Lease of a cluster it reads itself with a path of itself alone, and
	// that of a relayed origin with the path of the Lease it copies, itself
	// added (none past MaxPath hubs). A reader ignores a Lease whose path
	// names itself, names more than MaxPath hubs or is malformed: hubs
	// reading each other then do not hold up each other's Lease of an
	// origin that neither reads any more, and both delete theirs. The hubs'
	// word, not signed: altered, it at most makes a reader ignore (withhold)
	// a Lease. Absent (older hubs): taken as empty.
	LeasePathAnnotation = "multicluster.mcsannotations.io/relay-path"

	// HeartbeatAnnotation and HeartbeatSignatureAnnotation on a hub's Lease
	// carry the origin's last heartbeat (annotation.HeartbeatAnnotation and
	// annotation.HeartbeatSignatureAnnotation on the origin's Lease
	// annotation.HeartbeatLeaseNamespace/HeartbeatLeaseName), the bytes the
	// hub read, unchanged; the hub writes its Lease again when they change.
	// Under verify a reader takes the Lease's "connected" only while the
	// heartbeat verifies with the origin's key, names the origin and is
	// recent (Config.HeartbeatTimeout), and takes the origin's last contact
	// from it rather than from renewTime, which the hub alone vouches for.
	HeartbeatAnnotation          = "multicluster.mcsannotations.io/heartbeat"
	HeartbeatSignatureAnnotation = "multicluster.mcsannotations.io/heartbeat-signature"
	// PodListAnnotation and PodListSignatureAnnotation on a hub's Lease
	// carry the Pod list the origin wrote with that heartbeat
	// (annotation.PodListAnnotation and annotation.PodListSignatureAnnotation),
	// the bytes unchanged. Under verify a reader drops a relayed record of
	// the origin older than the newest list that verifies and not named in
	// it (ReasonUnlisted).
	PodListAnnotation          = "multicluster.mcsannotations.io/heartbeat-pods"
	PodListSignatureAnnotation = "multicluster.mcsannotations.io/heartbeat-pods-signature"
	// PodUIDListAnnotation and PodUIDListSignatureAnnotation carry the
	// origin's list by UID written with that heartbeat
	// (annotation.PodUIDListAnnotation), the bytes unchanged. A reader
	// that has seen one of the origin takes no list by name from then on.
	PodUIDListAnnotation          = "multicluster.mcsannotations.io/heartbeat-pod-uids"
	PodUIDListSignatureAnnotation = "multicluster.mcsannotations.io/heartbeat-pod-uids-signature"
	// MaxPath is the most hubs a record crosses between its origin and any
	// reader: a hub does not relay a record that crossed MaxPath hubs
	// already (its own would be one more), and a reader refuses a record
	// whose path names more (ReasonLoop). Regions of regions rarely need
	// more than two or three tiers; a few hubs more bound the time a
	// deleted record can take to go (docs/DESIGN.md#relay-hubs).
	MaxPath = 4

	// MaxSliceBytes bounds SliceAnnotation's value (Kubernetes allows
	// 256 KiB of annotations per object).
	MaxSliceBytes = 192 << 10
)

// Slice is SliceAnnotation's value.
type Slice struct {
	// Exports are the distinct export annotations (annotation.ExportAnnotation,
	// the origin Pods' bytes unchanged) of the Pods below.
	Exports []string `json:"exports"`
	Pods    []Pod    `json:"pods"`
	// Paths are the distinct relay paths of the Pods below: the cluster IDs
	// of the hubs each record crossed, in order, the slice's writer last (a
	// hub that read the origin directly writes a path of itself alone). A
	// reader refuses a record whose path names itself or more than MaxPath
	// hubs (ReasonLoop), so that records do not loop between hubs reading
	// each other. The path is the hubs' word, not signed: a hub can alter
	// it, which at most makes a reader refuse (withhold) a record. Absent
	// when written by a hub that relays only what it reads directly (older
	// versions): every Pod's path is then unknown, taken as empty. An older
	// reader ignores it.
	Paths [][]string `json:"paths,omitempty"`
}

// Pod is one origin Pod behind a slice.
type Pod struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
	// Export indexes Slice.Exports.
	Export int `json:"export"`
	// Endpoint is the Pod's annotation.EndpointAnnotation, unchanged. When
	// the origin states no endpoints (its annotator runs without
	// --sign-endpoints), the hub writes one from the Pod's status with Seq 1
	// and no Signature: a reader without verify takes it, one with verify
	// refuses it.
	Endpoint string `json:"endpoint"`
	// Signature is the Pod's annotation.EndpointSignatureAnnotation.
	Signature string `json:"sig,omitempty"`
	// Path indexes Slice.Paths (0 when Paths is empty).
	Path int `json:"path,omitempty"`
}

// Format returns a Slice's annotation value. It does not escape <, > and &
// (json.Marshal's \u003c...): the origins' JSON bytes are carried as they
// are, at most doubled by the escaping of quotes and backslashes.
func Format(s Slice) string {
	var b strings.Builder
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	_ = e.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

// Parse reads a Slice's annotation value, bounded; it checks the structure
// only (every Export and Path index in range), not the records.
func Parse(raw string) (Slice, error) {
	var s Slice
	if len(raw) > MaxSliceBytes {
		return s, fmt.Errorf("relay annotation of %d bytes, over %d", len(raw), MaxSliceBytes)
	}
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return Slice{}, fmt.Errorf("relay annotation: %v", err)
	}
	for i, p := range s.Pods {
		if p.Export < 0 || p.Export >= len(s.Exports) {
			return Slice{}, fmt.Errorf("relay annotation: pod %d names export %d of %d", i, p.Export, len(s.Exports))
		}
		if p.Path != 0 && (p.Path < 0 || p.Path >= len(s.Paths)) {
			return Slice{}, fmt.Errorf("relay annotation: pod %d names path %d of %d", i, p.Path, len(s.Paths))
		}
	}
	return s, nil
}

// PodPath is the path of Slice.Pods[i] (nil when the slice has none).
func (s Slice) PodPath(i int) []string {
	if len(s.Paths) == 0 {
		return nil
	}
	return s.Paths[s.Pods[i].Path]
}

// JoinPath and SplitPath turn a path into store.Proof.Path and back:
// cluster IDs (RFC 1123 subdomains) joined by commas.
func JoinPath(path []string) string { return strings.Join(path, ",") }

func SplitPath(path string) []string {
	if path == "" {
		return nil
	}
	return strings.Split(path, ",")
}
