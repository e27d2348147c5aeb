package mcscontroller

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// derivedMode is what a sync does with a service's derived Service.
type derivedMode int

const (
	derivedNone  derivedMode = iota // none (deleted if there is one)
	derivedApply                    // applied, its ClusterIPs the import's
	derivedKeep                     // kept as it is: a ClusterSetIP service turned Headless, for DampMax
)

// job is the sync of one service: what it should be (im nil: nothing to
// write, only what it no longer wants to delete).
type job struct {
	k       clusterset.Key
	im      *clusterset.Import
	cur     map[string]*share
	out     *outcome
	derived derivedMode
}

// plan decides what each dirty service should be, and returns the syncs
// of those with something to write and the notes of every dirty service
// (those of the syncs are added by them). The services imported before go
// first, then the new ones by the age of their oldest export and by name:
// the caps never refuse a service already imported, and admit the oldest
// new ones.
func (c *Controller) plan(dirty map[clusterset.Key]bool, groups map[clusterset.Key][]*store.Pod,
	held map[clusterset.Key]map[string][]*discoveryv1.EndpointSlice, outOf map[string]time.Duration, now time.Time) (map[clusterset.Key]job, map[clusterset.Key]notes) {
	type cand struct {
		k      clusterset.Key
		old    *outcome
		stored *unstructured.Unstructured
		cur    map[string]*share
		oldest time.Time
	}
	said := map[clusterset.Key]notes{}
	before := map[string]int{}
	var cands []cand
	for k := range dirty {
		said[k] = nil
		old := c.done[k]
		if old != nil {
			s, cf := old.counts()
			c.nslices, c.nconflicts = c.nslices-s, c.nconflicts-cf
			c.count(k, old, -1, before)
			delete(c.done, k)
		}
		delete(c.refused, k)
		cur := shares(groups[k])[k]
		if c.refusedNS[k.Namespace] {
			if len(cur) > 0 {
				n := notes{}
				n.add("namespace", ReasonNamespace, "namespace %s is one no import is written to", k.Namespace)
				said[k] = n
			}
			continue
		}
		if _, ok, _ := c.namespaces.GetByKey(k.Namespace); !ok {
			continue // never create a namespace: no import where it does not exist
		}
		cd := cand{k: k, old: old, cur: cur, stored: c.storedImport(k)}
		for _, s := range cur {
			if t := s.entry.Exported(); cd.oldest.IsZero() || t.Before(cd.oldest) {
				cd.oldest = t
			}
		}
		cands = append(cands, cd)
	}
	slices.SortFunc(cands, func(a, b cand) int {
		ea, eb := a.old != nil || a.stored != nil, b.old != nil || b.stored != nil
		if ea != eb {
			if ea {
				return -1
			}
			return 1
		}
		return cmp.Or(a.oldest.Compare(b.oldest), cmp.Compare(a.k.String(), b.k.String()))
	})

	jobs := map[clusterset.Key]job{}
	for _, cd := range cands {
		k := cd.k
		var n notes
		out := &outcome{}
		if cd.old != nil {
			out.memo = cd.old.memo
		}
		existing := cd.old != nil || cd.stored != nil
		// Asked only under a cluster cap; the stored import's clusters are
		// read once (a hub's import names a thousand).
		var storedClusters []string
		storedRead := false
		hadShare := func(cl string) bool {
			if cd.old != nil {
				return slices.Contains(cd.old.clusters, cl)
			}
			if !storedRead && cd.stored != nil {
				storedClusters, storedRead = statusClusters(cd.stored), true
			}
			return slices.Contains(storedClusters, cl)
		}
		if !existing && len(cd.cur) > 0 && capped(c.cfg.MaxImportsPerNamespace, c.perNS[k.Namespace]) {
			n.add("cap", ReasonNamespaceCap, "not imported: namespace %s has %d imports, its cap (the ones imported first are kept)",
				k.Namespace, c.perNS[k.Namespace])
			said[k] = n
			c.refused[k] = true
			continue
		}
		var exports []clusterset.Export
		var families []string // the entries' ipFamilies
		cur := map[string]*share{}
		var over []string
		usable := false
		// The shares of peers out of contact that their export's stale
		// policy leaves out, and when to look again at those it keeps.
		local := c.localCluster()
		hasLocal := func() bool { return hasReady(cd.cur[local]) }
		var recheck time.Duration
		stale := func(cl string, e *annotation.Export) bool {
			drop, again := dropStale(e, outOf[cl], hasLocal)
			if drop {
				n.add("stale/"+cl, reasonStaleDropped, "cluster %s: out of contact for %s: its endpoints are left out, as its export's stale policy (%s) says",
					cl, outOf[cl].Round(time.Second), annotation.FormatStaleEndpoints(e.StaleEndpoints, e.StaleGraceSeconds))
			}
			if again > 0 && (recheck == 0 || again < recheck) {
				recheck = again
			}
			return drop
		}
		for _, cl := range slices.Sorted(maps.Keys(cd.cur)) {
			if stale(cl, &cd.cur[cl].entry) {
				continue
			}
			if capped(c.cfg.MaxImportsPerCluster, c.perCluster[cl]) && !hadShare(cl) {
				over = append(over, cl)
				continue
			}
			s := cd.cur[cl]
			cur[cl] = s
			exports = append(exports, toExport(cl, &s.entry))
			families = append(families, s.entry.IPFamilies.List()...)
			out.clusters = append(out.clusters, cl)
			if addressNotes(&n, cl, s.endpoints) {
				usable = true
			}
		}
		if len(over) > 0 {
			n.add("cap", ReasonClusterCap, "the share of %s not imported: each takes part in %d imports, its cap (the ones imported first are kept)",
				clusterset.ClusterList(over), c.cfg.MaxImportsPerCluster)
			c.refused[k] = true
		}
		// The clusters whose share is not known (see heldSlices) keep their
		// slices as they are; no stale policy applies to them (their
		// entry is not known), only the expiry.
		for _, cl := range slices.Sorted(maps.Keys(held[k])) {
			for _, s := range held[k][cl] {
				out.addSlice(s)
				if len(s.Endpoints) > 0 {
					usable = true
				}
			}
			out.clusters = append(out.clusters, cl)
		}
		if recheck > 0 {
			c.queue.AddAfter(k, recheck)
		}
		said[k] = n
		if len(exports) == 0 && len(out.slices) > 0 {
			// Only shares not known: the service stands as it is (its
			// ServiceImport, derived Service and every slice) until a
			// cluster is heard from or expires. With current shares
			// beside them, those are planned and written as usual and
			// only the held slices stay as they are (heldPorts).
			objs, _ := c.slices.ByIndex(indexService, k.String())
			for _, o := range objs {
				if s, ok := o.(*discoveryv1.EndpointSlice); ok && !out.hasSliceUnsorted(s.Namespace, s.Name) {
					out.addSlice(s)
				}
			}
			for _, cl := range slices.Sorted(maps.Keys(cur)) {
				if !slices.Contains(out.clusters, cl) {
					out.clusters = append(out.clusters, cl)
				}
			}
			out.service = k.Namespace + "/" + clusterset.DerivedServiceName(k.Name)
			slices.Sort(out.slices)
			c.count(k, out, 1, before)
			c.done[k] = out
			continue
		}
		if len(exports) == 0 {
			continue
		}
		im := clusterset.Merge(exports)
		if im.Spec.Type == mcsv1beta1.Headless {
			// No derived Service gives a Headless import its families:
			// they are the exported Services' (the entries' ipFamilies),
			// else, when no entry says them (older annotators), those of
			// the endpoints' addresses.
			im.Spec.IPFamilies = exportedFamilies(families)
		}
		if im.Spec.Type == mcsv1beta1.Headless && len(im.Spec.IPFamilies) == 0 {
			var eps []clusterset.Endpoint
			for _, s := range cur {
				eps = append(eps, s.endpoints...)
			}
			var have []discoveryv1.AddressType
			for _, sls := range held[k] {
				for _, s := range sls {
					have = append(have, s.AddressType)
				}
			}
			im.Spec.IPFamilies = clusterset.Families(eps, have...)
		}
		if len(held[k]) > 0 {
			heldPorts(&im, held[k], cd.stored)
		}
		out.merged = &im
		out.notes = n
		if im.Conflict() {
			// Told on the ServiceImport too (the local ServiceExport, when
			// there is one, gets the condition and its own Event).
			out.notes.add("conflict", ReasonConflict, "%s", im.Message)
		}
		c.count(k, out, 1, before)
		c.done[k] = out

		// A derived Service (a ClusterSetIP) once some cluster has an
		// endpoint address: a service of Pods that never got one makes
		// none. Once made, it stays while the service is a ClusterSetIP
		// one, and for DampMax after it turns Headless.
		had := cd.old != nil && cd.old.service != "" || c.derivedExists(k)
		mode := derivedNone
		switch {
		case im.Spec.Type == mcsv1beta1.ClusterSetIP:
			delete(c.headless, k)
			if usable || had {
				mode = derivedApply
			} else {
				out.notes.add("address", reasonNoAddress, "no endpoint address in any cluster yet: no derived Service, no ClusterSetIP")
			}
		case had && c.cfg.Damp > 0:
			since, ok := c.headless[k]
			if !ok {
				since = now
				c.headless[k] = now
			}
			if until := since.Add(c.cfg.DampMax); now.Before(until) {
				mode = derivedKeep
				out.service = k.Namespace + "/" + clusterset.DerivedServiceName(k.Name)
				if cd.old != nil && cd.old.service != "" {
					out.service = cd.old.service
				}
				c.queue.AddAfter(k, until.Sub(now)) // deleted then if still Headless
			} else {
				delete(c.headless, k)
			}
		default:
			delete(c.headless, k)
		}
		jobs[k] = job{k, &im, cur, out, mode}
	}
	// A namespace or cluster with fewer services than before has room: the
	// services refused for a cap are looked at again.
	for key, n := range before {
		ns, isNS := strings.CutPrefix(key, "ns/")
		if isNS && c.perNS[ns] < n || !isNS && c.perCluster[strings.TrimPrefix(key, "cluster/")] < n {
			for k := range c.refused {
				c.queue.Add(k)
			}
			break
		}
	}
	return jobs, said
}

// capped says whether a count has reached its cap (negative: no cap).
func capped(limit, n int) bool { return limit >= 0 && n >= limit }

// count adds (by 1) or takes away (by -1) o's service from the counts the
// caps read, noting in before each count as it was before the plan.
func (c *Controller) count(k clusterset.Key, o *outcome, by int, before map[string]int) {
	add := func(m map[string]int, key, name string) {
		if _, ok := before[key]; !ok {
			before[key] = m[name]
		}
		if m[name] += by; m[name] <= 0 {
			delete(m, name)
		}
	}
	add(c.perNS, "ns/"+k.Namespace, k.Namespace)
	for _, cl := range o.clusters {
		add(c.perCluster, "cluster/"+cl, cl)
	}
}

// statusClusters are the clusters a stored ServiceImport names.
func statusClusters(u *unstructured.Unstructured) []string {
	list, _, _ := unstructured.NestedSlice(u.Object, "status", "clusters")
	var out []string
	for _, c := range list {
		if m, ok := c.(map[string]any); ok {
			if s, ok := m["cluster"].(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// heldPorts keeps in im, merged from the current shares only, what the held
// slices of the clusters not heard from (see heldSlices) still serve: those
// clusters are named in it, and a port of the stored ServiceImport that no
// current share has stays while a held slice names it, so the derived
// Service does not lose a port only a cluster out of contact exposes. Only
// names are read out of the held slices, and only to keep a port this
// controller wrote before: whoever may write EndpointSlices there can make
// no port with them that it could not make with a Service of its own.
func heldPorts(im *clusterset.Import, held map[string][]*discoveryv1.EndpointSlice, stored *unstructured.Unstructured) {
	for cl := range held {
		if !slices.Contains(im.Clusters, cl) {
			im.Clusters = append(im.Clusters, cl)
		}
	}
	slices.Sort(im.Clusters)
	if stored == nil {
		return
	}
	names := map[string]bool{}
	for _, sls := range held {
		for _, s := range sls {
			for _, p := range s.Ports {
				if p.Name != nil {
					names[*p.Name] = true
				}
			}
		}
	}
	list, _, _ := unstructured.NestedSlice(stored.Object, "spec", "ports")
	added := false
	for _, o := range list {
		m, ok := o.(map[string]any)
		if !ok {
			continue
		}
		var p mcsv1beta1.ServicePort
		if runtime.DefaultUnstructuredConverter.FromUnstructured(m, &p) != nil || !names[p.Name] {
			continue
		}
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		if slices.ContainsFunc(im.Spec.Ports, func(q mcsv1beta1.ServicePort) bool {
			return q.Name == p.Name || q.Port == p.Port && q.Protocol == p.Protocol
		}) {
			continue
		}
		im.Spec.Ports = append(im.Spec.Ports, p)
		added = true
	}
	if added {
		slices.SortFunc(im.Spec.Ports, func(a, b mcsv1beta1.ServicePort) int {
			return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
		})
	}
}
