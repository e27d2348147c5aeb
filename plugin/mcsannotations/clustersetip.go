package mcsannotations

import (
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/mcsannotations/mcsannotations/internal/serviceimport"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/table"
	"github.com/mcsannotations/mcsannotations/mcsapi"
)

// ClusterSetIP services: the local cluster's MCS ServiceImports of type
// ClusterSetIP with IPs (serviceimport.Watcher) go into the table, whose
// index answers their service and port names with the ClusterSetIP, and into
// the snapshot, so that they are answered from the first query after a
// restart while the API server is unreachable.

// importRecheck is how often discovery is asked again for ServiceImports
// (the CRD may be installed later); tests shorten it.
var importRecheck = 30 * time.Second

// importEvents turns the ServiceImport watcher's callbacks into the table's
// ClusterSetIP services, the snapshot, log lines and metrics.
func (m *MCS) importEvents() serviceimport.Events {
	return serviceimport.Events{
		Changed: func(list []table.ClusterSetIP) {
			m.table.SetClusterSetIPs(list)
			m.journalImports(list)
		},
		Rejected: func(ns, name string, rej []serviceimport.Rejection) {
			for _, r := range rej {
				rejectedImports.WithLabelValues(string(r.Reason)).Inc()
			}
			log.Warningf("ServiceImport %s/%s: %d things ignored: first: %s", ns, name, len(rej), rej[0])
		},
		Watching: func(gvr schema.GroupVersionResource) {
			m.table.SetImportState(table.ImportsServed)
			log.Infof("ServiceImports: watching %s: services with a ClusterSetIP ServiceImport answer with its IPs", gvr.GroupVersion())
		},
		Absent: func() {
			m.table.SetImportState(table.ImportsAbsent)
			log.Infof("ServiceImports: the API server serves no %s ServiceImports: no ClusterSetIP services (looking again every %s)",
				mcsapi.Group, importRecheck)
		},
	}
}

// journalImports replaces the snapshot's ClusterSetIP services with list.
func (m *MCS) journalImports(list []table.ClusterSetIP) {
	if st := m.store.Load(); st != nil {
		m.saveImports(st, list)
	}
}

// saveImports replaces the ClusterSetIP services in st with list.
func (m *MCS) saveImports(st *snapshot.Store, list []table.ClusterSetIP) {
	if bad := st.ReplaceImports(list, m.table.ImportState()); bad > 0 {
		snapshotErrors.WithLabelValues("encode").Add(float64(bad))
	}
}

// loadImports seeds the table's ClusterSetIP services from the snapshot; the
// watcher's first complete list (or word that the CRD is gone) replaces them.
func (m *MCS) loadImports(st *snapshot.Store) {
	list, bad, err := st.LoadClusterSetIPs()
	snapshotErrors.WithLabelValues("bad_record").Add(float64(bad))
	if err != nil {
		snapshotErrors.WithLabelValues("load").Inc()
		log.Errorf("snapshot %s: loading the ClusterSetIP services: %v", m.snapshotPath, err)
	}
	m.table.SetClusterSetIPs(list)
	state, err := st.LoadImportState()
	if err == nil && m.table.ImportState() == table.ImportsUnknown {
		// The watcher's first word replaces it.
		m.table.SetImportState(state)
	}
	log.Infof("snapshot: %d ClusterSetIP services (from ServiceImports); ServiceImports %s", len(list), state)
}
