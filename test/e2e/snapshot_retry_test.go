package e2e

// Issue 26 item 5 end to end: the real bin/coredns starts with a directory
// where its snapshot file should be; it serves without one, and once the
// directory is removed the file appears, holding the table, without a
// restart.

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

func TestSnapshotRecoversWithoutRestart(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS)
	c := harness.StartCluster(t, clusterID)
	ns := c.NewNamespace(t)
	eps := []endpoint{{"web-0", "web-0", "10.250.7.1"}, {"web-1", "", "10.250.7.2"}}
	createEndpoints(t, c, ns, eps...)
	snap := snapshotPath(t)
	if err := os.MkdirAll(snap+"/in-the-way", 0o755); err != nil {
		t.Fatal(err)
	}
	d, _ := startOfflineCoreDNS(t, c.Kubeconfig, snap, "")
	waitEndpoints(t, d, ns, initialSync, eps...)
	harness.Eventually(t, 10*time.Second, func() error {
		return containsLog(d, "serving without a snapshot, trying again in the background")
	})
	start := time.Now()
	if err := os.RemoveAll(snap); err != nil {
		t.Fatal(err)
	}
	// The backoff is at most a minute between attempts; the directory was
	// there for a few seconds, so the next attempt comes within seconds.
	var held map[string]snapshot.Source
	harness.Eventually(t, 70*time.Second, func() error {
		r, err := snapshot.OpenReadOnly(snap, 5*time.Second)
		if err != nil {
			return err
		}
		defer r.Close()
		held, err = r.Load()
		if err != nil {
			return err
		}
		if n := len(held[clusterID].Records); n != len(eps) {
			return fmt.Errorf("the file holds %d records of %s, want %d", n, clusterID, len(eps))
		}
		return nil
	})
	t.Logf("the snapshot file appeared with the table %s after the directory was removed", time.Since(start).Round(time.Millisecond))
	for _, ep := range eps {
		if _, ok := held[clusterID].Records[ns+"/"+ep.pod]; !ok {
			t.Errorf("no record %s/%s in the file", ns, ep.pod)
		}
	}
	if err := containsLog(d, "opened after"); err != nil {
		t.Error(err)
	}
	// The file now serves a restart with the API server down.
	c.KillAPIServer(t, 9)
	requireAPIDown(t, c)
	d.Restart(t)
	waitEndpoints(t, d, ns, 10*time.Second, eps...)
}

// containsLog is nil when CoreDNS's log has the line part.
func containsLog(d *harness.CoreDNS, part string) error {
	if strings.Contains(d.Log(), part) {
		return nil
	}
	return fmt.Errorf("no log line with %q yet", part)
}
