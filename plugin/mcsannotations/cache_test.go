package mcsannotations

import (
	"slices"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/cache"
	coretest "github.com/coredns/coredns/test"

	"github.com/miekg/dns"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/annotation"
)

var _ cache.ZoneBypasser = (*MCS)(nil)

func TestCacheBypassZones(t *testing.T) {
	m := testMCS(false)
	got := m.CacheBypassZones()
	if !slices.Equal(got, []string{"clusterset.local.", "cluster.local."}) {
		t.Fatalf("CacheBypassZones() = %v", got)
	}
	got[0] = "changed."
	if m.zones[0] != "clusterset.local." {
		t.Fatalf("CacheBypassZones returned the plugin's own slice")
	}
}

// cachedCorefile puts the cache plugin in front of the plugin, as the
// cluster's usual Corefile does (the chain order comes from the directives:
// cache runs first).
const cachedCorefile = `clusterset.local:0 {
    bind 127.0.0.1
    cache 30
    mcsannotations {
        cluster edge-a
        kubeconfig /unused-in-this-test
        imports enforce
    }
}`

// Behind the cache plugin, answers stay per client: a refusal is not served
// to the importing Pod, nor its answer or alias to a refused client.
func TestCacheKeepsAnswersPerClient(t *testing.T) {
	const consumer = "127.0.0.5" // web/consumer imports default/backend as "be"
	consumerPod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: "web", ResourceVersion: "1",
			Labels:      map[string]string{annotation.ImporterLabel: "true"},
			Annotations: map[string]string{annotation.ImportAnnotation: `{"services":[{"name":"backend","namespace":"default","alias":"be"}]}`}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIPs: []v1.PodIP{{IP: consumer}}},
	}
	client := fake.NewClientset(exporter("b1", "10.0.0.1", `{"services":[{"name":"backend","allowedNamespaces":["web"]}]}`), consumerPod)
	withClient(t, func(string, string) (kubernetes.Interface, error) { return client, nil })
	i, udp, _, err := coretest.CoreDNSServerAndPorts(cachedCorefile)
	if err != nil {
		t.Fatal(err)
	}
	defer stopServer(i)

	ask := func(src, qname string) *dns.Msg { return askFrom(t, udp, src, qname) }
	const backend, alias = "backend.default.svc.clusterset.local.", "be.web.svc.clusterset.local."
	deadline := time.Now().Add(10 * time.Second)
	for len(ask(consumer, backend).Answer) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%s from %s: no answer after 10 s", backend, consumer)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// 127.0.0.1 is no Pod: refused, between answers to the consumer.
	for _, q := range []string{backend, alias} {
		if r := ask(consumer, q); len(r.Answer) != 1 {
			t.Errorf("%s from the consumer: %v", q, r)
		}
		if r := ask("127.0.0.1", q); r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
			t.Errorf("%s from an unknown client right after the consumer: %v", q, r)
		}
		if r := ask(consumer, q); len(r.Answer) != 1 {
			t.Errorf("%s from the consumer right after a refusal: %v", q, r)
		}
	}
}
