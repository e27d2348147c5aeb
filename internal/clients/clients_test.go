package clients

import (
	"context"
	"net/netip"
	"reflect"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

var (
	ipA = netip.MustParseAddr("10.0.0.1")
	ipB = netip.MustParseAddr("fd00::1")
)

func TestIndexIPReuse(t *testing.T) {
	x := NewIndex()
	old := &Client{Namespace: "web", Name: "old", Imports: []annotation.Import{{Name: "db", Namespace: "web", Alias: "db"}}}
	x.Set(old, []netip.Addr{ipA, ipB})
	if c := x.Lookup(ipA); c != old || !x.HasImporters() {
		t.Fatal("set")
	}
	if c := x.Lookup(netip.MustParseAddr("::ffff:10.0.0.1")); c != old {
		t.Fatal("IPv4-mapped lookup")
	}
	// A new Pod takes over the IP before the old one's delete arrives.
	fresh := &Client{Namespace: "other", Name: "new"}
	x.Set(fresh, []netip.Addr{ipA})
	x.Remove("web", "old")
	if c := x.Lookup(ipA); c != fresh {
		t.Fatalf("reused IP: %+v", c)
	}
	if c := x.Lookup(ipB); c != nil {
		t.Fatalf("released IP still indexed: %+v", c)
	}
	if x.HasImporters() {
		t.Fatal("importer count not released")
	}
	// An update that drops an IP releases it; one that keeps it keeps it.
	fresh2 := &Client{Namespace: "other", Name: "new"}
	x.Set(fresh2, []netip.Addr{ipB})
	if x.Lookup(ipA) != nil || x.Lookup(ipB) != fresh2 || x.Len() != 1 {
		t.Fatal("update")
	}
	x.Remove("other", "new")
	x.Remove("other", "new")
	if x.Lookup(ipB) != nil || x.Len() != 0 {
		t.Fatal("remove")
	}
}

func importer(name, ip, anno string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "web", ResourceVersion: "1",
			Labels:      map[string]string{annotation.ImporterLabel: "true"},
			Annotations: map[string]string{annotation.ImportAnnotation: anno}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIPs: []v1.PodIP{{IP: ip}}},
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestWatcher(t *testing.T) {
	ctx := context.Background()
	plain := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "other", ResourceVersion: "1"},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIPs: []v1.PodIP{{IP: "10.0.0.7"}}}}
	client := fake.NewClientset(importer("a", "10.0.0.1", `{"services":[{"name":"backend","namespace":"default","alias":"be"}]}`), plain)
	var mu sync.Mutex
	var rejected []annotation.Reason
	for _, all := range []bool{false, true} {
		x := NewIndex()
		w := NewWatcher(client, x, Options{All: all, Rejected: func(ns, name string, rej []annotation.Rejection) {
			mu.Lock()
			defer mu.Unlock()
			for _, r := range rej {
				rejected = append(rejected, r.Reason)
			}
		}})
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		eventually(t, "sync", w.HasSynced)
		c := x.Lookup(ipA)
		if c == nil || len(c.Imports) != 1 || c.Imports[0].Alias != "be" {
			t.Fatalf("all=%v: importer %+v", all, c)
		}
		if got := x.Lookup(netip.MustParseAddr("10.0.0.7")); (got != nil) != all {
			t.Fatalf("all=%v: plain Pod indexed: %v (the fake applies label selectors to lists)", all, got)
		}
		w.Stop()
	}

	x := NewIndex()
	mu.Lock()
	rejected = nil
	mu.Unlock()
	w := NewWatcher(client, x, Options{Rejected: func(ns, name string, rej []annotation.Rejection) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range rej {
			rejected = append(rejected, r.Reason)
		}
	}})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	eventually(t, "sync", w.HasSynced)
	pods := client.CoreV1().Pods("web")
	// An edit of the imports takes effect.
	p := importer("a", "10.0.0.1", `{"services":[{"name":"db","alias":"database"}]}`)
	p.ResourceVersion = "2"
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "import edit", func() bool {
		c := x.Lookup(ipA)
		_, ok := c.Alias("database")
		return c != nil && ok && c.Imported("web", "db") && !c.Imported("default", "backend")
	})
	// A terminating Pod gives up its IP.
	p = p.DeepCopy()
	p.ResourceVersion = "3"
	now := metav1.Now()
	p.DeletionTimestamp = &now
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "terminating", func() bool { return x.Lookup(ipA) == nil })
	// A new Pod on the same IP has its own imports only; the old Pod's delete changes nothing.
	if _, err := pods.Create(ctx, importer("b", "10.0.0.1", `{"services":[]}`), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pods.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "reuse", func() bool { c := x.Lookup(ipA); return c != nil && c.Name == "b" && len(c.Imports) == 0 })
	time.Sleep(50 * time.Millisecond)
	if c := x.Lookup(ipA); c == nil || c.Name != "b" {
		t.Fatalf("after the old Pod's delete: %+v", c)
	}
	// A bad import annotation is reported, once.
	if _, err := pods.Create(ctx, importer("c", "10.0.0.3", `{"services":[{"name":"x","alias":"Not Valid"}]}`), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pod c", func() bool { return x.Lookup(netip.MustParseAddr("10.0.0.3")) != nil })
	mu.Lock()
	if len(rejected) != 1 || rejected[0] != annotation.ReasonName {
		t.Errorf("rejections %v, want one invalid_name", rejected)
	}
	mu.Unlock()
	if err := pods.Delete(ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pod c deleted", func() bool { return x.Lookup(netip.MustParseAddr("10.0.0.3")) == nil })
}

// A hostNetwork Pod's IP is the node's: it identifies no Pod, so neither of
// two hostNetwork Pods on one node is indexed, whatever their imports.
func TestHostNetworkNotIndexed(t *testing.T) {
	x := NewIndex()
	w := NewWatcher(nil, x, Options{All: true})
	st := w.newStore()
	for _, name := range []string{"agent", "cache"} {
		p := importer(name, "192.168.0.10", `{"services":[{"name":"backend","namespace":"default","alias":"be"}]}`)
		p.Spec.HostNetwork = true
		if err := st.Add(toSlim(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Add(toSlim(importer("plain", "10.0.0.1", `{}`))); err != nil {
		t.Fatal(err)
	}
	if c := x.Lookup(netip.MustParseAddr("192.168.0.10")); c != nil {
		t.Fatalf("node IP indexed as Pod %s/%s", c.Namespace, c.Name)
	}
	if x.Lookup(ipA) == nil || x.Len() != 1 || x.HasImporters() {
		t.Fatalf("index: %d Pods, importers %v", x.Len(), x.HasImporters())
	}
}

// TestToSlimThroughPodproto: the transform makes the same slim object of a
// Pod whole and of the Pod as the plugin's client decodes it (podproto with
// podproto.Plugin), so no field it reads is one the decoder drops.
func TestToSlimThroughPodproto(t *testing.T) {
	const imports = `{"services":[{"name":"backend","namespace":"default","alias":"be"}]}`
	gone := metav1.Unix(1790000000, 0)
	cases := map[string]func(p *v1.Pod){
		"importer, two IPs": func(p *v1.Pod) { p.Status.PodIPs = append(p.Status.PodIPs, v1.PodIP{IP: "fd00::1"}) },
		"hostNetwork":       func(p *v1.Pod) { p.Spec.HostNetwork = true },
		"terminating":       func(p *v1.Pod) { p.DeletionTimestamp = &gone },
		"failed":            func(p *v1.Pod) { p.Status.Phase = v1.PodFailed },
		"not an importer":   func(p *v1.Pod) { delete(p.Labels, annotation.ImporterLabel) },
		"bad annotation":    func(p *v1.Pod) { p.Annotations[annotation.ImportAnnotation] = `{"services":[{"name":"Bad_Name"}]}` },
		"unrelated fields": func(p *v1.Pod) {
			p.Labels["app"], p.Annotations["other"] = "web", "x"
			p.Spec.Containers = []v1.Container{{Name: "web", Image: "registry.example/web:1"}}
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			whole := importer("a", "10.0.0.1", imports)
			whole.UID = "uid-a"
			change(whole)
			trimmed, err := podproto.Trim(whole, podproto.Plugin)
			if err != nil {
				t.Fatal(err)
			}
			a, b := toSlim(whole), toSlim(trimmed)
			if !reflect.DeepEqual(a, b) {
				t.Errorf("whole Pod: %+v (client %+v)\ndecoded:    %+v (client %+v)", a, a.client, b, b.client)
			}
		})
	}
}
