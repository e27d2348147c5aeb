package mcscontroller

import (
	"context"
	"fmt"
	"iter"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
)

// What a restore seeds on a source (internal/source.Source's methods).
func (s *fakeSource) SeedLastContact(t time.Time) {
	if !t.IsZero() {
		s.last.CompareAndSwap(0, t.UnixNano())
	}
}

func (s *fakeSource) SeedLastFullSync(t time.Time) {
	if !t.IsZero() {
		s.full.CompareAndSwap(0, t.UnixNano())
	}
}

func (s *fakeSource) LastFullSync() time.Time {
	if n := s.full.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// restartedWithSnapshot runs a controller over a (local) and b with a
// snapshot journaling the records, reconciles, cuts b, and "restarts": it
// returns a new controller over the objects the first one wrote (tamper
// changes them first), b not heard from since its start, its records
// restored from the snapshot (restore false: no snapshot), and the first
// controller's plan of web.
func restartedWithSnapshot(t *testing.T, restore bool, tamper func([]runtime.Object)) (*env, *outcome, time.Time) {
	defer func(d time.Duration) { metaPoll = d }(metaPoll)
	metaPoll = 10 * time.Millisecond
	path := filepath.Join(t.TempDir(), "mcs-controller.db")
	now := time.Now()
	a, b := newSource("a", true, now), newSource("b", true, now)
	a.full.Store(now.UnixNano())
	b.full.Store(now.UnixNano())
	e := newEnv(t, Config{LocalCluster: "a"}, []*fakeSource{a, b})
	st, _, err := snapshot.Open(path, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	jctx, stop := context.WithCancel(context.Background())
	closed := JournalSnapshot(jctx, st, e.table, []Source{a, b}, e.metrics)
	e.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP))
	e.table.Upsert(exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP))
	e.table.Upsert(exporter("b", "db", "10.0.1.2", annotation.TypeHeadless))
	e.start(false)
	e.waitSynced()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	web := clusterset.Key{Namespace: "ns", Name: "web"}
	before := e.ctl.done[web]
	// b is cut; the process ends (the journal writes the meta and closes).
	lost := now.Add(-10 * time.Second)
	b.cut.Store(true)
	b.setLast(lost)
	stop()
	<-closed

	var objs []runtime.Object
	for _, s := range e.slices() {
		objs = append(objs, s.DeepCopy())
	}
	for _, s := range e.derivedServices() {
		objs = append(objs, s.DeepCopy())
	}
	objs = append(objs, e.serviceImports()...)
	if tamper != nil {
		tamper(objs)
	}
	a2, b2 := newSource("a", true, now), newSource("b", false, time.Time{})
	b2.cut.Store(true)
	e2 := newEnv(t, Config{LocalCluster: "a"}, []*fakeSource{a2, b2}, objs...)
	if restore {
		st, _, err := snapshot.Open(path, snapshot.Options{})
		if err != nil {
			t.Fatal(err)
		}
		e2.ctl.cfg.Restored = RestoreSnapshot(st, e2.table, []Source{a2, b2}, e2.metrics)
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
	e2.table.Upsert(exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP)) // a lists at once
	e2.start(false)
	e2.waitSynced()
	return e2, before, lost
}

// A controller restarted while peer b is cut plans b's share from the
// records the snapshot gave back, exactly as before the restart: the same
// slices, clusters and merged import, nothing written; b's last contact is
// the one from before the restart.
func TestRestoreSnapshotSamePlan(t *testing.T) {
	e, before, lost := restartedWithSnapshot(t, true, nil)
	if !e.ctl.cfg.Restored["b"] || !e.ctl.cfg.Restored["a"] {
		t.Fatalf("restored %v, want a and b", e.ctl.cfg.Restored)
	}
	m := e.mark()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	after := e.ctl.done[clusterset.Key{Namespace: "ns", Name: "web"}]
	switch {
	case after == nil || after.merged == nil:
		t.Fatalf("no merged import planned for web after the restart: %+v", after)
	case !slices.Equal(after.slices, before.slices) || !slices.Equal(after.clusters, before.clusters):
		t.Errorf("plan after the restart: slices %v clusters %v; before %v %v", after.slices, after.clusters, before.slices, before.clusters)
	case !reflect.DeepEqual(after.merged.Spec, before.merged.Spec) || !slices.Equal(after.merged.Clusters, before.merged.Clusters):
		t.Errorf("merged import after the restart %+v, before %+v", *after.merged, *before.merged)
	}
	if w := e.writesSince(m); len(w) > 0 {
		t.Errorf("the restart wrote %v", w)
	}
	if got := e.sources["b"].LastContact(); !got.Equal(lost.Truncate(0)) && got.Sub(lost).Abs() > time.Millisecond {
		t.Errorf("b's last contact %v, want the snapshot's %v", got, lost)
	}
	if got := e.slicesBy("db")["b"]; !slices.Equal(got, []string{"10.0.1.2"}) {
		t.Errorf("db's share of b: %v", got)
	}
}

// A slice of the cut peer changed on the API server while the controller
// was down (an address added, its annotations kept) is written again from
// the restored records: its content is not trusted.
func TestRestoreSnapshotRewritesTamperedSlice(t *testing.T) {
	tamper := func(objs []runtime.Object) {
		for _, o := range objs {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok && s.Labels["multicluster.kubernetes.io/source-cluster"] == "b" && len(s.Endpoints) > 0 {
				extra := s.Endpoints[0]
				extra.Addresses = []string{"192.0.2.66"}
				s.Endpoints = append(s.Endpoints, extra)
			}
		}
	}
	e, _, _ := restartedWithSnapshot(t, true, tamper)
	if got := e.slicesBy("web")["b"]; !slices.Contains(got, "192.0.2.66") {
		t.Fatalf("the tampered slice is not there to start with: %v", got)
	}
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := e.slicesBy("web")["b"]; !slices.Equal(got, []string{"10.0.1.1"}) {
		t.Errorf("web's share of b after the restart: %v, want 10.0.1.1 only", got)
	}
	if got := e.slicesBy("db")["b"]; !slices.Equal(got, []string{"10.0.1.2"}) {
		t.Errorf("db's share of b after the restart: %v, want 10.0.1.2 only", got)
	}
}

// Without a snapshot, the cut peer's share is not known after a restart:
// its slices, the import and the derived Service stay exactly as they are
// (nothing rebuilt from them, nothing deleted), tampered or not.
func TestRestartWithoutSnapshotHolds(t *testing.T) {
	e, _, _ := restartedWithSnapshot(t, false, nil)
	m := e.mark()
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if w := e.writesSince(m); len(w) > 0 {
		t.Errorf("wrote %v", w)
	}
	if got := e.slicesBy("web")["b"]; !slices.Equal(got, []string{"10.0.1.1"}) {
		t.Errorf("b's slices %v", got)
	}
	if im := e.serviceImport("web"); im == nil || !slices.Equal(importClusters(im), []string{"a", "b"}) {
		t.Errorf("web's import %v", im)
	}
}

// A record of the snapshot that does not belong where it is stored is
// skipped and counted; the others are restored.
func TestRestoreSnapshotBadRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mcs-controller.db")
	st, _, err := snapshot.Open(path, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	good, _ := snapshot.EncodePod(exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP))
	st.ReplaceSource("b", map[string][]byte{"ns/web-b": good, "ns/other": good, "ns/junk": []byte("junk")}, snapshot.Meta{ClusterID: "b", LastFullSync: time.Now()})
	st.ReplaceSource("gone", map[string][]byte{"ns/web-gone": good}, snapshot.Meta{ClusterID: "gone", LastFullSync: time.Now()})
	if err := st.Flush(); err != nil {
		t.Fatal(err)
	}
	b := newSource("b", false, time.Time{})
	e := newEnv(t, Config{}, []*fakeSource{b})
	restored := RestoreSnapshot(st, e.table, []Source{b}, e.metrics)
	if !restored["b"] || restored["gone"] {
		t.Errorf("restored %v", restored)
	}
	if got := e.table.Pods("b"); len(got) != 1 || got[0].Name != "web-b" {
		t.Errorf("b's records %v", got)
	}
	if got := testutil.ToFloat64(e.metrics.SnapshotErrors.WithLabelValues("bad_record")); got != 2 {
		t.Errorf("bad_record %v, want 2", got)
	}
	_ = st.Close()
}

// Without a snapshot only the unknown cluster's share is held: the local
// cluster's change of a service b also has slices in is written, b's slice
// stays as it is and the import keeps the port only b serves; once b answers
// the service is planned from both shares again.
func TestRestartWithoutSnapshotHoldsPerCluster(t *testing.T) {
	extra := mcsv1beta1.ServicePort{Name: "metrics", Port: 9090, Protocol: corev1.ProtocolTCP}
	e, _, _ := restartedWithSnapshot(t, false, func(objs []runtime.Object) {
		for _, o := range objs {
			switch o := o.(type) {
			case *discoveryv1.EndpointSlice:
				if o.Labels[mcsv1beta1.LabelSourceCluster] == "b" && o.Labels[mcsv1beta1.LabelServiceName] == "web" {
					o.Ports = append(o.Ports, discoveryv1.EndpointPort{Name: ptr.To("metrics"), Port: ptr.To[int32](9091), Protocol: ptr.To(corev1.ProtocolTCP)})
				}
			case *unstructured.Unstructured:
				if o.GetName() == "web" {
					ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
					m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&extra)
					_ = unstructured.SetNestedSlice(o.Object, append(ports, m), "spec", "ports")
				}
			}
		}
	})
	importPorts := func() []string {
		im := e.serviceImport("web")
		if im == nil {
			return nil
		}
		ports, _, _ := unstructured.NestedSlice(im.Object, "spec", "ports")
		var out []string
		for _, p := range ports {
			out = append(out, fmt.Sprint(p.(map[string]any)["name"]))
		}
		return out
	}
	e.table.Upsert(exporter("a", "web", "10.0.0.9", annotation.TypeClusterSetIP)) // a scales
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	got := e.slicesBy("web")
	if !slices.Equal(got["a"], []string{"10.0.0.9"}) || !slices.Equal(got["b"], []string{"10.0.1.1"}) {
		t.Errorf("while b is unknown: slices %v, want a's change written and b's held", got)
	}
	if p := importPorts(); !slices.Equal(p, []string{"http", "metrics"}) {
		t.Errorf("while b is unknown: import ports %v, want b's metrics kept", p)
	}
	if im := e.serviceImport("web"); im == nil || !slices.Equal(importClusters(im), []string{"a", "b"}) {
		t.Errorf("while b is unknown: import %v", im)
	}

	// b answers: its share is planned from its records again.
	b := e.sources["b"]
	e.table.Upsert(exporter("b", "web", "10.0.1.5", annotation.TypeClusterSetIP))
	b.cut.Store(false)
	b.setLast(time.Now())
	b.synced.Store(true)
	e.ctl.queue.Add(keyAll)
	if err := e.reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := e.slicesBy("web"); !slices.Equal(got["a"], []string{"10.0.0.9"}) || !slices.Equal(got["b"], []string{"10.0.1.5"}) {
		t.Errorf("after b answered: slices %v", got)
	}
	if p := importPorts(); !slices.Equal(p, []string{"http"}) {
		t.Errorf("after b answered: import ports %v", p)
	}
}

// A hub of hubs (--relay) keeps only the replay memory in its snapshot: the
// records an earlier run without --relay kept are dropped from the file,
// the replay memory stays, and the file is closed once the context ends.
func TestReplayOnlySnapshot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mcs-controller.db")
	st, _, err := snapshot.Open(path, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	good, _ := snapshot.EncodePod(exporter("b", "web", "10.0.1.1", annotation.TypeClusterSetIP))
	st.ReplaceSource("b", map[string][]byte{"ns/web-b": good}, snapshot.Meta{ClusterID: "b", LastFullSync: time.Now()})
	mem := snapshot.Replay{Pod: "ns/web-o", Seq: 7, Hash: 42}
	st.PutReplay("o", mem)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st, _, err = snapshot.Open(path, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	closed := ReplayOnlySnapshot(ctx, st)
	cancel()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the snapshot was not closed once the context ended")
	}

	st, _, err = snapshot.Open(path, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	var clusters []string
	if err := st.Scan(func(cluster string, _ snapshot.Meta, _ iter.Seq2[[]byte, []byte]) error {
		clusters = append(clusters, cluster)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(clusters) != 0 {
		t.Errorf("the file still holds the records of %v", clusters)
	}
	got := map[string][]snapshot.Replay{}
	if _, err := st.LoadReplay(func(origin string, m []snapshot.Replay) { got[origin] = m }); err != nil {
		t.Fatal(err)
	}
	if want := map[string][]snapshot.Replay{"o": {mem}}; !reflect.DeepEqual(got, want) {
		t.Errorf("replay memory %v, want %v", got, want)
	}
}
