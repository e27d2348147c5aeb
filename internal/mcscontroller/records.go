package mcscontroller

import (
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// records is what the controller reads of the record store that the
// sources feed: every cluster's records (Pods("") for all), and a call on
// each change. The store keeps the record of an unchanged Pod as it was, so
// that the pointers of a service's records tell whether they changed.
type records interface {
	Pods(cluster string) []*table.Pod
	OnPodChange(func(table.Key, *table.Pod))
}

// onRecordChange calls f after each change of rs's records (quick: the
// store calls it holding its lock).
func onRecordChange(rs records, f func()) {
	rs.OnPodChange(func(table.Key, *table.Pod) { f() })
}
