package annotation

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Endpoint statements (docs/DESIGN.md#relay-hubs). The export signature
// covers what a Pod exports, not where it answers: its addresses and
// readiness come from Pod status, which a reader trusts because it reads the
// origin's own API server. A record relayed by a hub has no such backing, so
// the origin's annotator also states, on each exporting Pod, the addresses,
// hostname and readiness it saw (EndpointAnnotation), with a sequence number
// that only grows, and signs that statement together with the export
// annotation (EndpointSignatureAnnotation). A hub copies both; an edge
// verifies them with the origin's key, so that a hub can withhold or delay a
// record, but not forge one, alter it, move it to another namespace or replay
// an older one over a newer.
const (
	EndpointAnnotation          = "multicluster.kubernetes.io/endpoint"
	EndpointSignatureAnnotation = "multicluster.kubernetes.io/endpoint-signature"

	// EndpointSignatureContext starts the signed message of a statement.
	EndpointSignatureContext = "mcsannotations endpoint statement v1\n"

	// MaxEndpointBytes bounds a statement's value.
	MaxEndpointBytes = 1 << 10
)

// Endpoint is a Pod's endpoint statement: EndpointAnnotation's value, as JSON.
type Endpoint struct {
	// IPs are the Pod's addresses (status.podIPs), at most two.
	IPs []string `json:"ips,omitempty"`
	// Hostname is spec.hostname; empty means the dashed IP.
	Hostname string `json:"hostname,omitempty"`
	// Ready is the Pod's Ready condition (false once it terminates).
	Ready bool `json:"ready,omitempty"`
	// Seq orders the statements of one Pod: a later statement has a larger
	// Seq (the annotator uses the Unix time in milliseconds, or the last Seq
	// plus one when that is not larger).
	Seq uint64 `json:"seq"`
}

// FormatEndpoint is a statement's annotation value.
func FormatEndpoint(e Endpoint) string {
	b, _ := json.Marshal(e)
	return string(b)
}

// ParseEndpoint reads a statement and checks it: bounded, addresses that
// parse (no zone, at most two, no duplicate), a valid hostname when set, a
// non-zero Seq. The addresses come back parsed, in their order.
func ParseEndpoint(raw string) (Endpoint, []netip.Addr, error) {
	var e Endpoint
	if len(raw) > MaxEndpointBytes {
		return e, nil, fmt.Errorf("endpoint statement of %d bytes, over %d", len(raw), MaxEndpointBytes)
	}
	d := json.NewDecoder(strings.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&e); err != nil {
		return Endpoint{}, nil, fmt.Errorf("endpoint statement: %s", Clip(err.Error()))
	}
	// One value only: Decode alone would pass over what follows it.
	if _, err := d.Token(); err != io.EOF {
		return Endpoint{}, nil, fmt.Errorf("endpoint statement: data after the value")
	}
	if e.Seq == 0 {
		return Endpoint{}, nil, fmt.Errorf("endpoint statement without seq")
	}
	if len(e.IPs) > 2 {
		return Endpoint{}, nil, fmt.Errorf("endpoint statement with %d addresses, over 2", len(e.IPs))
	}
	if e.Hostname != "" && len(validation.IsDNS1123Label(e.Hostname)) > 0 {
		return Endpoint{}, nil, fmt.Errorf("endpoint statement: hostname %q is not a DNS label", Clip(e.Hostname))
	}
	ips := make([]netip.Addr, 0, len(e.IPs))
	for _, s := range e.IPs {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return Endpoint{}, nil, fmt.Errorf("endpoint statement: %q is not an address", Clip(s))
		}
		a = a.Unmap()
		for _, b := range ips {
			if a == b {
				return Endpoint{}, nil, fmt.Errorf("endpoint statement: %s twice", a)
			}
		}
		ips = append(ips, a)
	}
	return e, ips, nil
}

// EndpointSignedMessage is the message an endpoint signature covers: the
// cluster ID, the Pod's namespace, name and UID, the export annotation and
// the statement, each preceded by its length (as in SignedMessage).
func EndpointSignedMessage(cluster, namespace, name, uid, export, endpoint string) []byte {
	return signedMessage(EndpointSignatureContext, cluster, namespace, name, uid, export, endpoint)
}

// SignEndpoint returns EndpointSignatureAnnotation's value for a statement
// and the export annotation on the Pod namespace/name (uid) in cluster.
func SignEndpoint(key ed25519.PrivateKey, cluster, namespace, name, uid, export, endpoint string) string {
	return signature(key, EndpointSignedMessage(cluster, namespace, name, uid, export, endpoint))
}

// VerifyEndpoint checks an endpoint signature; the Rejection says why it
// fails (Index -1).
func VerifyEndpoint(key ed25519.PublicKey, sig, cluster, namespace, name, uid, export, endpoint string) (Rejection, bool) {
	return verify(key, sig, EndpointSignedMessage(cluster, namespace, name, uid, export, endpoint),
		"no "+EndpointSignatureAnnotation+": the endpoint is ignored",
		"endpoint statement does not verify with cluster "+cluster+"'s key: the endpoint is ignored")
}
