package mcscontroller

import (
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// records is what the controller reads of the record store that the
// sources feed (a *store.Store): every cluster's records (Pods("") for all),
// and its change feed. The store keeps the record of an unchanged Pod as it
// was, so that the pointers of a service's records tell whether they
// changed.
type records interface {
	Pods(cluster string) []*store.Pod
	Subscribe(func([]store.Change))
}

// onRecordChange calls f after each change of rs's records (quick: the
// store calls it before its next write).
func onRecordChange(rs records, f func()) {
	rs.Subscribe(func([]store.Change) { f() })
}
