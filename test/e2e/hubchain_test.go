package e2e

// Hubs reading hubs end to end: edge-o's annotator signs; hub-1's MCS
// controller reads edge-o and relays it; hub-2's reads only hub-1 (--hub)
// and relays what hub-1 relays (--relay), the path hub-1,hub-2 on its
// slices; edge-e's CoreDNS (verify on) reads only hub-2. The origin's export
// answers at edge-e, two tiers from the origin, accepted on the origin's
// signature, and its state per origin arrives through hub-2's re-published
// Lease. Then hub-1 reads hub-2 too (each reads the other), the origin
// deletes a Pod, and edge-e and both hubs drop it and keep it dropped: it
// does not bounce between the hubs (docs/DESIGN.md#relay-hubs). Last,
// hub-1 stops reading the origin: its records and both hubs' Leases of it
// go (the hubs do not hold each other's Lease up), and edge-e reports it
// disconnected.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/miekg/dns"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

const hubChainCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-e
        kubeconfig {KUBECONFIG}
        hub hub-2 {HUB2}
        verify {KEYS}
        ttl 5
    }
    prometheus 127.0.0.1:{METRICS}
}
`

func TestHubChain(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS, harness.ToolAnnotator)
	ns := "chain"
	rs := startRelaySet(t, ns, "hub-1", "hub-2")
	o, h1, h2, e, keysE := rs.o, rs.hubs[0], rs.hubs[1], rs.e, rs.keysE
	rs.exportBackend(t, ns, 2)

	hub := func(h *harness.Cluster, args ...string) *harness.Annotator {
		return harness.StartAnnotator(t, h.Kubeconfig, append([]string{"--cluster", h.Name, "--leader-elect=false", "-mcs-controller", "--relay", "--relay-lease-grace=2s"}, args...)...)
	}
	ctl1 := hub(h1, "-peer", "edge-o="+o.Kubeconfig)
	hub(h2, "-hub", "hub-1="+h1.Kubeconfig)

	metrics := harness.FreePort(t)
	d := harness.StartCoreDNS(t, hubChainCorefile, map[string]string{
		"KUBECONFIG": e.Kubeconfig, "HUB2": h2.Kubeconfig, "KEYS": keysE.Dir, "METRICS": strconv.Itoa(metrics),
	})
	q := harness.Query{Name: svc("backend", ns), Type: dns.TypeA, Timeout: peerQueryTimeout}
	took := waitPeers(t, d, relayPropagation, q, hasAddrs("10.7.0.1", "10.7.0.2"))
	t.Logf("edge-o's export answered at edge-e through hub-1 and hub-2 after %s", took.Round(time.Millisecond))
	waitRelayedPaths(t, h2, ns, "edge-o", "hub-1,hub-2")
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_source_state{cluster="edge-o",state="connected"}`, func(v float64) bool { return v == 1 })
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_origin_via{cluster="edge-o",hub="hub-2"}`, func(v float64) bool { return v == 1 })

	// hub-1 reads hub-2 too; the origin deletes backend-2.
	ctl1.Stop(t)
	ctl1 = hub(h1, "-peer", "edge-o="+o.Kubeconfig, "-hub", "hub-2="+h2.Kubeconfig)
	waitPeers(t, d, relayPropagation, q, hasAddrs("10.7.0.1", "10.7.0.2"))
	o.DeletePod(t, ns, "backend-2")
	took = waitPeers(t, d, relayPropagation, q, hasAddrs("10.7.0.1"))
	t.Logf("a Pod deleted at edge-o gone at edge-e after %s, the hubs reading each other", took.Round(time.Millisecond))
	for _, h := range []*harness.Cluster{h1, h2} {
		waitRelayedAddrs(t, h, ns, "edge-o", "10.7.0.1")
	}
	stop := watchAnswers(t, d, q, []string{"10.7.0.1"})
	time.Sleep(5 * time.Second)
	if n, bad := stop(); len(bad) > 0 {
		t.Fatalf("after the deletion, %d of %d answers were not the origin's remaining endpoint: first %s", len(bad), n, bad[0])
	}
	for _, h := range []*harness.Cluster{h1, h2} {
		waitRelayedAddrs(t, h, ns, "edge-o", "10.7.0.1")
	}

	// hub-1 takes edge-o out (its peer removed) and reads only hub-2, which
	// has edge-o only from hub-1: edge-o's records go from both hubs, and
	// so do their Leases of it, after --relay-lease-grace (hub-1 ignores
	// hub-2's, whose path names hub-1). edge-e answers nothing of edge-o
	// and reports it disconnected (it verifies: it remembers edge-o).
	ctl1.Stop(t)
	hub(h1, "-hub", "hub-2="+h2.Kubeconfig)
	took = waitPeers(t, d, relayPropagation, q, isNXDOMAIN)
	t.Logf("edge-o taken out of hub-1: its name gone at edge-e after %s", took.Round(time.Millisecond))
	for _, h := range []*harness.Cluster{h1, h2} {
		harness.Eventually(t, relayPropagation, func() error {
			cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l, err := h.Client.CoordinationV1().Leases(relay.DefaultNamespace).Get(cx, relay.LeasePrefix+"edge-o", metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s's Lease of edge-o: %v (%v), want none", h.Name, l, err)
			}
			return nil
		})
	}
	eventuallyRelayMetric(t, metrics, `coredns_mcsannotations_source_state{cluster="edge-o",state="disconnected"}`, func(v float64) bool { return v == 1 })
}

// relayedSlices calls each on the relay slices c's controller writes of
// origin in ns.
func relayedSlices(c *harness.Cluster, ns, origin string, each func(addrs []string, sl relay.Slice) error) error {
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.Client.DiscoveryV1().EndpointSlices(ns).List(cx, metav1.ListOptions{LabelSelector: mcsv1beta1.LabelSourceCluster + "=" + origin})
	if err != nil {
		return err
	}
	if len(l.Items) == 0 {
		return fmt.Errorf("%s: no slice of %s", c.Name, origin)
	}
	for _, es := range l.Items {
		sl, err := relay.Parse(es.Annotations[relay.SliceAnnotation])
		if err != nil {
			return fmt.Errorf("%s: slice %s: %v", c.Name, es.Name, err)
		}
		var addrs []string
		for _, ep := range es.Endpoints {
			addrs = append(addrs, ep.Addresses...)
		}
		if err := each(addrs, sl); err != nil {
			return fmt.Errorf("%s: slice %s: %v", c.Name, es.Name, err)
		}
	}
	return nil
}

// waitRelayedPaths waits until every Pod c relays of origin has path want.
func waitRelayedPaths(t *testing.T, c *harness.Cluster, ns, origin, want string) {
	t.Helper()
	harness.Eventually(t, relayPropagation, func() error {
		return relayedSlices(c, ns, origin, func(_ []string, sl relay.Slice) error {
			for i, p := range sl.Pods {
				if got := relay.JoinPath(sl.PodPath(i)); got != want {
					return fmt.Errorf("pod %s: path %q, want %q", p.Name, got, want)
				}
			}
			return nil
		})
	})
}

// waitRelayedAddrs waits until c's slices of origin hold exactly want.
func waitRelayedAddrs(t *testing.T, c *harness.Cluster, ns, origin string, want ...string) {
	t.Helper()
	harness.Eventually(t, relayPropagation, func() error {
		var all []string
		err := relayedSlices(c, ns, origin, func(addrs []string, _ relay.Slice) error {
			all = append(all, addrs...)
			return nil
		})
		slices.Sort(all)
		if err == nil && !slices.Equal(all, want) {
			err = fmt.Errorf("%s: slices of %s hold %v, want %v", c.Name, origin, all, want)
		}
		return err
	})
}
