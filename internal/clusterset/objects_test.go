package clusterset

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

var owner = metav1.OwnerReference{APIVersion: "multicluster.x-k8s.io/v1beta1", Kind: "ServiceImport", Name: "backend", UID: "u1"}

func endpoint(ip string, ready bool, ports ...EndpointPort) Endpoint {
	var addrs []netip.Addr
	for _, s := range strings.Split(ip, ",") {
		addrs = append(addrs, netip.MustParseAddr(s))
	}
	// The hostname is the first address dashed, as the table gives it.
	host := strings.NewReplacer(".", "-", ":", "-").Replace(strings.Split(ip, ",")[0])
	return Endpoint{Addresses: addrs, Hostname: host, Ready: ready, Serving: ready, Ports: ports}
}

func TestDerivedServiceName(t *testing.T) {
	for _, svc := range []string{"backend", strings.Repeat("a", 63), "a-" + strings.Repeat("b", 60)} {
		name := DerivedServiceName(svc)
		if errs := validation.IsDNS1035Label(name); len(errs) > 0 {
			t.Errorf("DerivedServiceName(%q) = %q: %v", svc, name, errs)
		}
		if name == svc {
			t.Errorf("DerivedServiceName(%q) is the service's own name", svc)
		}
		if DerivedServiceName(svc) != name {
			t.Errorf("DerivedServiceName(%q) is not stable", svc)
		}
	}
	if DerivedServiceName(strings.Repeat("a", 60)+"x") == DerivedServiceName(strings.Repeat("a", 60)+"y") {
		t.Errorf("names that differ past the truncation give one derived name")
	}
}

func TestDerivedService(t *testing.T) {
	im := Merge([]Export{{Cluster: "a", Type: mcsv1beta1.ClusterSetIP, SessionAffinity: corev1.ServiceAffinityClientIP,
		Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80}, {Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}}})
	svc := DerivedService(Key{"ns", "backend"}, &im, owner)
	if svc.Namespace != "ns" || svc.Name != DerivedServiceName("backend") {
		t.Errorf("name %s/%s", svc.Namespace, svc.Name)
	}
	if svc.Spec.Selector != nil || svc.Spec.Type != corev1.ServiceTypeClusterIP || svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		t.Errorf("spec %+v", svc.Spec)
	}
	if len(svc.Spec.Ports) != 2 || svc.Spec.Ports[0].Name != "dns" || svc.Spec.Ports[0].Protocol != corev1.ProtocolUDP || svc.Spec.Ports[1].Protocol != corev1.ProtocolTCP {
		t.Errorf("ports %+v", svc.Spec.Ports)
	}
	if svc.Labels[LabelManagedBy] != ManagedBy || svc.OwnerReferences[0].UID != "u1" {
		t.Errorf("labels %v owners %v", svc.Labels, svc.OwnerReferences)
	}
}

func TestSlices(t *testing.T) {
	http := EndpointPort{Name: "http", Port: 8080}
	im := Merge([]Export{{Cluster: "a", Type: mcsv1beta1.ClusterSetIP, Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80}}}})
	key := Key{"ns", "backend"}
	eps := []Endpoint{
		endpoint("10.0.0.2", true, http),
		endpoint("10.0.0.1,fd00::1", false, http, EndpointPort{Name: "metrics", Port: 9090}), // metrics is not imported
		endpoint("10.0.0.3", true, EndpointPort{Name: "http", Port: 8081}),                   // another targetPort
	}
	got := Slices(key, "edge-b", "backend-mcs-x", &im, eps, owner)
	// IPv4 with 8080, IPv4 with 8081, IPv6 with 8080.
	if len(got) != 3 {
		t.Fatalf("%d slices, want 3: %+v", len(got), got)
	}
	seen := map[string]bool{}
	for _, s := range got {
		if seen[s.Name] {
			t.Errorf("two slices named %s", s.Name)
		}
		seen[s.Name] = true
		if errs := validation.IsDNS1123Subdomain(s.Name); len(errs) > 0 {
			t.Errorf("slice name %q: %v", s.Name, errs)
		}
		l := s.Labels
		if l[mcsv1beta1.LabelServiceName] != "backend" || l[mcsv1beta1.LabelSourceCluster] != "edge-b" ||
			l[discoveryv1.LabelManagedBy] != ManagedBy || l[discoveryv1.LabelServiceName] != "backend-mcs-x" {
			t.Errorf("labels %v", l)
		}
		if len(s.Ports) != 1 || *s.Ports[0].Name != "http" {
			t.Errorf("slice %s ports %+v, want only http", s.Name, s.Ports)
		}
		for _, e := range s.Endpoints {
			a := netip.MustParseAddr(e.Addresses[0])
			if (s.AddressType == discoveryv1.AddressTypeIPv6) != a.Is6() {
				t.Errorf("address %s in a %s slice", a, s.AddressType)
			}
			ready := a.String() != "10.0.0.1" && a.String() != "fd00::1"
			if *e.Conditions.Ready != ready || *e.Conditions.Serving != ready || *e.Conditions.Terminating {
				t.Errorf("%s conditions %+v", a, e.Conditions)
			}
			if e.Hostname == nil || *e.Hostname == "" {
				t.Errorf("%s has no hostname", a)
			}
		}
	}
	// The IPv4 slice for 8080 holds 10.0.0.1 and 10.0.0.2, sorted.
	for _, s := range got {
		if s.AddressType == discoveryv1.AddressTypeIPv4 && *s.Ports[0].Port == 8080 {
			if len(s.Endpoints) != 2 || s.Endpoints[0].Addresses[0] != "10.0.0.1" {
				t.Errorf("IPv4 8080 slice %+v", s.Endpoints)
			}
		}
	}

	// Headless: no derived Service label.
	for _, s := range Slices(key, "edge-b", "", &im, eps[:1], owner) {
		if _, ok := s.Labels[discoveryv1.LabelServiceName]; ok {
			t.Errorf("a headless import's slice names a Service: %v", s.Labels)
		}
	}
}

func TestSlicesSplitAndStable(t *testing.T) {
	im := Merge([]Export{{Cluster: "a", Type: mcsv1beta1.Headless, Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80}}}})
	var eps []Endpoint
	for i := range 250 {
		eps = append(eps, endpoint(fmt.Sprintf("10.1.%d.%d", i/200, i%200+1), true, EndpointPort{Name: "http", Port: 80}))
	}
	key := Key{"ns", "backend"}
	a := Slices(key, "c", "", &im, eps, owner)
	if len(a) != 3 || len(a[0].Endpoints) != 100 || len(a[2].Endpoints) != 50 {
		t.Fatalf("slices of %d, want 100, 100, 50", len(a))
	}
	// Reversed input, same slices.
	rev := make([]Endpoint, len(eps))
	for i, e := range eps {
		rev[len(eps)-1-i] = e
	}
	b := Slices(key, "c", "", &im, rev, owner)
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Endpoints[0].Addresses[0] != b[i].Endpoints[0].Addresses[0] {
			t.Errorf("slice %d differs with the input's order: %s %s", i, a[i].Name, b[i].Name)
		}
	}
	// Another cluster's slices have other names.
	for _, s := range Slices(key, "d", "", &im, eps, owner) {
		for _, o := range a {
			if s.Name == o.Name {
				t.Errorf("clusters c and d share slice name %s", s.Name)
			}
		}
	}
}

// Derived Service and EndpointSlice names do not collide for names that
// share everything but their tails: many more of them than a 24- or 32-bit
// hash of a cut name would give without a collision.
func TestNamesDoNotCollide(t *testing.T) {
	const n = 200000
	derived := make(map[string]string, n)
	sliceNames := make(map[string]string, n)
	prefix := strings.Repeat("a", 52)
	rnd := rand.New(rand.NewPCG(1, 2))
	tail := make([]byte, 10)
	for i := range n {
		for j := range tail {
			tail[j] = 'a' + byte(rnd.IntN(26))
		}
		svc := prefix + "-" + string(tail) // 63 characters
		if d := DerivedServiceName(svc); derived[d] != "" {
			t.Fatalf("services %s and %s both derive %s", derived[d], svc, d)
		} else {
			derived[d] = svc
		}
		s := sliceName(Key{"ns", svc}, "edge-b", "IPv4/http:TCP:8080,", 0)
		if sliceNames[s] != "" {
			t.Fatalf("services %s and %s both have the slice %s", sliceNames[s], svc, s)
		}
		sliceNames[s] = svc
		if i%50000 == 0 {
			if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
				t.Errorf("slice name %q: %v", s, errs)
			}
		}
	}
}

// A service name the API server would refuse as a Service name (a leading
// digit) still gives a valid derived name, distinct from its neighbours'.
func TestDerivedServiceNameOfDigitName(t *testing.T) {
	for _, svc := range []string{"1web", "0", strings.Repeat("9", 63)} {
		name := DerivedServiceName(svc)
		if errs := validation.IsDNS1035Label(name); len(errs) > 0 {
			t.Errorf("DerivedServiceName(%q) = %q: %v", svc, name, errs)
		}
	}
	if DerivedServiceName("1web") == DerivedServiceName("s1web") {
		t.Errorf("1web and s1web derive one name")
	}
}

func TestAddressProblem(t *testing.T) {
	for _, c := range []struct{ addr, want string }{
		{"10.0.0.1", ""},
		{"fd00::1", ""},
		{"192.0.2.7", ""},
		{"127.0.0.1", "loopback"},
		{"127.3.4.5", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"},
		{"0.0.0.0", "unspecified"},
		{"::", "unspecified"},
		{"169.254.169.254", "link-local"},
		{"fe80::1", "link-local"},
		{"224.0.0.1", "multicast"},
		{"239.1.2.3", "multicast"},
		{"ff05::2", "multicast"},
		{"fe80::1%eth0", "zoned"},
	} {
		if got := AddressProblem(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("AddressProblem(%s) = %q, want %q", c.addr, got, c.want)
		}
	}
	if got := AddressProblem(netip.Addr{}); got != "invalid" {
		t.Errorf("AddressProblem of the zero Addr = %q", got)
	}
}

// The addresses the API server would refuse are left out of the slices, the
// good ones of the same Pods kept; a hostname that is not a DNS label is
// left out, its endpoint kept.
func TestSlicesLeaveOutRefusedAddresses(t *testing.T) {
	im := Merge([]Export{{Cluster: "a", Type: mcsv1beta1.ClusterSetIP, Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80}}}})
	http := EndpointPort{Name: "http", Port: 8080}
	bad := endpoint("10.0.0.9", true, http)
	bad.Hostname = "Not_A.Label"
	eps := []Endpoint{
		endpoint("10.0.0.1", true, http),
		endpoint("127.0.0.1", true, http),
		endpoint("169.254.169.254", true, http),
		endpoint("0.0.0.0,fd00::2", true, http), // the IPv6 address is kept
		endpoint("224.0.0.5", true, http),
		endpoint("::1", true, http),
		bad,
	}
	var got []string
	for _, s := range Slices(Key{"ns", "web"}, "b", "web-mcs-x", &im, eps, owner) {
		for _, e := range s.Endpoints {
			h := "-"
			if e.Hostname != nil {
				h = *e.Hostname
			}
			got = append(got, e.Addresses[0]+" "+h)
		}
	}
	slices.Sort(got)
	want := []string{"10.0.0.1 10-0-0-1", "10.0.0.9 -", "fd00::2 0-0-0-0"}
	if !slices.Equal(got, want) {
		t.Errorf("endpoints %v, want %v", got, want)
	}
}

func TestFamilies(t *testing.T) {
	ep := func(addrs ...string) Endpoint {
		var e Endpoint
		for _, a := range addrs {
			e.Addresses = append(e.Addresses, netip.MustParseAddr(a))
		}
		return e
	}
	v4, v6 := corev1.IPv4Protocol, corev1.IPv6Protocol
	for _, tc := range []struct {
		name string
		eps  []Endpoint
		have []discoveryv1.AddressType
		want []corev1.IPFamily
	}{
		{name: "none"},
		{name: "IPv4", eps: []Endpoint{ep("10.0.0.1"), ep("10.0.0.2")}, want: []corev1.IPFamily{v4}},
		{name: "IPv6", eps: []Endpoint{ep("fd00::1")}, want: []corev1.IPFamily{v6}},
		{name: "dual stack, IPv4 first", eps: []Endpoint{ep("fd00::1", "10.0.0.1")}, want: []corev1.IPFamily{v4, v6}},
		{name: "an IPv4-mapped address is IPv4", eps: []Endpoint{ep("::ffff:10.0.0.1")}, want: []corev1.IPFamily{v4}},
		{name: "refused addresses count for nothing", eps: []Endpoint{ep("127.0.0.1", "fe80::1"), ep("fd00::1")}, want: []corev1.IPFamily{v6}},
		{name: "kept slices' types", eps: []Endpoint{ep("fd00::1")}, have: []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4}, want: []corev1.IPFamily{v4, v6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Families(tc.eps, tc.have...); !slices.Equal(got, tc.want) {
				t.Errorf("Families = %v, want %v", got, tc.want)
			}
		})
	}
}

// LimitedSlices: at most Max endpoints a slice, and a run Fits refuses is
// halved until it fits (or is one endpoint), every endpoint written once,
// names numbered as Slices numbers them.
func TestLimitedSlices(t *testing.T) {
	im := Merge([]Export{{Cluster: "a", Type: mcsv1beta1.Headless, Ports: []mcsv1beta1.ServicePort{{Name: "http", Port: 80}}}})
	var eps []Endpoint
	for i := range 50 {
		eps = append(eps, endpoint(fmt.Sprintf("10.1.0.%d", i+1), true, EndpointPort{Name: "http", Port: 80}))
	}
	key := Key{"ns", "backend"}
	sizes := func(ss []*discoveryv1.EndpointSlice) []int {
		var n []int
		for _, s := range ss {
			n = append(n, len(s.Endpoints))
		}
		return n
	}
	for _, tc := range []struct {
		name  string
		limit SliceLimit
		want  []int
	}{
		{"default", SliceLimit{}, []int{50}},
		{"relay size", SliceLimit{Max: RelayEndpointsPerSlice}, []int{20, 20, 10}},
		{"fits 7", SliceLimit{Max: 20, Fits: func(e []discoveryv1.Endpoint) bool { return len(e) <= 7 }}, []int{5, 5, 5, 5, 5, 5, 5, 7, 4, 4}}, // 20 -> 10 -> 5; the last 15 -> 7, 8 -> 4
		{"fits none", SliceLimit{Max: 3, Fits: func([]discoveryv1.Endpoint) bool { return false }}, slices.Repeat([]int{1}, 50)},
	} {
		got := LimitedSlices(key, "c", "", &im, eps, owner, tc.limit)
		if !slices.Equal(sizes(got), tc.want) {
			t.Errorf("%s: slices of %v, want %v", tc.name, sizes(got), tc.want)
		}
		seen := map[string]bool{}
		for i, s := range got {
			if want := sliceName(key, "c", "IPv4/http:TCP:80,", i); s.Name != want {
				t.Errorf("%s: slice %d named %s, want %s", tc.name, i, s.Name, want)
			}
			for _, e := range s.Endpoints {
				seen[e.Addresses[0]] = true
			}
		}
		if len(seen) != len(eps) {
			t.Errorf("%s: %d endpoints written, want %d", tc.name, len(seen), len(eps))
		}
	}
	if a, b := Slices(key, "c", "", &im, eps, owner), LimitedSlices(key, "c", "", &im, eps, owner, SliceLimit{Max: MaxEndpointsPerSlice}); a[0].Name != b[0].Name || len(a) != len(b) {
		t.Error("Slices and LimitedSlices at MaxEndpointsPerSlice differ")
	}
}
