package mcscontroller

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// syncService writes one service's ServiceImport, derived Service (as mode
// says) and the slices of the clusters whose share is current. What it
// leaves out goes to out.notes.
func (c *Controller) syncService(ctx context.Context, k clusterset.Key, im *clusterset.Import, cur map[string]*share, out *outcome, mode derivedMode) error {
	// A derived Service held from before (a service turned back from
	// Headless) gives the import its IPs at once, not after a write without.
	var ips []string
	var families []corev1.IPFamily
	var want *corev1.Service
	problem := ""
	if mode == derivedApply {
		want = clusterset.DerivedService(k, im, metav1.OwnerReference{}) // the owner is set once the import is written
		problem = derivedProblem(want)
		if svc := c.heldDerived(k); svc != nil && problem == "" {
			ips, families = svc.Spec.ClusterIPs, svc.Spec.IPFamilies
		}
	}
	si, err := c.applyImport(ctx, k, im, ips, families, out)
	if err != nil {
		return err
	}
	out.importUID = si.GetUID()
	owner := metav1.OwnerReference{APIVersion: c.importsGVR.GroupVersion().String(), Kind: "ServiceImport", Name: k.Name, UID: si.GetUID()}
	derived := ""
	if mode == derivedApply {
		want.OwnerReferences = []metav1.OwnerReference{owner}
		if problem != "" {
			out.notes.add("service", ReasonInvalidService, "no derived Service, so no ClusterSetIP (the API server would refuse it): %s", problem)
		} else {
			svc, err := c.applyDerived(ctx, k, want, out)
			if err != nil {
				return err
			}
			if svc != nil {
				derived = svc.Name
				out.service = k.Namespace + "/" + derived
				if len(svc.Spec.ClusterIPs) > 0 && svc.Spec.ClusterIP != corev1.ClusterIPNone {
					if _, err := c.applyImport(ctx, k, im, svc.Spec.ClusterIPs, svc.Spec.IPFamilies, out); err != nil {
						return err
					}
				}
			}
		}
	}
	// Every slice of every cluster first, then their writes, sliceWriters
	// at a time: a change that touches many clusters' shares of one service
	// (a relay hub's origins) is not one write after another.
	type job struct {
		cl    string
		sl    *discoveryv1.EndpointSlice
		taken string
		wrote bool
		rv    string
		err   error
	}
	var jobs []*job
	// What every share's slices are built from besides its own entry and
	// records (memo): a change to one cluster's share of a relay hub's
	// service of a thousand origins builds and compares that cluster's
	// slices, not every cluster's.
	imBytes, _ := json.Marshal(im)
	common := memoSum(0, imBytes, []byte(derived), []byte(owner.APIVersion), []byte(owner.Kind), []byte(owner.Name), []byte(owner.UID))
	memo := make(map[string]*sliceMemo, len(cur))
	now := time.Now()
	for cl, s := range cur {
		entry, _ := json.Marshal(s.entry)
		relays := c.cfg.Relay && c.relays(cl)
		sum := memoSum(common, entry, []byte(strconv.FormatBool(relays)))
		if m := out.memo[cl]; m != nil && m.sum == sum && slices.Equal(m.recs, s.recs) && c.memoWritten(m) {
			memo[cl] = m
			for _, ms := range m.slices {
				out.slices = append(out.slices, ms.key)
			}
			continue
		}
		// A share written again soon after its last write waits (its own
		// damping, not the service's): its slices stay as stored until
		// then, and the other clusters' shares do not wait for it. When
		// this sync wrote the ServiceImport or derived Service (ports,
		// type: paced by the service's own damping), every share follows.
		if t, ok := c.shareNotBefore[shareKey{k, cl}]; ok && now.Before(t) && !out.wrote {
			out.slices = append(out.slices, c.storedShare(k, cl)...)
			if out.due.IsZero() || t.Before(out.due) {
				out.due = t
			}
			continue
		}
		var limit clusterset.SliceLimit
		var byAddr map[string][]*store.Pod
		if relays {
			byAddr = s.byAddress()
			limit = relaySlices(byAddr, c.cfg.LocalCluster)
		}
		for _, sl := range clusterset.LimitedSlices(k, cl, derived, im, s.endpoints, owner, limit) {
			sl.Annotations = map[string]string{AnnotationExport: string(entry)}
			if relays {
				relayAnnotate(sl, byAddr, c.cfg.LocalCluster)
			}
			jobs = append(jobs, &job{cl: cl, sl: sl})
		}
		memo[cl] = &sliceMemo{sum: sum, recs: s.recs}
	}
	sem := make(chan struct{}, sliceWriters)
	var wg sync.WaitGroup
	for _, j := range jobs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			j.taken, j.wrote, j.rv, j.err = c.applySlice(ctx, j.sl)
		}()
	}
	wg.Wait()
	var errs []error
	for _, j := range jobs {
		if j.wrote && !slices.Contains(out.wroteShares, j.cl) {
			out.wroteShares = append(out.wroteShares, j.cl)
		}
		key := j.sl.Namespace + "/" + j.sl.Name
		if j.taken != "" || j.err != nil || j.rv == "" {
			// Not known to be written as built: built again next time.
			delete(memo, j.cl)
		} else if m := memo[j.cl]; m != nil {
			m.slices = append(m.slices, memoSlice{key: key, rv: j.rv})
		}
		if j.taken != "" {
			out.notes.add("slice/"+j.sl.Name, ReasonNameTaken, "cluster %s: EndpointSlice %s not written: %s", j.cl, j.sl.Name, j.taken)
			c.metrics.Foreign.Inc()
			continue
		}
		out.slices = append(out.slices, key)
		if j.err != nil {
			errs = append(errs, j.err)
		}
	}
	out.memo = memo
	return errors.Join(errs...)
}

// storedShare are the keys of the slices the informer holds of cluster
// cl's share of service k.
func (c *Controller) storedShare(k clusterset.Key, cl string) []string {
	var keys []string
	objs, _ := c.slices.ByIndex(indexService, k.String())
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok && s.Labels[mcsv1beta1.LabelSourceCluster] == cl {
			keys = append(keys, s.Namespace+"/"+s.Name)
		}
	}
	return keys
}

// memoSum hashes what a share's slices are built from besides its own
// records (sliceMemo), after seed.
func memoSum(seed uint64, parts ...[]byte) uint64 {
	h := fnv.New64a()
	h.Write(binary.LittleEndian.AppendUint64(nil, seed))
	for _, b := range parts {
		h.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(b))))
		h.Write(b)
	}
	return h.Sum64()
}

// memoWritten says whether every slice of m is in the informer's cache at
// the resourceVersion m found it or wrote it at.
func (c *Controller) memoWritten(m *sliceMemo) bool {
	if len(m.slices) == 0 {
		return len(m.recs) == 0 // a share of no endpoint has no slice; one of endpoints always has
	}
	for _, ms := range m.slices {
		obj, ok, _ := c.slices.GetByKey(ms.key)
		if s, isSlice := obj.(*discoveryv1.EndpointSlice); !ok || !isSlice || s.ResourceVersion != ms.rv {
			return false
		}
	}
	return true
}

// applied returns the hash of obj, and whether the stored object's
// annotations (nil: none stored) already carry it.
func applied(stored map[string]string, obj any) (string, bool) {
	b, _ := json.Marshal(obj)
	h := fnv.New64a()
	h.Write(b)
	sum := hex.EncodeToString(h.Sum(nil))
	return sum, stored[AnnotationApplied] == sum
}

// applyImport applies the ServiceImport of k (with ips, when known) and its
// status, unless the stored one already says the same. It returns the
// ServiceImport as stored.
func (c *Controller) applyImport(ctx context.Context, k clusterset.Key, im *clusterset.Import, ips []string, families []corev1.IPFamily, o *outcome) (*unstructured.Unstructured, error) {
	spec := im.Spec
	if spec.Type == mcsv1beta1.ClusterSetIP {
		// A ClusterSetIP import's are its derived Service's; a Headless
		// one's, the merge's.
		spec.IPs, spec.IPFamilies = ips, families
	}
	var cur map[string]string
	var stored *unstructured.Unstructured
	if o, err := c.imports.ByNamespace(k.Namespace).Get(k.Name); err == nil {
		if u, ok := o.(*unstructured.Unstructured); ok {
			cur, stored = u.GetAnnotations(), u
			if u.GetLabels()[clusterset.LabelManagedBy] != clusterset.ManagedBy {
				c.metrics.Foreign.Inc()
				return nil, fmt.Errorf("a ServiceImport %s exists that this controller did not create: left alone", k)
			}
		}
	}
	if spec.Type == mcsv1beta1.ClusterSetIP && ips == nil && stored != nil {
		// Until the derived Service has its IPs, keep what is stored.
		if old, _, _ := unstructured.NestedStringSlice(stored.Object, "spec", "ips"); len(old) > 0 {
			return stored, nil
		}
	}
	obj := &mcsv1beta1.ServiceImport{
		TypeMeta: metav1.TypeMeta{APIVersion: c.importsGVR.GroupVersion().String(), Kind: "ServiceImport"},
		ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name,
			Labels:      merge(im.Labels, map[string]string{clusterset.LabelManagedBy: clusterset.ManagedBy}),
			Annotations: merge(im.Annotations, nil)},
		Spec: spec,
	}
	for _, cl := range im.Clusters {
		obj.Status.Clusters = append(obj.Status.Clusters, mcsv1beta1.ClusterStatus{Cluster: cl})
	}
	sum, same := applied(cur, obj)
	if same {
		return stored, nil
	}
	// A new ClusterSetIP import is applied for its UID (the derived
	// Service's owner), then again with the derived Service's IPs: the
	// first apply leaves out the status and the hash, which the second
	// writes.
	first := spec.Type == mcsv1beta1.ClusterSetIP && ips == nil && stored == nil
	if !first {
		obj.Annotations[AnnotationApplied] = sum
	}
	u, err := toUnstructured(obj)
	if err != nil {
		return nil, err
	}
	status := u.Object["status"]
	delete(u.Object, "status")
	ri := c.dyn.Resource(c.importsGVR).Namespace(k.Namespace)
	o.wrote = true
	out, err := ri.Apply(ctx, k.Name, u, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	c.metrics.write("serviceimport", err)
	if err != nil || first {
		return out, err
	}
	st := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": u.GetAPIVersion(), "kind": "ServiceImport",
		"metadata": map[string]any{"namespace": k.Namespace, "name": k.Name},
		"status":   status,
	}}
	_, err = ri.ApplyStatus(ctx, k.Name, st, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	c.metrics.write("serviceimport_status", err)
	return out, err
}

// applyDerived applies want, the derived Service of a ClusterSetIP import,
// and returns it as stored (with the ClusterIPs the API server allocated).
// A Service of its name that is not this service's derived Service (not
// made by this controller, or for another service) is left alone: nil,
// noted.
func (c *Controller) applyDerived(ctx context.Context, k clusterset.Key, want *corev1.Service, o *outcome) (*corev1.Service, error) {
	var cur *corev1.Service
	if obj, ok, _ := c.services.GetByKey(k.Namespace + "/" + want.Name); ok {
		cur, _ = obj.(*corev1.Service)
	} else if s, err := c.client.CoreV1().Services(k.Namespace).Get(ctx, want.Name, metav1.GetOptions{}); err == nil {
		cur = s
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	if cur != nil && (cur.Labels[clusterset.LabelManagedBy] != clusterset.ManagedBy || cur.Labels[mcsv1beta1.LabelServiceName] != k.Name) {
		c.metrics.Foreign.Inc()
		o.notes.add("service", ReasonNameTaken, "no derived Service, so no ClusterSetIP: a Service %s exists that this controller did not make for this service (labels %v): left alone",
			want.Name, cur.Labels)
		return nil, nil
	}
	var stored map[string]string
	if cur != nil {
		stored = cur.Annotations
	}
	sum, same := applied(stored, want)
	if same {
		return cur, nil
	}
	want.Annotations = map[string]string{AnnotationApplied: sum}
	body, err := json.Marshal(want)
	if err != nil {
		return nil, err
	}
	o.wrote = true
	out, err := c.client.CoreV1().Services(k.Namespace).Patch(ctx, want.Name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: FieldManager, Force: ptrTrue()})
	c.metrics.write("service", err)
	return out, err
}

// sliceWriters bounds the writes of one service's slices in flight (the
// client's rate limit still applies).
const sliceWriters = 16

// applySlice applies want unless the stored slice already says the same
// (wrote: it was written). A slice of its name that is not this service's
// and cluster's (not made by this controller, or for another service or
// cluster) is left alone: taken says why. Safe to call concurrently.
func (c *Controller) applySlice(ctx context.Context, want *discoveryv1.EndpointSlice) (taken string, wrote bool, rv string, err error) {
	var cur *discoveryv1.EndpointSlice
	if obj, ok, _ := c.slices.GetByKey(want.Namespace + "/" + want.Name); ok {
		cur, _ = obj.(*discoveryv1.EndpointSlice)
	} else if s, err := c.client.DiscoveryV1().EndpointSlices(want.Namespace).Get(ctx, want.Name, metav1.GetOptions{}); err == nil {
		cur = s
	} else if !apierrors.IsNotFound(err) {
		return "", false, "", err
	}
	var stored map[string]string
	if cur != nil {
		for _, l := range []string{discoveryv1.LabelManagedBy, mcsv1beta1.LabelServiceName, mcsv1beta1.LabelSourceCluster} {
			if cur.Labels[l] != want.Labels[l] {
				return fmt.Sprintf("a slice of that name exists that this controller did not make for this service and cluster (%s=%q)", l, cur.Labels[l]), false, "", nil
			}
		}
		stored = cur.Annotations
	}
	sum, same := applied(stored, want)
	if same && sameContent(cur, want) {
		return "", false, cur.ResourceVersion, nil
	}
	want.Annotations[AnnotationApplied] = sum
	body, err := json.Marshal(want)
	if err != nil {
		return "", false, "", err
	}
	got, err := c.client.DiscoveryV1().EndpointSlices(want.Namespace).Patch(ctx, want.Name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: FieldManager, Force: ptrTrue()})
	c.metrics.write("endpointslice", err)
	if err != nil || got == nil {
		return "", true, "", err
	}
	return "", true, got.ResourceVersion, nil
}

// sameContent says whether a stored slice holds the address type,
// endpoints and ports want says (with the API server's defaults for a
// port's name and protocol): one that someone else changed is written
// again, whatever its annotations say. Its annotations are no proof of its
// content: whoever may write EndpointSlices may keep them.
func sameContent(cur, want *discoveryv1.EndpointSlice) bool {
	return cur != nil && cur.AddressType == want.AddressType &&
		apiequality.Semantic.DeepEqual(cur.Endpoints, want.Endpoints) &&
		apiequality.Semantic.DeepEqual(defaultPorts(cur.Ports), defaultPorts(want.Ports))
}

// defaultPorts are ports with the API server's defaults set: an empty name
// and TCP.
func defaultPorts(ports []discoveryv1.EndpointPort) []discoveryv1.EndpointPort {
	out := make([]discoveryv1.EndpointPort, len(ports))
	for i, p := range ports {
		if p.Name == nil {
			p.Name = ptr.To("")
		}
		if p.Protocol == nil {
			p.Protocol = ptr.To(corev1.ProtocolTCP)
		}
		out[i] = p
	}
	return out
}

// heldDerived is the derived Service of k the informer holds, when it has
// ClusterIPs (nil: none).
func (c *Controller) heldDerived(k clusterset.Key) *corev1.Service {
	o, ok, _ := c.services.GetByKey(k.Namespace + "/" + clusterset.DerivedServiceName(k.Name))
	svc, _ := o.(*corev1.Service)
	if !ok || svc == nil || svc.Labels[mcsv1beta1.LabelServiceName] != k.Name || len(svc.Spec.ClusterIPs) == 0 || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil
	}
	return svc
}

// derivedExists says whether a derived Service of k is held (made by this
// controller, perhaps before a restart).
func (c *Controller) derivedExists(k clusterset.Key) bool {
	objs, _ := c.services.ByIndex(indexService, k.String())
	return len(objs) > 0
}

func toUnstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	return u, nil
}

func merge(a, b map[string]string) map[string]string {
	out := make(map[string]string, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func ptrTrue() *bool { t := true; return &t }
