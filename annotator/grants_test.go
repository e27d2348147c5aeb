package annotator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/mcsannotations/mcsannotations/internal/source"
)

const testReader = "kube-system/peer"

var testSubject = rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "kube-system", Name: "peer"}

// svcIn is a Service in ns, exported by annotation when exported.
func svcIn(ns, name string, exported bool) *corev1.Service {
	s := svc(name, app, sport("http", 80, intstr.FromInt32(8080), corev1.ProtocolTCP))
	s.Namespace = ns
	if !exported {
		s.Annotations = nil
	}
	return s
}

// grantState is the namespaces with our grant (to the right subject and
// role), and the published list.
func grantState(t *testing.T, client *fake.Clientset) (granted []string, published string, ok bool) {
	t.Helper()
	// The tracker's, not the clientset's: a test's reactors may refuse the list.
	obj, err := client.Tracker().List(rbacv1.SchemeGroupVersion.WithResource("rolebindings"), rbacv1.SchemeGroupVersion.WithKind("RoleBinding"), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, rb := range obj.(*rbacv1.RoleBindingList).Items {
		if rb.Name == GrantName && rb.Labels[ManagedByLabel] == FieldManager && isGrant(&rb, testSubject) {
			granted = append(granted, rb.Namespace)
		}
	}
	slices.Sort(granted)
	cm, err := client.CoreV1().ConfigMaps(source.ExportingNamespacesNamespace).Get(context.Background(), source.ExportingNamespacesName, metav1.GetOptions{})
	if err != nil {
		return granted, "", false
	}
	return granted, cm.Data[source.ExportingNamespacesKey], true
}

func waitGrants(t *testing.T, client *fake.Clientset, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var granted []string
	var published string
	for time.Now().Before(deadline) {
		var ok bool
		granted, published, ok = grantState(t, client)
		if ok && slices.Equal(granted, want) && published == source.FormatNamespaces(want) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("grants in %q, list %q; want %q", granted, published, want)
}

// The leader grants the peer reader each exporting namespace and publishes
// the list; a namespace that stops exporting loses its grant; RoleBindings
// it did not make are left alone, and one of its own that is wrong is made
// right.
func TestGrantsFollowExports(t *testing.T) {
	ctx := context.Background()
	ext := svcIn("c", "ext", true)
	ext.Spec.Type = corev1.ServiceTypeExternalName
	foreign := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: GrantName, Namespace: "x"},
		RoleRef: grantRoleRef, Subjects: []rbacv1.Subject{testSubject}}
	wrong := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: GrantName, Namespace: "a", Labels: map[string]string{ManagedByLabel: FieldManager}},
		RoleRef: grantRoleRef, Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "kube-system", Name: "someone-else"}}}
	f := startWith(t, Config{Cluster: "edge-a", ServiceExportPoll: time.Hour, PeerReader: testReader}, false,
		[]runtime.Object{svcIn("a", "backend", true), svcIn("b", "backend", false), ext, foreign, wrong})
	waitGrants(t, f.client, "a")
	for i := 0; testutil.ToFloat64(f.m.PeerGrants) != 1; i++ {
		if i == 100 {
			t.Fatalf("peer_grants %v, want 1", testutil.ToFloat64(f.m.PeerGrants))
		}
		time.Sleep(20 * time.Millisecond)
	}

	// a stops exporting, b starts.
	svcs := f.client.CoreV1().Services
	if _, err := svcs("a").Update(ctx, svcIn("a", "backend", false), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := svcs("b").Update(ctx, svcIn("b", "backend", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGrants(t, f.client, "b")
	if _, err := f.client.RbacV1().RoleBindings("x").Get(ctx, GrantName, metav1.GetOptions{}); err != nil {
		t.Errorf("a RoleBinding the annotator did not make: %v", err)
	}
}

// The list never names a namespace whose grant could not be made (a peer
// would follow it into a namespace it may not read); the others are
// published all the same.
func TestGrantsBeforeList(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	hook := func(c *fake.Clientset) {
		c.PrependReactor("create", "rolebindings", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if refuse.Load() && a.GetNamespace() == "b" {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: rbacv1.GroupName, Resource: "rolebindings"}, GrantName, fmt.Errorf("refused"))
			}
			return false, nil, nil
		})
	}
	f := startHooked(t, Config{Cluster: "edge-a", ServiceExportPoll: time.Hour, PeerReader: testReader}, hook, false,
		[]runtime.Object{svcIn("a", "backend", true), svcIn("b", "backend", true)})
	// a is published alone, and b's grant tried again, within the deadline.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, published, ok := grantState(t, f.client)
		if ok && published != "a\n" {
			t.Fatalf("published %q while b's grant was refused, want a alone", published)
		}
		tries := testutil.ToFloat64(f.m.GrantWrites.WithLabelValues("error"))
		if ok && tries >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("published %q (a ConfigMap: %v), b's grant tried %v times; want a published and b tried again", published, ok, tries)
		}
		time.Sleep(20 * time.Millisecond)
	}
	refuse.Store(false)
	waitGrants(t, f.client, "a", "b")
}

// reactor makes the fake clientset answer verb on resource with err.
func reactor(verb, resource string, err error) func(*fake.Clientset) {
	return func(c *fake.Clientset) {
		c.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, err })
	}
}

// A sync that fails part way leaves no namespace in the list without its
// grant, and no grant revoked that the list may still name; a revoke that
// finds another RoleBinding in place of the one read (a Conflict on its
// UID) leaves it to the next sync and is no failure.
func TestSyncGrantsFailures(t *testing.T) {
	refused := apierrors.NewForbidden(schema.GroupResource{Group: rbacv1.GroupName, Resource: "rolebindings"}, GrantName, fmt.Errorf("refused"))
	for _, tc := range []struct {
		name      string
		hook      func(*fake.Clientset)
		wantErr   string // "" for none
		granted   []string
		published string // "" for no list
		errors    float64
	}{
		{"listing RoleBindings", reactor("list", "rolebindings", refused), "listing RoleBindings", []string{"old"}, "", 0},
		{"publishing", reactor("patch", "configmaps", refused), "ConfigMap", []string{"a", "old"}, "", 1},
		{"revoking", reactor("delete", "rolebindings", refused), "deleting RoleBinding", []string{"a", "old"}, "a\n", 1},
		{"revoking, another in its place", reactor("delete", "rolebindings",
			apierrors.NewConflict(schema.GroupResource{Group: rbacv1.GroupName, Resource: "rolebindings"}, GrantName, fmt.Errorf("UID precondition failed"))),
			"", []string{"a", "old"}, "a\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: GrantName, Namespace: "old", UID: "uid-old", Labels: map[string]string{ManagedByLabel: FieldManager}},
				RoleRef: grantRoleRef, Subjects: []rbacv1.Subject{testSubject}}
			// No PeerReader: the test alone syncs the grants.
			f := startHooked(t, Config{Cluster: "edge-a", ServiceExportPoll: time.Hour}, tc.hook, false,
				[]runtime.Object{svcIn("a", "backend", true), old})
			err := f.ctl.syncGrants(context.Background(), testSubject)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("sync: %v, want an error with %q", err, tc.wantErr)
			}
			granted, published, _ := grantState(t, f.client)
			if !slices.Equal(granted, tc.granted) || published != tc.published {
				t.Errorf("grants in %q, list %q; want %q, %q", granted, published, tc.granted, tc.published)
			}
			if got := testutil.ToFloat64(f.m.GrantWrites.WithLabelValues("error")); got != tc.errors {
				t.Errorf("%v failed writes counted, want %v", got, tc.errors)
			}
		})
	}
}

// ServiceExports count as exports too, once listed.
func TestGrantsServiceExports(t *testing.T) {
	f := startWith(t, Config{Cluster: "edge-a", ServiceExportPoll: time.Hour, PeerReader: testReader}, true,
		[]runtime.Object{svcIn("ns", "backend", false)}, serviceExport("backend"))
	waitGrants(t, f.client, "ns")
}

func TestParsePeerReader(t *testing.T) {
	for _, s := range []string{"", "x", "/x", "x/", "a/b/c"} {
		if ParsePeerReader(s) == nil {
			t.Errorf("%q accepted", s)
		}
	}
	if err := ParsePeerReader(testReader); err != nil {
		t.Error(err)
	}
}
