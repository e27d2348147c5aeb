package clusterset

import (
	"cmp"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// ManagedBy is the endpointslice.kubernetes.io/managed-by value of the
// EndpointSlices the controller writes (the default EndpointSlice controller
// leaves slices managed by others alone), and the value of LabelManagedBy on
// the derived Services.
const ManagedBy = "mcs-controller.mcsannotations.io"

// LabelManagedBy marks the derived Services, so that the controller never
// takes over or deletes a Service it did not make.
const LabelManagedBy = "app.kubernetes.io/managed-by"

// MaxEndpointsPerSlice is the default EndpointSlice controller's limit.
const MaxEndpointsPerSlice = 100

// EndpointPort is a port of an endpoint: the service port's name and
// protocol with the port the endpoint listens on (the targetPort).
type EndpointPort struct {
	Name        string
	Protocol    corev1.Protocol
	Port        int32
	AppProtocol *string
}

// Endpoint is one backing Pod of a service in one cluster.
type Endpoint struct {
	// Addresses are the Pod's IPs (at most one of each family is used).
	Addresses []netip.Addr
	// Hostname is the Pod's DNS label within the service (spec.hostname,
	// else the dashed IP), as the DNS answers name it.
	Hostname                    string
	Ready, Serving, Terminating bool
	Ports                       []EndpointPort
}

// DerivedServiceName is the name of the Service whose ClusterIPs are a
// ClusterSetIP service's ClusterSetIPs: distinct from the exported service's
// own name, which the exporting cluster uses for its local Service. It ends
// in 65 bits of the SHA-256 of the whole service name, so two services of a
// namespace do not get one derived name however alike their names are, and
// starts with a letter as a Service name must (a service name may start with
// a digit: "1web" gives "s1web-mcs-...").
func DerivedServiceName(service string) string {
	head := trunc(service, 45)
	if head == "" || head[0] < 'a' || head[0] > 'z' {
		head = "s" + trunc(service, 44)
	}
	return head + "-mcs-" + hash(service)
}

// DerivedService is the Service the controller creates for a ClusterSetIP
// import: selector-less (the controller's EndpointSlices fill it), of type
// ClusterIP, dual-stack where the cluster is, owned by the ServiceImport.
func DerivedService(key Key, im *Import, owner metav1.OwnerReference) *corev1.Service {
	svc := &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       key.Namespace,
			Name:            DerivedServiceName(key.Name),
			Labels:          map[string]string{LabelManagedBy: ManagedBy, mcsv1beta1.LabelServiceName: key.Name},
			OwnerReferences: []metav1.OwnerReference{owner},
		},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeClusterIP,
			IPFamilyPolicy:        ptr.To(corev1.IPFamilyPolicyPreferDualStack),
			SessionAffinity:       im.Spec.SessionAffinity,
			SessionAffinityConfig: im.Spec.SessionAffinityConfig.DeepCopy(),
			InternalTrafficPolicy: im.Spec.InternalTrafficPolicy,
			TrafficDistribution:   im.Spec.TrafficDistribution,
		},
	}
	for _, p := range im.Spec.Ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: p.Name, Protocol: p.Protocol, Port: p.Port, AppProtocol: p.AppProtocol,
		})
	}
	return svc
}

// Slices returns the EndpointSlices that carry the endpoints a cluster
// exports for a service: one slice per address family and set of ports, of
// at most MaxEndpointsPerSlice endpoints each, with stable names so that a
// change rewrites only the slices it touches. derived is the derived
// Service's name ("" for a headless import: its slices are for DNS, not for
// a datapath). The ports of each slice are those of its endpoints whose name
// and protocol the import's ports have (a conflicting port is not imported).
func Slices(key Key, cluster, derived string, im *Import, eps []Endpoint, owner metav1.OwnerReference) []*discoveryv1.EndpointSlice {
	return LimitedSlices(key, cluster, derived, im, eps, owner, SliceLimit{})
}

// SliceLimit bounds the slices of LimitedSlices.
type SliceLimit struct {
	// Max is the most endpoints of a slice (0: MaxEndpointsPerSlice).
	Max int
	// Fits, when set, says whether endpoints (of one address family and
	// set of ports, sorted) may be one slice: a run that does not fit is
	// halved until it does, or is a single endpoint.
	Fits func([]discoveryv1.Endpoint) bool
}

// RelayEndpointsPerSlice is the Max of a relay hub's slices. Each endpoint
// there also carries its origin Pod's relayed bytes (name, UID, statement
// and signature), and an EndpointSlice is re-sent whole on each change of
// any endpoint: a fifth of the usual 100 cuts what a change costs a reader
// of the hub, while the fixed part of a slice stays a modest share of a
// full list.
const RelayEndpointsPerSlice = 20

// LimitedSlices is Slices with slices bounded by limit.
func LimitedSlices(key Key, cluster, derived string, im *Import, eps []Endpoint, owner metav1.OwnerReference, limit SliceLimit) []*discoveryv1.EndpointSlice {
	if limit.Max <= 0 {
		limit.Max = MaxEndpointsPerSlice
	}
	type group struct {
		family discoveryv1.AddressType
		ports  []discoveryv1.EndpointPort
		eps    []discoveryv1.Endpoint
	}
	groups := map[string]*group{}
	for _, ep := range eps {
		ports := slicePorts(ep.Ports, im)
		pk := portsKey(ports)
		seen := map[discoveryv1.AddressType]bool{}
		for _, a := range ep.Addresses {
			family := discoveryv1.AddressTypeIPv4
			if a.Is6() && !a.Is4In6() {
				family = discoveryv1.AddressTypeIPv6
			}
			if seen[family] || AddressProblem(a) != "" {
				continue
			}
			seen[family] = true
			gk := string(family) + "/" + pk
			g := groups[gk]
			if g == nil {
				g = &group{family: family, ports: ports}
				groups[gk] = g
			}
			e := discoveryv1.Endpoint{
				Addresses: []string{a.Unmap().String()},
				Conditions: discoveryv1.EndpointConditions{
					Ready: ptr.To(ep.Ready), Serving: ptr.To(ep.Serving), Terminating: ptr.To(ep.Terminating),
				},
			}
			if ep.Hostname != "" && hostnameOK(ep.Hostname) {
				e.Hostname = ptr.To(ep.Hostname)
			}
			g.eps = append(g.eps, e)
		}
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []*discoveryv1.EndpointSlice
	for _, gk := range keys {
		g := groups[gk]
		slices.SortFunc(g.eps, func(a, b discoveryv1.Endpoint) int { return cmp.Compare(a.Addresses[0], b.Addresses[0]) })
		for i, n := 0, 0; i < len(g.eps); n++ {
			run := g.eps[i:min(i+limit.Max, len(g.eps))]
			for limit.Fits != nil && len(run) > 1 && !limit.Fits(run) {
				run = run[:len(run)/2]
			}
			s := &discoveryv1.EndpointSlice{
				TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
				ObjectMeta: metav1.ObjectMeta{
					Namespace:       key.Namespace,
					Name:            sliceName(key, cluster, gk, n),
					Labels:          SliceLabels(key, cluster, derived),
					OwnerReferences: []metav1.OwnerReference{owner},
				},
				AddressType: g.family,
				Endpoints:   run,
				Ports:       g.ports,
			}
			out = append(out, s)
			i += len(run)
		}
	}
	return out
}

// Families are the IP families of the endpoint addresses that Slices
// writes, with those of have (the address types of slices kept as they
// are), IPv4 first: a Headless import's spec.ipFamilies, which has no
// derived Service to take them from.
func Families(eps []Endpoint, have ...discoveryv1.AddressType) []corev1.IPFamily {
	v4, v6 := false, false
	for _, t := range have {
		v4, v6 = v4 || t == discoveryv1.AddressTypeIPv4, v6 || t == discoveryv1.AddressTypeIPv6
	}
	for _, ep := range eps {
		for _, a := range ep.Addresses {
			if AddressProblem(a) != "" {
				continue
			}
			if a.Is6() && !a.Is4In6() {
				v6 = true
			} else {
				v4 = true
			}
		}
	}
	var out []corev1.IPFamily
	if v4 {
		out = append(out, corev1.IPv4Protocol)
	}
	if v6 {
		out = append(out, corev1.IPv6Protocol)
	}
	return out
}

// sliceName is the name of the n-th slice of a service's endpoints from one
// cluster with one address family and set of ports (group): the whole
// service name (an EndpointSlice's name may have 253 characters) and 65 bits
// of the hash of the service, cluster and group.
func sliceName(key Key, cluster, group string, n int) string {
	return fmt.Sprintf("%s-%s-%d", key.Name, hash(key.Namespace+"/"+key.Name+"/"+cluster+"/"+group), n)
}

// SliceLabels are the labels of the EndpointSlices of a service from one
// cluster: the MCS labels, the managed-by that keeps the default controller
// away, and the derived Service's name so that the datapath uses them.
func SliceLabels(key Key, cluster, derived string) map[string]string {
	l := map[string]string{
		mcsv1beta1.LabelServiceName:   key.Name,
		mcsv1beta1.LabelSourceCluster: cluster,
		discoveryv1.LabelManagedBy:    ManagedBy,
	}
	if derived != "" {
		l[discoveryv1.LabelServiceName] = derived
	}
	return l
}

// slicePorts keeps the endpoint's ports that the import has (by name and
// protocol), sorted by name.
func slicePorts(eps []EndpointPort, im *Import) []discoveryv1.EndpointPort {
	var out []discoveryv1.EndpointPort
	for _, p := range eps {
		proto := protocol(p.Protocol)
		if !slices.ContainsFunc(im.Spec.Ports, func(ip mcsv1beta1.ServicePort) bool {
			return ip.Name == p.Name && ip.Protocol == proto
		}) {
			continue
		}
		out = append(out, discoveryv1.EndpointPort{
			Name: ptr.To(p.Name), Protocol: ptr.To(proto), Port: ptr.To(p.Port), AppProtocol: p.AppProtocol,
		})
	}
	slices.SortFunc(out, func(a, b discoveryv1.EndpointPort) int { return cmp.Compare(*a.Name, *b.Name) })
	return out
}

func portsKey(ps []discoveryv1.EndpointPort) string {
	var b []byte
	for _, p := range ps {
		b = append(b, *p.Name...)
		b = append(b, ':')
		b = append(b, *p.Protocol...)
		b = append(b, ':')
		b = strconv.AppendInt(b, int64(*p.Port), 10)
		b = append(b, ',')
	}
	return string(b)
}

// hashEncoding is base32 in lower case, without padding: a DNS label's letters and digits.
var hashEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// hash is the first 65 bits of the SHA-256 of s, in 13 base32 characters:
// two of the names built from it do not collide in practice (a birthday
// collision needs about 2^32 names).
func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hashEncoding.EncodeToString(sum[:])[:13]
}

// AddressProblem says why an endpoint address is one the API server refuses
// in an EndpointSlice (unspecified, loopback, link-local; the same rules as
// its ValidateEndpointIP) or that no service has any business sending
// traffic to (any multicast); "" for a good one.
func AddressProblem(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return "invalid"
	case a.Zone() != "":
		return "zoned"
	case a.IsUnspecified():
		return "unspecified"
	case a.IsLoopback():
		return "loopback"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsMulticast():
		return "multicast"
	}
	return ""
}

// hostnameOK says whether an endpoint's hostname is one an EndpointSlice may carry.
func hostnameOK(h string) bool {
	return len(validation.IsDNS1123Label(h)) == 0
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
