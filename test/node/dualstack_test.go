package node

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// TestDualStack: two real single-node clusters with IPv4 and IPv6 Pod and
// Service CIDRs (ULA ranges of the test's own namespaces), the product
// installed as in TestClusterset. Pods get an address of each family; the
// kube-dns Service stays IPv4 (kubeadm's). A Pod's resolver gets AAAA
// answers: each cluster's backend Pod's IPv6 address by its clusterset
// name; web's clusterset name answers with an IPv6 ClusterSetIP as well (the
// derived Service prefers dual stack), and HTTP over IPv6 to it reaches the
// web Pods of both clusters through kube-proxy's ip6tables rules, which see
// the client's own IPv6 address.
func TestDualStack(t *testing.T) {
	tools := RequireTools(t)
	n := NewDualStackNetwork(t)
	a := StartCluster(t, n, tools, "edge-a")
	b := StartCluster(t, n, tools, "edge-b")
	cs := []*Cluster{a, b}
	for _, c := range cs {
		c.InstallStockDNS(t)
	}
	InstallClusterset(t, cs)
	for _, c := range cs {
		c.InstallDemo(t)
	}
	backends := map[string]string{}
	for _, c := range cs {
		ips := c.PodIPs(t, "demo", "backend-"+c.Name)
		if backends[c.Name] = ipv6(ips); backends[c.Name] == "" {
			t.Fatalf("backend-%s has no IPv6 address: %v", c.Name, ips)
		}
		t.Logf("%s: backend-%s's IPs %v", c.Name, c.Name, ips)
	}
	for _, c := range cs {
		t.Run(c.Name+"/AAAA answers", func(t *testing.T) {
			for _, o := range cs {
				name := "backend-" + o.Name + "." + o.Name + ".backend.demo.svc.clusterset.local"
				harness.Eventually(t, 2*time.Minute, func() error {
					got, err := c.LookupErr("demo", "client", name)
					if err != nil {
						return err
					}
					if !slices.Contains(got, backends[o.Name]) {
						return fmt.Errorf("%s: %v, want %s among them", name, got, backends[o.Name])
					}
					return nil
				})
			}
		})
		t.Run(c.Name+"/IPv6 ClusterSetIP carries traffic", func(t *testing.T) {
			ips := c.ClusterSetIPs(t, "demo", "web", 2)
			ip6 := ipv6(ips)
			if ip6 == "" {
				t.Fatalf("ServiceImport demo/web: ClusterSetIPs %v, none IPv6", ips)
			}
			t.Logf("%s: ServiceImport demo/web's ClusterSetIPs %v", c.Name, ips)
			waitLookup(t, c, "demo", "client", "web.demo.svc.clusterset.local", ips...)
			client6 := ipv6(c.PodIPs(t, "demo", "client"))
			url := "http://" + net.JoinHostPort(ip6, "80") + "/"
			seen := map[string]int{}
			for i := 0; i < 60 && (seen[a.Name] == 0 || seen[b.Name] == 0); i++ {
				out, err := c.Exec("demo", "client", "/workload", "get", url)
				if err != nil {
					t.Logf("attempt %d: %v", i, err)
					continue
				}
				seen[field(out, "cluster")]++
				if got := field(out, "remote"); !strings.HasPrefix(got, "["+client6+"]:") {
					t.Errorf("GET %s: the backend saw %s, want the client Pod's IPv6 address %s", url, got, client6)
				}
			}
			for _, o := range cs {
				if seen[o.Name] == 0 {
					t.Errorf("no answer from %s's web through the IPv6 ClusterSetIP %s: %v", o.Name, ip6, seen)
				}
			}
			t.Logf("%s: answers through %s by cluster: %v", c.Name, url, seen)
		})
	}
}

// ipv6 is the first IPv6 address of ips ("" if none).
func ipv6(ips []string) string {
	for _, s := range ips {
		if ip, err := netip.ParseAddr(s); err == nil && ip.Is6() && !ip.Is4In6() {
			return s
		}
	}
	return ""
}
