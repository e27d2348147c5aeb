package mcscontroller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// in moves an exporter record to namespace ns.
func in(ns string, p *store.Pod) *store.Pod {
	c := *p.Common
	c.Namespace = ns
	c.Exports = []annotation.Export{p.Exports[0]}
	c.Exports[0].Namespace = ns
	p.Common = &c
	return p
}

// peekDirty is what the next reconcile will take from the queue: the
// services, the namespaces, and whether every service. (It takes the keys
// and puts them back.)
func (e *env) peekDirty() (dirty map[clusterset.Key]bool, ns map[string]bool, all bool) {
	dirty, ns = map[clusterset.Key]bool{}, map[string]bool{}
	var taken []clusterset.Key
	for e.ctl.queue.Len() > 0 {
		k, _ := e.ctl.queue.Get()
		taken = append(taken, k)
		switch {
		case k == keyAll:
			all = true
		case k == keyRecords:
		case k.Name == "":
			ns[k.Namespace] = true
		default:
			dirty[k] = true
		}
	}
	for _, k := range taken {
		e.ctl.queue.Done(k)
		e.ctl.queue.Add(k)
	}
	return dirty, ns, all
}

// A Namespace event marks only the services of that namespace, and only
// when it is created or deleted (all the controller reads of a Namespace is
// that it exists): a label edit on any namespace does not make the next
// reconcile a full one.
func TestNamespaceEventsMarkOnlyTheirServices(t *testing.T) {
	other := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}}
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now())}, other)
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeHeadless))
	e.table.Upsert(in("late", exporter("a", "db", "10.0.0.2", annotation.TypeHeadless)))
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if e.serviceImport("web") == nil {
		t.Fatal("no import of web")
	}
	if _, _, all := e.peekDirty(); all {
		t.Fatal("still marked all after the first reconcile")
	}

	for _, name := range []string{"ns", "other"} {
		ns, err := e.client.CoreV1().Namespaces().Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ns.Labels = map[string]string{"team": "x"}
		if _, err := e.client.CoreV1().Namespaces().Update(e.ctx, ns, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.poll("the informer to see the label edits", func() bool {
		for _, name := range []string{"ns", "other"} {
			o, ok, _ := e.ctl.namespaces.GetByKey(name)
			if !ok || o.(*corev1.Namespace).Labels["team"] != "x" {
				return false
			}
		}
		return true
	})
	// A namespace created after the label edits: the handlers hear events in
	// order, so once it is marked the edits were heard too, and marked
	// nothing. (The services marked are those whose objects the first
	// reconcile wrote: its own writes coming back.)
	if _, err := e.client.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("the handler to hear of the new namespace", func() bool { _, ns, _ := e.peekDirty(); return ns["late"] })
	if _, ns, all := e.peekDirty(); all || len(ns) != 1 {
		t.Errorf("after label edits and a namespace created: namespaces %v, all %v marked; want the namespace late alone", ns, all)
	}
	if err := e.ctl.Reconcile(e.ctx); err != nil {
		t.Fatal(err)
	}
	if l, err := e.dyn.Resource(importsGVR).Namespace("late").Get(e.ctx, "db", metav1.GetOptions{}); err != nil {
		t.Errorf("no import of late/db once its namespace exists: %v (%v)", l, err)
	}
}

// The gauges of imports, slices and conflicts follow each reconcile of a
// part of the services as a count over everything would.
func TestMetricsFollowPartialReconciles(t *testing.T) {
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())})
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	e.table.Upsert(exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP))
	e.table.Upsert(exporter("a", "db", "10.0.0.2", annotation.TypeHeadless))
	e.start(false)
	e.waitSynced()
	want := func(when string, imports, slices, conflicts float64) {
		t.Helper()
		if err := e.reconcile(); err != nil {
			t.Fatal(err)
		}
		got := [3]float64{testutil.ToFloat64(e.metrics.Imports), testutil.ToFloat64(e.metrics.Slices), testutil.ToFloat64(e.metrics.Conflicts)}
		if got != [3]float64{imports, slices, conflicts} {
			t.Errorf("%s: imports, slices, conflicts %v, want %v", when, got, [3]float64{imports, slices, conflicts})
		}
		var s, c int
		for _, o := range e.ctl.done {
			ds, dc := o.counts()
			s, c = s+ds, c+dc
		}
		if s != e.ctl.nslices || c != e.ctl.nconflicts {
			t.Errorf("%s: totals %d slices, %d conflicts; done holds %d, %d", when, e.ctl.nslices, e.ctl.nconflicts, s, c)
		}
	}
	want("first", 2, 3, 0)
	e.table.Upsert(exporter("b", "db", "10.0.1.2", annotation.TypeClusterSetIP)) // a type conflict
	want("db exported by b as ClusterSetIP", 2, 4, 1)
	e.table.Delete(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP).Key())
	want("a's web gone", 2, 3, 1)
	e.table.Delete(exporter("b", "db", "10.0.1.2", annotation.TypeClusterSetIP).Key())
	want("b's db gone", 2, 2, 0)
	e.table.Delete(exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP).Key())
	want("web gone", 1, 1, 0)
	e.ctl.queue.Add(keyAll)
	want("a full reconcile", 1, 1, 0)
}

// A reconcile writes several services at once: the first write of one
// service is held until a write of another one arrives (bounded), which a
// reconcile writing one service after the other never does.
func TestReconcileWritesServicesInParallel(t *testing.T) {
	e := newEnv(t, Config{Workers: 4}, []*fakeSource{newSource("a", true, time.Now())})
	for i := range 4 {
		e.table.Upsert(exporter("a", fmt.Sprintf("svc-%d", i), fmt.Sprintf("10.0.0.%d", i+1), annotation.TypeHeadless))
	}
	var mu sync.Mutex
	inFlight, most := 0, 0
	second := make(chan struct{})
	var once sync.Once
	// The fakes take one request at a time, so the hold is in front of them.
	var srcs []Source
	for _, s := range e.sources {
		srcs = append(srcs, s)
	}
	e.ctl = New(e.table, srcs, e.client, heldApplies{e.dyn, func() {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		if inFlight >= 2 {
			once.Do(func() { close(second) })
		}
		mu.Unlock()
		ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
		defer cancel()
		select {
		case <-second:
		case <-ctx.Done():
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
	}}, e.disco, Config{Workers: 4, CRDPoll: 10 * time.Millisecond, Interval: time.Millisecond}, e.metrics)
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if most < 2 {
		t.Errorf("at most %d ServiceImport applies at once, want several", most)
	}
	for i := range 4 {
		if e.serviceImport(fmt.Sprintf("svc-%d", i)) == nil {
			t.Errorf("no import of svc-%d", i)
		}
	}
}

// heldApplies calls hold before each apply of a ServiceImport's spec.
type heldApplies struct {
	dynamic.Interface
	hold func()
}

// IsWatchListSemanticsUnSupported: as the fake it wraps, it lists and watches
// the classic way.
func (d heldApplies) IsWatchListSemanticsUnSupported() bool { return true }

func (d heldApplies) Resource(r schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return heldResource{d.Interface.Resource(r), r, d.hold}
}

type heldResource struct {
	dynamic.NamespaceableResourceInterface
	gvr  schema.GroupVersionResource
	hold func()
}

func (r heldResource) Namespace(ns string) dynamic.ResourceInterface {
	return heldNamespaced{r.NamespaceableResourceInterface.Namespace(ns), r}
}

type heldNamespaced struct {
	dynamic.ResourceInterface
	r heldResource
}

func (n heldNamespaced) Apply(ctx context.Context, name string, obj *unstructured.Unstructured, o metav1.ApplyOptions, sub ...string) (*unstructured.Unstructured, error) {
	if n.r.gvr.Resource == importsGVR.Resource && len(sub) == 0 {
		n.r.hold()
	}
	return n.ResourceInterface.Apply(ctx, name, obj, o, sub...)
}

// A peer's share goes once its expiry passes and comes back once it answers
// again, with no change of records to wake the write loop and the resync
// far away.
func TestExpiryWithoutAChange(t *testing.T) {
	now := time.Now()
	a, b := newSource("a", true, now), newSource("b", true, now)
	e := newEnv(t, Config{Expire: 300 * time.Millisecond, Resync: time.Hour, StatePoll: 20 * time.Millisecond}, []*fakeSource{a, b})
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeHeadless))
	e.table.Upsert(exporter("b", "web", "10.0.1.1", annotation.TypeHeadless))
	clusters := func(want ...string) func() bool {
		return func() bool {
			im := e.serviceImport("web")
			return im != nil && slices.Equal(importClusters(im), want) && len(e.slicesBy("web")) == len(want)
		}
	}
	var bAnswers atomic.Bool
	bAnswers.Store(true)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // the local cluster keeps answering; b until it is cut
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				a.setLast(time.Now())
				if bAnswers.Load() {
					b.setLast(time.Now())
				}
			}
		}
	}()
	e.start(true)
	e.poll("the import of a and b", clusters("a", "b"))
	bAnswers.Store(false)
	e.poll("b's share gone past its expiry", clusters("a"))
	bAnswers.Store(true)
	e.poll("b's share back once it answers", clusters("a", "b"))
}

// The Conflict condition is set on the local ServiceExport also when the
// local export is the younger one, whose type lost (the suite checks it on
// every exporting cluster's ServiceExport): the import takes the older
// export's type.
func TestConflictOnTheYoungerExport(t *testing.T) {
	se := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": exportsGVR.GroupVersion().String(), "kind": "ServiceExport",
		"metadata": map[string]any{"namespace": "ns", "name": "web"},
	}}
	e := newEnv(t, Config{}, []*fakeSource{newSource("a", true, time.Now()), newSource("b", true, time.Now())}, se)
	young := exporter("a", "web", "10.0.0.1", annotation.TypeHeadless)
	young.Exports[0].ExportedAt = "2026-11-25T12:00:01Z"
	old := exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP)
	old.Exports[0].ExportedAt = "2026-11-25T12:00:00Z"
	e.table.Upsert(young)
	e.table.Upsert(old)
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	u, err := e.dyn.Resource(exportsGVR).Namespace("ns").Get(e.ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := condition(u, "Conflict")
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != "TypeConflict" || !strings.Contains(c.Message, "cluster a differ") || !strings.Contains(c.Message, "cluster b") {
		t.Errorf("the younger export's Conflict condition: %+v", c)
	}
	if typ, _, _ := unstructured.NestedString(e.serviceImport("web").Object, "spec", "type"); typ != "ClusterSetIP" {
		t.Errorf("import type %q, want the older export's ClusterSetIP", typ)
	}
}
