package annotator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/internal/source"
)

// Peer grants (issue 26): the other clusters' CoreDNS and MCS controllers
// read this cluster's exported Pods with one identity, the peer reader
// (Config.PeerReader). It may read Pods only where a Service is exported:
// the leader keeps, in each namespace with at least one exported Service, a
// RoleBinding GrantName of the peer reader to the ClusterRole GrantRole
// (Pods: list and watch), removes the ones it made where nothing is exported
// any more, and publishes the sorted list of those namespaces in the
// ConfigMap that peers follow (source.ExportingNamespacesName), which the
// peer reader may read by name. A grant is made before the list names its
// namespace, and taken back after the list stops naming it.
const (
	GrantName = "mcsannotations:peer-reader"
	GrantRole = "mcsannotations:peer-reader"
	// ManagedByLabel, with the value FieldManager, marks the RoleBindings
	// and the ConfigMap the annotator made: it removes only those.
	ManagedByLabel = "app.kubernetes.io/managed-by"
)

// grantsResync is how often the grants are checked when nothing changed
// (a RoleBinding deleted by hand comes back within it).
const grantsResync = 5 * time.Minute

// peerReader parses "namespace/name" of a ServiceAccount.
func peerReader(s string) (rbacv1.Subject, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return rbacv1.Subject{}, fmt.Errorf("peer reader %q: want NAMESPACE/NAME of a ServiceAccount", s)
	}
	return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}, nil
}

// ParsePeerReader checks a --peer-reader value.
func ParsePeerReader(s string) error {
	_, err := peerReader(s)
	return err
}

// grantsKey is the one item of the grants queue: a sync looks at every
// namespace.
const grantsKey = "grants"

// grantsBurst is how long a sync waits after the reconcile that asked for
// it, so that a burst of reconciles makes one sync.
const grantsBurst = time.Second

// grantsRetry is the backoff of a failed sync: one second, doubled at each
// failure in a row, at most a minute.
func grantsRetry() workqueue.TypedRateLimiter[string] {
	return workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, time.Minute)
}

// signalGrants asks runGrants for a sync (after a reconcile that changed
// whether its namespace exports).
func (c *Controller) signalGrants() {
	if c.grants != nil {
		c.grants.AddAfter(grantsKey, grantsBurst)
	}
}

// runGrants keeps the grants and the list in line with the exported
// Services until the grants queue shuts down (the leader only, in Run):
// grantsBurst after reconciles, and every grantsResync; a failed sync is
// tried again after the rate limiter's backoff (grantsRetry).
func (c *Controller) runGrants(ctx context.Context) {
	sub, err := peerReader(c.cfg.PeerReader)
	if err != nil {
		klog.Errorf("peer grants: %v: none made", err)
		return
	}
	retry := grantsRetry()
	c.grants.Add(grantsKey)
	for {
		key, quit := c.grants.Get()
		if quit {
			return
		}
		err := c.syncGrants(ctx, sub)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			wait := retry.When(key)
			klog.Warningf("peer grants: %v (trying again in %v)", err, wait)
			c.grants.AddAfter(key, wait)
		default:
			retry.Forget(key)
			c.grants.AddAfter(key, grantsResync)
		}
		c.grants.Done(key)
	}
}

// ExportingNamespaces are the namespaces with at least one exported
// Service, as the informers know them, sorted; an error while the
// ServiceExports are not synced yet.
func (c *Controller) ExportingNamespaces() ([]string, error) {
	svcs, err := c.services.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	byExport := map[string]bool{} // namespace/name of each ServiceExport
	if se := c.exports.Load(); se != nil {
		if !se.hasSynced() {
			return nil, errors.New("the ServiceExports are not listed yet")
		}
		objs, err := se.lister.List(labels.Everything())
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			if m, ok := o.(metav1.Object); ok {
				byExport[m.GetNamespace()+"/"+m.GetName()] = true
			}
		}
	}
	set := map[string]bool{}
	for _, s := range svcs {
		if ok, _ := isExported(s, byExport[s.Namespace+"/"+s.Name]); ok {
			set[s.Namespace] = true
		}
	}
	out := make([]string, 0, len(set))
	for ns := range set {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out, nil
}

// syncGrants makes the grants and the list those of the exported Services:
// grants first, then the list, then the removal of grants the list no
// longer names.
func (c *Controller) syncGrants(ctx context.Context, sub rbacv1.Subject) error {
	want, err := c.ExportingNamespaces()
	if err != nil {
		return err
	}
	rbs := c.client.RbacV1().RoleBindings(metav1.NamespaceAll)
	list, err := rbs.List(ctx, metav1.ListOptions{LabelSelector: labels.Set{ManagedByLabel: FieldManager}.String()})
	if err != nil {
		return fmt.Errorf("listing RoleBindings: %w", err)
	}
	have := map[string]*rbacv1.RoleBinding{}
	for i := range list.Items {
		if rb := &list.Items[i]; rb.Name == GrantName {
			have[rb.Namespace] = rb
		}
	}
	var errs []error
	granted := make([]string, 0, len(want)) // the list names no namespace without its grant
	for _, ns := range want {
		if rb := have[ns]; rb == nil || !isGrant(rb, sub) {
			if err := c.grant(ctx, ns, rb, sub); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		granted = append(granted, ns)
	}
	if err := c.publish(ctx, granted); err != nil {
		return errors.Join(append(errs, err)...)
	}
	c.metrics.PeerGrants.Set(float64(len(granted)))
	for ns, rb := range have {
		if !slices.Contains(want, ns) {
			errs = append(errs, c.revoke(ctx, rb))
		}
	}
	return errors.Join(errs...)
}

// isGrant tells whether rb grants what GrantName should, to sub alone.
func isGrant(rb *rbacv1.RoleBinding, sub rbacv1.Subject) bool {
	return rb.RoleRef == grantRoleRef && len(rb.Subjects) == 1 && rb.Subjects[0] == sub
}

var grantRoleRef = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: GrantRole}

// grant makes the grant of namespace ns, in place of old when that is
// wrong (its role cannot change, so it is deleted first).
func (c *Controller) grant(ctx context.Context, ns string, old *rbacv1.RoleBinding, sub rbacv1.Subject) error {
	rbs := c.client.RbacV1().RoleBindings(ns)
	if old != nil {
		if err := c.revoke(ctx, old); err != nil {
			return err
		}
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: GrantName, Namespace: ns, Labels: map[string]string{ManagedByLabel: FieldManager}},
		RoleRef:    grantRoleRef,
		Subjects:   []rbacv1.Subject{sub},
	}
	_, err := rbs.Create(ctx, rb, metav1.CreateOptions{FieldManager: FieldManager})
	c.counted(err)
	if err != nil {
		return fmt.Errorf("namespace %s: RoleBinding %s: %w", ns, GrantName, err)
	}
	klog.Infof("namespace %s exports: RoleBinding %s lets %s/%s read its Pods", ns, GrantName, sub.Namespace, sub.Name)
	return nil
}

// revoke deletes rb, the one read (its UID), not another made since.
func (c *Controller) revoke(ctx context.Context, rb *rbacv1.RoleBinding) error {
	uid := rb.UID
	err := c.client.RbacV1().RoleBindings(rb.Namespace).Delete(ctx, rb.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone already, or another in its place (the next sync looks at it)
	}
	c.counted(err)
	if err != nil {
		return fmt.Errorf("namespace %s: deleting RoleBinding %s: %w", rb.Namespace, rb.Name, err)
	}
	klog.Infof("namespace %s exports nothing: deleted its RoleBinding %s", rb.Namespace, rb.Name)
	return nil
}

// publish applies, with server-side apply, the list of exporting
// namespaces and the label that marks the ConfigMap as the annotator's; it
// logs the list when the apply changed the ConfigMap.
func (c *Controller) publish(ctx context.Context, namespaces []string) error {
	cfg := applycorev1.ConfigMap(source.ExportingNamespacesName, source.ExportingNamespacesNamespace).
		WithLabels(map[string]string{ManagedByLabel: FieldManager}).
		WithData(map[string]string{source.ExportingNamespacesKey: source.FormatNamespaces(namespaces)})
	cm, err := c.client.CoreV1().ConfigMaps(source.ExportingNamespacesNamespace).Apply(ctx, cfg, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	c.counted(err)
	if err != nil {
		return fmt.Errorf("ConfigMap %s/%s: %w", source.ExportingNamespacesNamespace, source.ExportingNamespacesName, err)
	}
	if cm.ResourceVersion != c.publishedVersion {
		c.publishedVersion = cm.ResourceVersion
		klog.Infof("published %d exporting namespaces in ConfigMap %s/%s", len(namespaces), source.ExportingNamespacesNamespace, source.ExportingNamespacesName)
	}
	return nil
}

// counted counts a grant or list write by its result.
func (c *Controller) counted(err error) {
	if err != nil {
		c.metrics.GrantWrites.WithLabelValues("error").Inc()
		return
	}
	c.metrics.GrantWrites.WithLabelValues("ok").Inc()
}
