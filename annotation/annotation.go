// Package annotation parses and validates the Pod metadata that carries
// multi-cluster service membership: the export-services annotation on backing
// Pods and the import-services annotation on consumer Pods
// (docs/DESIGN.md#wire-format).
//
// # Access decided by the exporter
//
// An export entry may carry "allowedNamespaces": the other namespaces whose
// Pods may resolve the service under the plugin's `imports enforce`, each a
// namespace name, or "*" for every namespace. The Pods of the service's own
// namespace may always resolve it; an entry without the field (as older
// annotators write it) allows its own namespace only. The annotator copies the
// list from AllowedNamespacesAnnotation on the exported Service or its
// ServiceExport (comma-separated, the ServiceExport's when both have it), and
// the signature covers it with the rest of the annotation's bytes. A service
// backed by several Pods (or clusters) allows what every one of its entries
// allows. An import annotation never grants access: it only names aliases.
//
// It has no CoreDNS dependency: the plugin, the sources and the annotator all
// share it. Parsing never fails as a whole because of one bad entry: every
// entry is decoded and validated on its own, good entries are returned, and
// each bad one comes back as a Rejection with a Reason.
package annotation

import "strconv"

// Names of the Pod metadata this project reads and writes.
const (
	ExportAnnotation    = "multicluster.kubernetes.io/export-services"
	ImportAnnotation    = "multicluster.kubernetes.io/import-services"
	SignatureAnnotation = "multicluster.kubernetes.io/export-signature"

	// ExportServiceAnnotation on a Service, with the value "true", asks the
	// annotator to export it (as a ServiceExport of the same name does).
	ExportServiceAnnotation = "multicluster.kubernetes.io/export"

	// AllowedNamespacesAnnotation on an exported Service or its ServiceExport
	// names the other namespaces that may import it: "ns1,ns2", or "*".
	AllowedNamespacesAnnotation = "multicluster.kubernetes.io/allowed-namespaces"

	// AllNamespaces in an allowed list allows every namespace.
	AllNamespaces = "*"

	// ExporterLabel and ImporterLabel mark Pods that carry the annotations, so
	// that watches are filtered on the API server.
	ExporterLabel = "multicluster.kubernetes.io/exporter"
	ImporterLabel = "multicluster.kubernetes.io/importer"
	LabelValue    = "true"
)

// Limits on what one annotation may carry. They bound the work and memory one
// hostile Pod can cause; Kubernetes itself allows 256 KiB of annotations.
const (
	MaxBytes          = 32 << 10 // an annotation value larger than this is rejected whole
	MaxServices       = 64       // entries in one annotation
	MaxPortsPerExport = 64
	MaxClusterIDLen   = 127 // "cluster: subdomain < 128 chars"
	MaxAllowed        = 64  // allowed namespaces in one entry
)

// Protocols a port may name.
const (
	TCP  = "TCP"
	UDP  = "UDP"
	SCTP = "SCTP"
)

// Port is one port of an exported service.
type Port struct {
	Name       string `json:"name,omitempty"`
	Port       int32  `json:"port"`
	TargetPort int32  `json:"targetPort"`
	Protocol   string `json:"protocol"`
	// AppProtocol is the Service port's appProtocol, for the ServiceImport.
	AppProtocol string `json:"appProtocol,omitempty"`
}

// Export is one validated entry of the export-services annotation, with the
// defaults of docs/DESIGN.md#wire-format applied.
type Export struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Cluster   string `json:"cluster"`
	Ports     []Port `json:"ports,omitempty"`
	Service          // what the entry says of the exported Service (service.go)
	// Allowed lists the other namespaces allowed to import the service,
	// sorted, without duplicates, or just AllNamespaces; nil: its own
	// namespace only (see the package documentation).
	Allowed []string `json:"allowedNamespaces,omitempty"`
}

// Allows reports whether the entry lets Pods of namespace resolve it.
func (e *Export) Allows(namespace string) bool {
	if namespace == e.Namespace {
		return true
	}
	for _, a := range e.Allowed {
		if a == namespace || a == AllNamespaces {
			return true
		}
	}
	return false
}

// Import is one validated entry of the import-services annotation. An empty
// Cluster means any cluster; an empty Alias means no alias name.
type Import struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Cluster   string `json:"cluster,omitempty"`
	Alias     string `json:"alias,omitempty"`
}

// Reason says why an entry (or the whole annotation) was rejected. The values
// are stable: they are metric label values.
type Reason string

// The rejection reasons.
const (
	ReasonSize             Reason = "size"              // annotation larger than MaxBytes
	ReasonJSON             Reason = "json"              // not the expected JSON shape
	ReasonTooMany          Reason = "too_many"          // more than MaxServices entries or MaxPortsPerExport ports
	ReasonName             Reason = "invalid_name"      // service name or alias not an RFC 1123 label
	ReasonNamespace        Reason = "invalid_namespace" // namespace not an RFC 1123 label
	ReasonCluster          Reason = "invalid_cluster"   // cluster not an RFC 1123 subdomain < 128 chars
	ReasonPort             Reason = "invalid_port"      // port or targetPort outside 1-65535, or a bad appProtocol
	ReasonPortName         Reason = "invalid_port_name" // a port name that is no IANA service name: the name is dropped, the entry kept (Rejection.Kept)
	ReasonProtocol         Reason = "invalid_protocol"  // not TCP, UDP or SCTP
	ReasonDuplicate        Reason = "duplicate"         // same service (or port) listed twice
	ReasonNamespaceOutside Reason = "namespace_mismatch"
	ReasonClusterOutside   Reason = "cluster_mismatch"
	ReasonUnsigned         Reason = "unsigned"        // no signature where `verify` requires one (sign.go)
	ReasonBadSignature     Reason = "bad_signature"   // a signature that does not verify with the cluster's key
	ReasonService          Reason = "invalid_service" // a Service field (type, affinity, labels, ...) the API would refuse (service.go)
)

// Reasons lists every Reason, for pre-registering metric label values.
var Reasons = []Reason{
	ReasonSize, ReasonJSON, ReasonTooMany, ReasonName, ReasonNamespace, ReasonCluster,
	ReasonPort, ReasonPortName, ReasonProtocol, ReasonDuplicate, ReasonNamespaceOutside, ReasonClusterOutside,
	ReasonUnsigned, ReasonBadSignature, ReasonService,
}

// Rejection describes one entry that was skipped, or the part of an entry
// that was dropped (Kept). Index is the entry's position in the "services"
// list, or -1 when the annotation as a whole was rejected.
type Rejection struct {
	Index  int
	Reason Reason
	Detail string
}

// Kept reports whether the entry was kept despite the rejection (only a
// part of it, a port name, was dropped).
func (r Rejection) Kept() bool { return r.Reason == ReasonPortName }

func (r Rejection) String() string {
	if r.Index < 0 {
		return string(r.Reason) + ": " + r.Detail
	}
	return "entry " + strconv.Itoa(r.Index) + ": " + string(r.Reason) + ": " + r.Detail
}
