package table

import (
	"time"

	"github.com/miekg/dns"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clustersetip"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// ImportState says whether ServiceImports are read in the local cluster
// (internal/clustersetip's, shared with the snapshot): whether an MCS
// controller is expected to allocate the ClusterSetIPs of the services
// exported as ClusterSetIP (Index.answer).
type ImportState = clustersetip.ImportState

// The import states (see internal/clustersetip).
const (
	ImportsUnknown = clustersetip.ImportsUnknown
	ImportsServed  = clustersetip.ImportsServed
	ImportsAbsent  = clustersetip.ImportsAbsent
)

// SetImportState records whether ServiceImports are read; the next index
// answers after it.
func (t *Table) SetImportState(s ImportState) {
	t.mu.Lock()
	if t.importState == s {
		t.mu.Unlock()
		return
	}
	t.importState = s
	t.gen++
	t.mu.Unlock()
	t.signal()
}

// ImportState returns the state last set.
func (t *Table) ImportState() ImportState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.importState
}

// ImportState is the import state the index answers after.
func (ix *Index) ImportState() ImportState { return ix.importState }

// exportedClusterSetIP reports whether sk is exported as ClusterSetIP by the
// export that wins KEP-1645's conflict resolution among pods' entries: the
// oldest (an entry without exportedAt is older than any), the lower cluster ID
// on a tie. Entries without a type are Headless (annotation.Service).
func exportedClusterSetIP(sk svcKey, pods []*store.Pod) bool {
	switch exportTypes(sk, pods) {
	case typesNone, typesHeadless:
		return false
	case typesClusterSetIP:
		return true
	}
	// The entries disagree: the oldest one decides.
	var best, last *annotation.Export
	var bestAt time.Time
	for _, p := range pods {
		for i := range p.Exports {
			e := &p.Exports[i]
			if e.Namespace != sk.Namespace || e.Name != sk.Name {
				continue
			}
			if last != nil && e.ExportedAt == last.ExportedAt && e.Cluster == last.Cluster && e.Type == last.Type {
				continue // the Pods of one service in one cluster repeat their entry
			}
			last = e
			at := e.Exported() // no exportedAt: the zero time, older than any
			if best == nil || annotation.CompareAge(at, e.Cluster, bestAt, best.Cluster) < 0 {
				best, bestAt = e, at
			}
		}
	}
	return best != nil && best.ServiceType() == annotation.TypeClusterSetIP
}

// The types pods' entries for a service give it (exportTypes).
const (
	typesNone         = 0
	typesHeadless     = 1 // some entries are Headless
	typesClusterSetIP = 2 // some are ClusterSetIP
	typesMixed        = typesHeadless | typesClusterSetIP
)

// exportTypes reports which types pods' entries for sk give it: when they
// all agree, no entry's age needs to be read.
func exportTypes(sk svcKey, pods []*store.Pod) int {
	types := typesNone
	for _, p := range pods {
		for i := range p.Exports {
			e := &p.Exports[i]
			if e.Namespace != sk.Namespace || e.Name != sk.Name {
				continue
			}
			if e.ServiceType() == annotation.TypeClusterSetIP {
				types |= typesClusterSetIP
			} else {
				types |= typesHeadless
			}
			if types == typesMixed {
				return types
			}
		}
	}
	return types
}

// withServiceForm returns s with its SRV answers in service form: each
// endpoint-form answer's ports with the service name as the target (the
// port an endpoint listens on, as the service name's addresses are the
// endpoints'), identical ports collapsed, no additional section. It is what
// a ClusterSetIP service answers where no controller can allocate its
// ClusterSetIP. Endpoint names keep their answers.
func withServiceForm(s *Service, fqdn string, ttl uint32) *Service {
	form := &Service{Namespace: s.Namespace, Name: s.Name, A: s.A, AAAA: s.AAAA, Hosts: s.Hosts,
		clustersA: s.clustersA, clustersAAAA: s.clustersAAAA,
		Endpoints: s.Endpoints, FailOpen: s.FailOpen, SRV: make(map[string]*SRVSet, len(s.SRV))}
	sets := map[*SRVSet]*SRVSet{} // endpoint-form sets shared by several prefixes stay shared
	for prefix, set := range s.SRV {
		if f := sets[set]; f != nil {
			form.SRV[prefix] = f
			continue
		}
		f := &SRVSet{Clusters: set.Clusters}
		for _, r := range set.SRV {
			dup := false
			for _, have := range f.SRV {
				dup = dup || have.Port == r.Port
			}
			if !dup {
				f.SRV = append(f.SRV, dns.SRV{Hdr: r.Hdr, Priority: r.Priority, Port: r.Port, Target: fqdn})
			}
		}
		for i := range f.SRV {
			f.SRV[i].Weight = uint16(max(1, 100/len(f.SRV)))
			f.SRV[i].Hdr.Ttl = ttl
		}
		sets[set] = f
		form.SRV[prefix] = f
	}
	return form
}

// serviceForm returns the service's answers in service form
// (withServiceForm), rendered on the first call: only services exported as
// ClusterSetIP in a cluster that serves no ServiceImports need them.
func (s *Service) serviceForm(zone string, ttl uint32) *Service {
	s.formOnce.Do(func() { s.form = withServiceForm(s, s.Name+"."+s.Namespace+".svc."+zone, ttl) })
	return s.form
}
