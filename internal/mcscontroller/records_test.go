package mcscontroller

import (
	"maps"
	"slices"
	"testing"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// The index follows the store's change feed: records already held when it
// subscribes, a record replaced (its old pointer goes), one that moves to
// another service (both are changed), one deleted, one that exports two
// services; groups holds the current clusters' records only.
func TestRecordIndex(t *testing.T) {
	st := store.New()
	web := exporter("a", "web", "10.0.0.1", annotation.TypeClusterSetIP)
	st.Upsert(web)
	calls := 0
	ix := indexRecords(st, func() { calls++ })
	key := func(name string) clusterset.Key { return clusterset.Key{Namespace: "ns", Name: name} }
	names := func(g []*store.Pod) []string {
		var out []string
		for _, p := range g {
			out = append(out, p.Cluster+"/"+p.Name+"@"+p.IPs[0].String())
		}
		slices.Sort(out)
		return out
	}
	all := func(string) bool { return true }
	check := func(what string, changed []string, current func(string) bool, want map[string][]string) {
		t.Helper()
		got := ix.takeChanged()
		var gotChanged []string
		for k := range got {
			gotChanged = append(gotChanged, k.Name)
		}
		slices.Sort(gotChanged)
		if !slices.Equal(gotChanged, changed) {
			t.Errorf("%s: changed %v, want %v", what, gotChanged, changed)
		}
		groups := map[string][]string{}
		for k, g := range ix.groups(nil, current) {
			groups[k.Name] = names(g)
		}
		if !maps.EqualFunc(groups, want, slices.Equal) {
			t.Errorf("%s: groups %v, want %v", what, groups, want)
		}
	}
	check("held before", []string{"web"}, all, map[string][]string{"web": {"a/web-a@10.0.0.1"}})

	st.Upsert(exporter("b", "web", "10.0.0.2", annotation.TypeClusterSetIP))
	moved := exporter("a", "web", "10.0.0.3", annotation.TypeClusterSetIP)
	st.Upsert(moved) // replaces web-a
	check("added and replaced", []string{"web"}, all, map[string][]string{"web": {"a/web-a@10.0.0.3", "b/web-b@10.0.0.2"}})

	api := *moved
	api.Common = &store.Common{Cluster: "a", Namespace: "ns", Exports: []annotation.Export{moved.Exports[0], moved.Exports[0]}}
	api.Exports[1].Name = "api"
	st.Upsert(&api) // web-a now exports web and api
	check("two services", []string{"api", "web"}, all, map[string][]string{"web": {"a/web-a@10.0.0.3", "b/web-b@10.0.0.2"}, "api": {"a/web-a@10.0.0.3"}})
	check("nothing changed", nil, func(cl string) bool { return cl == "b" }, map[string][]string{"web": {"b/web-b@10.0.0.2"}})

	st.Delete(api.Key())
	check("deleted", []string{"api", "web"}, all, map[string][]string{"web": {"b/web-b@10.0.0.2"}})
	if g := ix.groups(map[clusterset.Key]bool{key("api"): true, key("web"): true}, all); len(g) != 1 || len(g[key("web")]) != 1 {
		t.Errorf("groups of api and web: %v", g)
	}
	keys := map[clusterset.Key]bool{}
	ix.keysIn("ns", keys)
	ix.keysIn("other", keys)
	if !maps.Equal(keys, map[clusterset.Key]bool{key("web"): true}) {
		t.Errorf("keys in ns: %v", keys)
	}
	if calls != 5 {
		t.Errorf("%d calls, want 5 (the records held, then one per write)", calls)
	}
}
