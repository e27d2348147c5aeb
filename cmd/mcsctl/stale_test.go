package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Which policy applies to a cluster's endpoints out of contact: the
// sooner drop of the service's policy and the Corefile's expire; a
// drop-if-local policy only while the consumer has local endpoints.
func TestStaleApplies(t *testing.T) {
	for _, c := range []struct {
		policies          []string
		expire            time.Duration
		local, localKnown bool
		drops             bool
		after             time.Duration
		says              string
	}{
		{nil, 0, false, false, false, 0, "the service's serve (no expire): served as last seen however long"},
		{[]string{"serve"}, time.Hour, false, false, true, time.Hour, "the Corefile's expire 1h0m0s (stricter than the service's serve)"},
		{[]string{"drop-after=30s"}, 0, false, false, true, 30 * time.Second, "the service's drop-after=30s (stricter than the Corefile's no expire)"},
		{[]string{"drop-after=30s"}, time.Hour, false, false, true, 30 * time.Second, "the service's drop-after=30s (stricter than the Corefile's expire 1h0m0s)"},
		{[]string{"drop-after=2h0m0s"}, time.Hour, false, false, true, time.Hour, "the Corefile's expire 1h0m0s (stricter than the service's drop-after=2h0m0s)"},
		{[]string{"drop-after=0s"}, 0, false, false, true, 0, "the service's drop-after=0s"},
		{[]string{"drop-if-local-after=30s"}, 0, true, true, true, 30 * time.Second, "the service's drop-if-local-after=30s (stricter"},
		{[]string{"drop-if-local-after=30s"}, 0, false, true, false, 0, "not while the consumer has no ready endpoints of its own"},
		{[]string{"drop-if-local-after=30s"}, time.Hour, false, true, true, time.Hour, "the Corefile's expire 1h0m0s (stricter than the service's drop-if-local-after=30s; not while"},
		{[]string{"drop-if-local-after=30s"}, 0, false, false, false, 0, "give --local"},
		{[]string{"drop-after=30s", "serve"}, 0, false, false, true, 30 * time.Second, "its entries differ (drop-after=30s, serve)"},
	} {
		v := applies(c.policies, c.expire, c.local, c.localKnown)
		if v.Drops != c.drops || (c.drops && v.DropAfter != c.after) || !strings.Contains(v.Applies, c.says) {
			t.Errorf("%v, expire %s, local %t/%t: drops %t after %s, %q; want %t after %s, %q",
				c.policies, c.expire, c.local, c.localKnown, v.Drops, v.DropAfter, v.Applies, c.drops, c.after, c.says)
		}
	}
}

// A cluster's state from its snapshot meta: as written, with the plugin's
// 5 s grace after the last contact and the Corefile's expire.
func TestContactState(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		meta   snapshot.Meta
		expire time.Duration
		state  string
		age    time.Duration
	}{
		{snapshot.Meta{State: "connected", LastContact: now.Add(-time.Hour)}, time.Minute, stateConnected, 0},
		{snapshot.Meta{State: "disconnected", LastContact: now.Add(-3 * time.Second)}, 0, stateConnected, 0},
		{snapshot.Meta{State: "disconnected", LastContact: now.Add(-time.Minute)}, 0, stateStale, time.Minute},
		{snapshot.Meta{State: "syncing", LastContact: now.Add(-time.Minute)}, time.Hour, stateStale, time.Minute},
		{snapshot.Meta{State: "disconnected", LastContact: now.Add(-2 * time.Hour)}, time.Hour, stateExpired, 2 * time.Hour},
		{snapshot.Meta{State: "syncing"}, 0, stateStale, -1},
		{snapshot.Meta{LastContact: now.Add(-time.Minute)}, 0, stateUnknown, time.Minute},
		{snapshot.Meta{}, 0, stateUnknown, -1},
	} {
		if state, age := contactState(c.meta, now, c.expire); state != c.state || age != c.age {
			t.Errorf("%+v, expire %s: %s %s, want %s %s", c.meta, c.expire, state, age, c.state, c.age)
		}
	}
}

// stalePods is edge-b's Pods of three services, each exported with a
// policy.
func stalePods(cluster string, ip byte, policies map[string]string) []*store.Pod {
	var out []*store.Pod
	for svc, v := range policies {
		p := pod(cluster, "default", svc+"-0", svc, true, "10.0."+string('0'+ip)+".1")
		if svc == "db" {
			p = pod(cluster, "default", svc+"-0", svc, true, "10.0."+string('0'+ip)+".2")
		}
		e := &p.Exports[0]
		e.StaleEndpoints, e.StaleGraceSeconds, _ = annotation.ParseStaleEndpoints(v)
		out = append(out, p)
	}
	return out
}

// mcsctl snapshot and explain show, per cluster of a service, its state,
// how long it has been out of contact and which policy applies; explain
// answers as the plugin would: a stale cluster's endpoints of a service
// that drops them are left out, an expired cluster's records are gone.
func TestSnapshotStaleStates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table.db")
	st, _, err := snapshot.Open(path, snapshot.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	put := func(cluster string, meta snapshot.Meta, ps []*store.Pod) {
		m := map[string][]byte{}
		for _, p := range ps {
			b, err := snapshot.EncodePod(p)
			if err != nil {
				t.Fatal(err)
			}
			m[p.Namespace+"/"+p.Name] = b
		}
		meta.ClusterID = cluster
		st.ReplaceSource(cluster, m, meta)
	}
	put("edge-a", snapshot.Meta{State: "connected", LastContact: now.Add(-time.Hour)},
		stalePods("edge-a", 1, map[string]string{"db": "serve"}))
	put("edge-b", snapshot.Meta{State: "disconnected", LastContact: now.Add(-2 * time.Minute)},
		stalePods("edge-b", 2, map[string]string{"web": "drop-after=30s", "db": "drop-if-local-after=30s", "api": "serve"}))
	put("edge-c", snapshot.Meta{State: "disconnected", LastContact: now.Add(-2 * time.Hour), Via: []string{"hub-1", "hub-2"}},
		stalePods("edge-c", 3, map[string]string{"web": "serve"}))
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	var out, errb bytes.Buffer
	if rc := run([]string{"mcsctl", "snapshot", path, "--expire", "1h", "--local", "edge-a"}, nil, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	text := out.String()
	for _, w := range []string{
		"STATE WRITTEN", "disconnected", "PATH", "direct", "via hub-1,hub-2",
		// (ages as of the run, from about 2 minutes and 2 hours)
		"state stale, 2m", "since its last contact; policy: the service's drop-after=30s (stricter than the Corefile's expire 1h0m0s); its endpoints are left out of the answers",
		"since its last contact; policy: the Corefile's expire 1h0m0s (stricter than the service's serve); its endpoints are answered, marked stale to EDNS0 clients, for 5",
		"since its last contact; policy: the service's drop-if-local-after=30s",
		"state expired, 2h0m",
		"state connected; policy: the Corefile's expire 1h0m0s (stricter than the service's serve)",
	} {
		if !strings.Contains(text, w) {
			t.Errorf("snapshot output lacks %q:\n%s", w, text)
		}
	}

	out.Reset()
	if rc := run([]string{"mcsctl", "snapshot", path, "-o", "json"}, nil, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	var s site
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := map[string]clusterInfo{}
	for _, svc := range s.Services {
		for _, c := range svc.Clusters {
			got[svc.Name+"/"+c.Cluster] = c
		}
	}
	if c := got["web/edge-b"]; c.State != stateStale || c.Age == nil || time.Duration(*c.Age) < 2*time.Minute || c.Stale.Policy != "drop-after=30s" {
		t.Errorf("web/edge-b: %+v", c)
	}
	if c := got["web/edge-c"]; c.State != stateStale || c.Stale.Policy != "serve" { // no --expire: never expired
		t.Errorf("web/edge-c without --expire: %+v", c)
	}
	if c := got["db/edge-a"]; c.State != stateConnected || c.Age != nil {
		t.Errorf("db/edge-a: %+v", c)
	}

	for _, c := range []struct {
		name string
		args []string
		want []string
		not  []string
	}{
		{"web: edge-b dropped, edge-c expired", []string{"web.default", "--expire", "1h"},
			[]string{"A    nxdomain", "cluster edge-b: state stale", "its endpoints are left out of the answers",
				"cluster edge-b: Pod default/web-0 (10-0-2-1, [10.0.2.1]): not answered: its cluster has been out of contact for longer than the stale policy allows",
				"cluster edge-c: state expired"},
			[]string{"10.0.3.1", "10.0.2.1\n"}},
		{"api: edge-b served, marked", []string{"api.default"},
			[]string{"10.0.2.1", "cluster edge-b: state stale", "marked stale to EDNS0 clients", "answered: ready, with an IP"}, nil},
		{"db: edge-b dropped while edge-a has local endpoints", []string{"db.default", "--local", "edge-a"},
			[]string{"10.0.1.2", "not answered: its cluster has been out of contact"}, []string{"A\t10.0.2.2", "10-0-2-2.edge-b"}},
		{"db without --local: edge-b kept", []string{"db.default"}, []string{"10.0.1.2", "10.0.2.2", "give --local"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			out.Reset()
			if rc := run(append([]string{"mcsctl", "explain", "--snapshot", path}, c.args...), nil, &out, &errb); rc != 0 {
				t.Fatalf("exit %d: %s", rc, errb.String())
			}
			for _, w := range c.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("explain lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range c.not {
				if strings.Contains(out.String(), w) {
					t.Errorf("explain has %q:\n%s", w, out.String())
				}
			}
		})
	}
}
