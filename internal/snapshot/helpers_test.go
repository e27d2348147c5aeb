package snapshot

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// logBuf collects Logf lines; safe for concurrent use.
type logBuf struct {
	mu    sync.Mutex
	lines []string
}

func (l *logBuf) Logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *logBuf) contains(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, sub) {
			return true
		}
	}
	return false
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func testOptions(l *logBuf) Options {
	return Options{OpenTimeout: 200 * time.Millisecond, BatchInterval: 10 * time.Millisecond, Logf: l.Logf}
}

func dbPath(t testing.TB) string {
	return filepath.Join(t.TempDir(), "snap", "mcs.db")
}

func mustOpen(t testing.TB, path string, o Options) (*Store, LoadResult) {
	t.Helper()
	s, res, err := Open(path, o)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	return s, res
}

func mustClose(t testing.TB, s *Store) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func mustLoad(t testing.TB, s *Store) map[string]Source {
	t.Helper()
	got, err := s.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return got
}

// reopenLoad closes s, opens path again and loads it.
func reopenLoad(t testing.TB, s *Store, path string, o Options) map[string]Source {
	t.Helper()
	mustClose(t, s)
	s2, res := mustOpen(t, path, o)
	defer mustClose(t, s2)
	if res.MovedAside != "" || res.Created {
		t.Fatalf("reopen: unexpected %+v", res)
	}
	return mustLoad(t, s2)
}

// diffSources describes the differences between two loads, "" if none.
// Empty and nil values are equal (the store does not distinguish them).
func diffSources(got, want map[string]Source) string {
	var d []string
	for _, name := range slices.Sorted(maps.Keys(want)) {
		w := want[name]
		g, ok := got[name]
		if !ok {
			d = append(d, fmt.Sprintf("source %q missing", name))
			continue
		}
		if g.Meta.ClusterID != w.Meta.ClusterID || !g.Meta.LastContact.Equal(w.Meta.LastContact) ||
			!g.Meta.LastFullSync.Equal(w.Meta.LastFullSync) || g.Meta.Records != w.Meta.Records {
			d = append(d, fmt.Sprintf("source %q meta = %+v, want %+v", name, g.Meta, w.Meta))
		}
		for _, k := range slices.Sorted(maps.Keys(w.Records)) {
			if gv, ok := g.Records[k]; !ok {
				d = append(d, fmt.Sprintf("source %q key %q missing", name, k))
			} else if !bytes.Equal(gv, w.Records[k]) {
				d = append(d, fmt.Sprintf("source %q key %q = %q, want %q", name, k, gv, w.Records[k]))
			}
		}
		for k := range g.Records {
			if _, ok := w.Records[k]; !ok {
				d = append(d, fmt.Sprintf("source %q has unexpected key %q", name, k))
			}
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			d = append(d, fmt.Sprintf("unexpected source %q (%d records)", name, len(got[name].Records)))
		}
	}
	return strings.Join(d, "\n")
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pod is a record of Pod name in cluster and ns, exporting exports (each
// given the cluster, and ns when it names no namespace).
func pod(cluster, ns, name, hostname string, ready bool, ips []string, exports ...annotation.Export) *store.Pod {
	p := &store.Pod{Common: &store.Common{Cluster: cluster, Namespace: ns}, Name: name, Hostname: hostname, Ready: ready}
	for _, s := range ips {
		p.IPs = append(p.IPs, netip.MustParseAddr(s))
	}
	for i := range exports {
		exports[i].Cluster = cluster
		if exports[i].Namespace == "" {
			exports[i].Namespace = ns
		}
	}
	p.Exports = exports
	return p
}

func export(name string, ports ...annotation.Port) annotation.Export {
	return annotation.Export{Name: name, Ports: ports}
}

var httpPort = annotation.Port{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}
