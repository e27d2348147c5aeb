package annotation

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// Heartbeats (docs/DESIGN.md#relay-hubs). A reader of an origin's own API
// server knows when it last heard from it; a reader of a relay hub knows only
// what the hub says. So that a hub cannot say an origin is in contact when
// it is not, the origin's annotator (--sign-endpoints) keeps a heartbeat: a
// statement of its cluster ID and the time, signed with its key, on the Lease
// HeartbeatLeaseNamespace/HeartbeatLeaseName, rewritten every interval. A hub
// copies the bytes unchanged; an edge takes the hub's word that the origin is
// in contact only while the hub holds a heartbeat that verifies and is
// recent. A hub can withhold heartbeats or present an older one (the origin
// then looks stale), not make a newer one.
const (
	HeartbeatAnnotation          = "multicluster.kubernetes.io/heartbeat"
	HeartbeatSignatureAnnotation = "multicluster.kubernetes.io/heartbeat-signature"

	// HeartbeatLeaseNamespace and HeartbeatLeaseName name the Lease that
	// carries an origin's heartbeat, beside the list of exporting namespaces
	// (a fixed place, so that a hub reading many clusters needs no setting
	// per cluster).
	HeartbeatLeaseNamespace = "kube-system"
	HeartbeatLeaseName      = "mcs-heartbeat"

	// HeartbeatSignatureContext starts the signed message of a heartbeat.
	HeartbeatSignatureContext = "mcsannotations heartbeat v1\n"

	// MaxHeartbeatBytes bounds a heartbeat's value.
	MaxHeartbeatBytes = 256
)

// Heartbeat is HeartbeatAnnotation's value, as JSON.
type Heartbeat struct {
	// Cluster is the origin's cluster ID.
	Cluster string `json:"cluster"`
	// Time is when the origin wrote it, in Unix milliseconds; the origin's
	// heartbeats have growing times (the last plus one when the clock is
	// not ahead of it).
	Time int64 `json:"time"`
}

// At is the heartbeat's time.
func (h Heartbeat) At() time.Time { return time.UnixMilli(h.Time) }

// FormatHeartbeat is a heartbeat's annotation value.
func FormatHeartbeat(h Heartbeat) string {
	b, _ := json.Marshal(h)
	return string(b)
}

// ParseHeartbeat reads a heartbeat and checks it: bounded, one JSON value
// with no unknown field, a valid cluster ID, a positive time.
func ParseHeartbeat(raw string) (Heartbeat, error) {
	var h Heartbeat
	if len(raw) > MaxHeartbeatBytes {
		return h, fmt.Errorf("heartbeat of %d bytes, over %d", len(raw), MaxHeartbeatBytes)
	}
	d := json.NewDecoder(strings.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&h); err != nil {
		return Heartbeat{}, fmt.Errorf("heartbeat: %s", Clip(err.Error()))
	}
	if _, err := d.Token(); err != io.EOF {
		return Heartbeat{}, fmt.Errorf("heartbeat: data after the value")
	}
	if !ValidClusterID(h.Cluster) {
		return Heartbeat{}, fmt.Errorf("heartbeat: cluster %q is not a cluster ID", Clip(h.Cluster))
	}
	if h.Time <= 0 {
		return Heartbeat{}, fmt.Errorf("heartbeat without time")
	}
	return h, nil
}

// HeartbeatSignedMessage is the message a heartbeat signature covers: the
// cluster ID and the heartbeat, each preceded by its length (as in
// SignedMessage), after HeartbeatSignatureContext, so that no export or
// endpoint signature is a heartbeat signature and no heartbeat signature
// is one of those.
func HeartbeatSignedMessage(cluster, heartbeat string) []byte {
	return signedMessage(HeartbeatSignatureContext, cluster, heartbeat)
}

// SignHeartbeat returns HeartbeatSignatureAnnotation's value for a heartbeat
// of cluster.
func SignHeartbeat(key ed25519.PrivateKey, cluster, heartbeat string) string {
	return signature(key, HeartbeatSignedMessage(cluster, heartbeat))
}

// VerifyHeartbeat checks a heartbeat of cluster and its signature and
// returns it parsed: signed with key over cluster and the bytes, well
// formed, and naming cluster. The Rejection says why it fails (Index -1).
func VerifyHeartbeat(key ed25519.PublicKey, sig, cluster, heartbeat string) (Heartbeat, Rejection, bool) {
	if heartbeat == "" {
		return Heartbeat{}, Rejection{-1, ReasonUnsigned, "no heartbeat"}, false
	}
	if len(heartbeat) > MaxHeartbeatBytes {
		// Refused before the signature is computed over it.
		return Heartbeat{}, Rejection{-1, ReasonSize, fmt.Sprintf("heartbeat of %d bytes, over %d", len(heartbeat), MaxHeartbeatBytes)}, false
	}
	if r, ok := verify(key, sig, HeartbeatSignedMessage(cluster, heartbeat),
		"no "+HeartbeatSignatureAnnotation+": the heartbeat is ignored",
		"heartbeat does not verify with cluster "+cluster+"'s key: it is ignored"); !ok {
		return Heartbeat{}, r, false
	}
	h, err := ParseHeartbeat(heartbeat)
	if err != nil {
		return Heartbeat{}, Rejection{-1, ReasonJSON, err.Error()}, false
	}
	if h.Cluster != cluster {
		return Heartbeat{}, Rejection{-1, ReasonClusterOutside, fmt.Sprintf("heartbeat of cluster %s where %s's was expected", h.Cluster, cluster)}, false
	}
	return h, Rejection{}, true
}
