package store

import (
	"net/netip"
	"slices"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// Pod is the slim record of one exporting Pod: only what its readers need
// (the DNS index, the MCS controller, the snapshot). It is what sources
// produce, what the store keeps, and what the snapshot persists. A Pod is
// never modified once handed to the store. (It has no UID: no reader depends
// on it, and a record is small because the store holds one per endpoint: 72
// bytes (80 when allocated alone; the snapshot's PodDecoder cuts records from
// chunks), and its name and addresses. What a relay hub passes on of the
// origin Pod is in Common.Proof, on the hub only.)
type Pod struct {
	*Common               // shared with the other Pods of its service; never nil
	Name     string       `json:"n"`
	Hostname string       `json:"h,omitempty"` // spec.hostname; empty means the dashed IP
	IPs      []netip.Addr `json:"ips,omitempty"`
	Ready    bool         `json:"r,omitempty"`
}

// Common is what the Pods of one service in one cluster have in common: where
// they run and the exports their annotation names. Sources and the snapshot's
// decoder hand one Common to all the records that repeat it (records are
// immutable, so sharing is safe); in each record, the three fields took 56
// of its 120 bytes.
//
// A relay hub's sources (source.Options.KeepProof) give each record a Common
// of its own instead, carrying its Proof: on Common rather than Pod, the
// field keeps an edge's records in their size classes
// (TestProofCostsNoRecordBytes).
type Common struct {
	Cluster   string              `json:"c"`
	Namespace string              `json:"ns"`
	Exports   []annotation.Export `json:"e,omitempty"`
	// Proof is what a relay hub passes on of the origin Pod (nil unless the
	// source keeps it; never persisted by the snapshot).
	Proof *Proof `json:"-"`
}

// Proof is the origin's own bytes behind a record, which a relay hub copies
// into its EndpointSlices (internal/relay) so that a reader can check them
// with the origin's key.
type Proof struct {
	UID string
	// Export is the raw export annotation (annotation.ExportAnnotation), one
	// string shared by the Pods of a service that carry the same bytes.
	Export string
	// Endpoint and EndpointSignature are the Pod's endpoint statement and its
	// signature (annotation.EndpointAnnotation, EndpointSignatureAnnotation);
	// empty when the origin states none.
	Endpoint, EndpointSignature string
	// Path is the relay path of a record read through hubs (relay.Slice's
	// Paths, the hubs' cluster IDs joined by commas), empty for one read
	// from its origin.
	Path string
}

// Equal reports whether two proofs carry the same bytes (nil equals nil only).
func (p *Proof) Equal(o *Proof) bool {
	if p == nil || o == nil {
		return p == o
	}
	return *p == *o
}

// Key identifies a Pod across every source.
type Key struct{ Cluster, Namespace, Name string }

// Key returns the Pod's key.
func (p *Pod) Key() Key { return Key{p.Cluster, p.Namespace, p.Name} }

// Equal reports whether two records carry the same data.
func (p *Pod) Equal(o *Pod) bool {
	if p == nil || o == nil {
		return p == o
	}
	if p.Name != o.Name || p.Hostname != o.Hostname || p.Ready != o.Ready || !slices.Equal(p.IPs, o.IPs) {
		return false
	}
	return p.Common.Equal(o.Common)
}

// Equal reports whether two Commons carry the same data.
func (c *Common) Equal(o *Common) bool {
	if c == o {
		return true
	}
	if c == nil || o == nil || c.Cluster != o.Cluster || c.Namespace != o.Namespace || len(c.Exports) != len(o.Exports) || !c.Proof.Equal(o.Proof) {
		return false
	}
	for i := range c.Exports {
		a, b := c.Exports[i], o.Exports[i]
		if a.Name != b.Name || a.Namespace != b.Namespace || a.Cluster != b.Cluster || !slices.Equal(a.Ports, b.Ports) ||
			!slices.Equal(a.Allowed, b.Allowed) || !a.Service.Equal(&b.Service) {
			return false
		}
	}
	return true
}

// EndpointHostname is the Pod's endpoint hostname: spec.hostname when set,
// else its primary IP with dots (or colons) replaced by dashes, as CoreDNS's
// kubernetes plugin names endpoints. It is the first label of the endpoint's
// DNS name and the hostname of its EndpointSlice endpoint.
func (p *Pod) EndpointHostname() string {
	if p.Hostname != "" {
		return p.Hostname
	}
	if len(p.IPs) == 0 {
		return ""
	}
	return DashedIP(p.IPs[0])
}

// DashedIP renders an address as a DNS label: 10.244.0.5 -> 10-244-0-5,
// fd00::5 -> fd00--5 (a trailing dash gets a 0 so the label stays valid).
func DashedIP(a netip.Addr) string {
	var buf [64]byte
	return string(AppendDashedIP(buf[:0], a))
}

// AppendDashedIP appends DashedIP(a) to b (without allocating when b has
// room: a caller can build the label on its stack).
func AppendDashedIP(b []byte, a netip.Addr) []byte {
	a = a.Unmap().WithZone("")
	start := len(b)
	if a.Is6() {
		b = append(b, '0') // dropped below unless the address starts with "::"
	}
	at := len(b)
	b = a.AppendTo(b)
	for i := at; i < len(b); i++ {
		if b[i] == '.' || b[i] == ':' {
			b[i] = '-'
		}
	}
	if a.Is6() {
		if b[at] != '-' {
			b = append(b[:start], b[at:]...)
		}
		if b[len(b)-1] == '-' {
			b = append(b, '0')
		}
	}
	return b
}
