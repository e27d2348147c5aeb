// Package clustersetip holds the types of what the local cluster's
// ServiceImports say about ClusterSetIP services, shared by the DNS table
// (internal/table, which re-exports them) and the snapshot
// (internal/snapshot), so that the snapshot, which the MCS controller uses
// too, does not depend on the DNS table.
package clustersetip

import "net/netip"

// ClusterSetIP is what an MCS ServiceImport of type ClusterSetIP in the local
// cluster says about a service: its cluster-set virtual IPs and its ports.
// While a service has one, its name answers with these IPs instead of its
// endpoints (KEP-1645 DNS specification 1.0.0, ClusterSetIP services).
type ClusterSetIP struct {
	Namespace, Name string
	IPs             []netip.Addr // an entry without any is ignored
	Ports           []ImportPort
}

// ImportPort is one port of a ClusterSetIP service.
type ImportPort struct {
	Name     string // SRV names need one; unnamed ports make no SRV record
	Protocol string // TCP, UDP or SCTP
	Port     uint16
}

// ImportState says whether ServiceImports are read in the local cluster:
// whether an MCS controller is expected to allocate the ClusterSetIPs of the
// services exported as ClusterSetIP.
type ImportState uint8

// The import states.
const (
	// ImportsUnknown: not known yet (no word from the API server since
	// start, and none in the snapshot). Answered as ImportsServed: a
	// ClusterSetIP service never answers its endpoints where a controller
	// may run.
	ImportsUnknown ImportState = iota
	// ImportsServed: the API server serves ServiceImports.
	ImportsServed
	// ImportsAbsent: it serves none, so no MCS controller runs in the
	// cluster: ClusterSetIP services answer their endpoints' addresses.
	ImportsAbsent
)

func (s ImportState) String() string {
	switch s {
	case ImportsServed:
		return "served"
	case ImportsAbsent:
		return "absent"
	}
	return "unknown"
}
