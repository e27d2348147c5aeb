package annotation

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Service is what an export entry says of the exported Service beyond its
// name and ports: what every cluster's MCS controller needs to build the
// ServiceImport (KEP-1645) from the annotations alone, also while the
// exporting cluster is unreachable. Every field is optional, so entries
// written before these fields existed still read (with the defaults below),
// and readers that predate them ignore them. The signature covers them: it
// covers the annotation's bytes.
type Service struct {
	// Type is ClusterSetIP (the Service has a cluster IP) or Headless.
	// Absent: Headless, which is how entries without it were always answered.
	Type string `json:"type,omitempty"`
	// ExportedAt is when the export began, RFC 3339: the oldest export wins a
	// conflict between clusters. Absent: unknown, older than any time, so that
	// ties go to the cluster ID.
	ExportedAt string `json:"exportedAt,omitempty"`
	// SessionAffinity is ClientIP or None (absent: None), with its timeout.
	SessionAffinity               string `json:"sessionAffinity,omitempty"`
	SessionAffinityTimeoutSeconds int32  `json:"sessionAffinityTimeoutSeconds,omitempty"`
	// InternalTrafficPolicy is Cluster or Local (absent: Cluster).
	InternalTrafficPolicy string `json:"internalTrafficPolicy,omitempty"`
	// TrafficDistribution is the Service's spec.trafficDistribution.
	TrafficDistribution string `json:"trafficDistribution,omitempty"`
	// Labels and Annotations are the ServiceExport's exportedLabels and
	// exportedAnnotations, for the ServiceImport.
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// StaleEndpoints is what consumers do with the service's endpoints in a
	// cluster they cannot reach (StaleEndpointsAnnotation): StaleServe
	// (absent), StaleDrop or StaleDropIfLocal, after StaleGraceSeconds out
	// of contact (0-MaxStaleGrace; only with a drop policy).
	StaleEndpoints    string `json:"staleEndpoints,omitempty"`
	StaleGraceSeconds int32  `json:"staleGraceSeconds,omitempty"`
	// IPFamilies is the Service's spec.ipFamilies (IPv4, IPv6; at most two,
	// no duplicate), for a Headless ServiceImport's, which has no derived
	// Service to take them from. Absent: unknown (readers then take the
	// families of the endpoints' addresses).
	IPFamilies IPFamilies `json:"ipFamilies,omitempty"`
}

// IPFamilies is a list of IP families in order, kept in one byte (two bits
// per family), so that the field costs an export entry nothing: it fits the
// padding after StaleGraceSeconds, where a slice would move Export to a
// larger size class, and every record of an exporting Pod holds its
// entries (TestIPFamiliesCostNothing). In JSON it is a list, as in the Service
// API. A list that is not valid (over two, an unknown family, one twice)
// is kept as such, for the parser to refuse with the reason.
type IPFamilies uint8

const (
	familyBits    = 2
	familyMask    = 1<<familyBits - 1
	familyIPv4    = 1
	familyIPv6    = 2
	familyInvalid = 0x80 // with the problem's index in the low bits
)

var familyProblems = [...]string{"", "more than 2 families", "a family is not IPv4 or IPv6", "a family is given twice"}

// NewIPFamilies returns the families in order.
func NewIPFamilies(families ...string) IPFamilies {
	if len(families) > 2 {
		return familyInvalid | 1
	}
	var f IPFamilies
	for i, name := range families {
		var v IPFamilies
		switch name {
		case IPv4:
			v = familyIPv4
		case IPv6:
			v = familyIPv6
		default:
			return familyInvalid | 2
		}
		if i == 1 && f&familyMask == v {
			return familyInvalid | 3
		}
		f |= v << (familyBits * i)
	}
	return f
}

// List returns the families in order (nil when none, or not valid).
func (f IPFamilies) List() []string {
	if f&familyInvalid != 0 {
		return nil
	}
	var out []string
	for i := range 2 {
		switch f >> (familyBits * i) & familyMask {
		case familyIPv4:
			out = append(out, IPv4)
		case familyIPv6:
			out = append(out, IPv6)
		}
	}
	return out
}

// problem says what is wrong with the list; "" when nothing.
func (f IPFamilies) problem() string {
	if f&familyInvalid == 0 {
		return ""
	}
	return familyProblems[f&^familyInvalid]
}

// MarshalJSON writes the list.
func (f IPFamilies) MarshalJSON() ([]byte, error) { return json.Marshal(f.List()) }

// UnmarshalJSON reads a list of strings.
func (f *IPFamilies) UnmarshalJSON(b []byte) error {
	var l []string
	if err := json.Unmarshal(b, &l); err != nil {
		return err
	}
	*f = NewIPFamilies(l...)
	return nil
}

// The values of Service.Type.
const (
	TypeClusterSetIP = "ClusterSetIP"
	TypeHeadless     = "Headless"
)

// The values of Service.IPFamilies (the Service API's IPFamily).
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// MaxAffinityTimeout is the Service API's limit on sessionAffinityConfig's
// timeoutSeconds (one day).
const MaxAffinityTimeout = 86400

// ServiceType returns the entry's type with its default.
func (s *Service) ServiceType() string {
	if s.Type == "" {
		return TypeHeadless
	}
	return s.Type
}

// CompareAge orders two exports of one service by KEP-1645's conflict
// resolution: the one exported first (at; the zero time, unknown, is older
// than any) wins, and on a tie the lower cluster ID. Negative when a wins.
func CompareAge(aAt time.Time, aCluster string, bAt time.Time, bCluster string) int {
	return cmp.Or(aAt.Compare(bAt), cmp.Compare(aCluster, bCluster))
}

// Exported returns ExportedAt as a time; the zero time when absent.
func (s *Service) Exported() time.Time {
	if s.ExportedAt == "" { // entries written before the field; time.Parse's error would allocate
		return time.Time{}
	}
	t, _ := time.Parse(time.RFC3339, s.ExportedAt)
	return t
}

// checkServiceFields validates what an entry says of its Service, as the
// Service and ServiceExport APIs would.
func checkServiceFields(s *Service) (Rejection, bool) {
	bad := func(format string, a ...any) (Rejection, bool) {
		return Rejection{Reason: ReasonService, Detail: fmt.Sprintf(format, a...)}, true
	}
	switch s.Type {
	case "", TypeClusterSetIP, TypeHeadless:
	default:
		return bad("type %q: must be %s or %s", Clip(s.Type), TypeClusterSetIP, TypeHeadless)
	}
	if s.ExportedAt != "" {
		if _, err := time.Parse(time.RFC3339, s.ExportedAt); err != nil {
			return bad("exportedAt %q: not an RFC 3339 time", Clip(s.ExportedAt))
		}
	}
	switch s.SessionAffinity {
	case "", "None", "ClientIP":
	default:
		return bad("sessionAffinity %q: must be None or ClientIP", Clip(s.SessionAffinity))
	}
	if t := s.SessionAffinityTimeoutSeconds; t < 0 || t > MaxAffinityTimeout || (t != 0 && s.SessionAffinity != "ClientIP") {
		return bad("sessionAffinityTimeoutSeconds %d: must be 1-%d, with sessionAffinity ClientIP", t, MaxAffinityTimeout)
	}
	switch s.InternalTrafficPolicy {
	case "", "Cluster", "Local":
	default:
		return bad("internalTrafficPolicy %q: must be Cluster or Local", Clip(s.InternalTrafficPolicy))
	}
	if d := s.TrafficDistribution; d != "" {
		if errs := validation.IsQualifiedName(d); len(errs) > 0 {
			return bad("trafficDistribution %q: %s", Clip(d), strings.Join(errs, "; "))
		}
	}
	if p := s.IPFamilies.problem(); p != "" {
		return bad("ipFamilies: %s", p)
	}
	if detail, bad := checkStale(s); bad {
		return Rejection{Reason: ReasonService, Detail: detail}, true
	}
	for k, v := range s.Labels {
		if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
			return bad("label %q: %s", Clip(k), strings.Join(errs, "; "))
		}
	}
	for k := range s.Annotations {
		if errs := validation.IsQualifiedName(strings.ToLower(k)); len(errs) > 0 {
			return bad("annotation %q: %s", Clip(k), strings.Join(errs, "; "))
		}
	}
	return Rejection{}, false
}

// Equal reports whether two entries say the same of their Service.
func (s *Service) Equal(o *Service) bool {
	return s.Type == o.Type && s.ExportedAt == o.ExportedAt && s.SessionAffinity == o.SessionAffinity &&
		s.SessionAffinityTimeoutSeconds == o.SessionAffinityTimeoutSeconds &&
		s.InternalTrafficPolicy == o.InternalTrafficPolicy && s.TrafficDistribution == o.TrafficDistribution &&
		maps.Equal(s.Labels, o.Labels) && maps.Equal(s.Annotations, o.Annotations) &&
		s.StaleEndpoints == o.StaleEndpoints && s.StaleGraceSeconds == o.StaleGraceSeconds &&
		s.IPFamilies == o.IPFamilies
}
