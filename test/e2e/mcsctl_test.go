package e2e

// mcsctl end to end: the real bin/coredns writes its snapshot while serving,
// the API server is stopped, and bin/mcsctl reads the table out of the file
// that the running CoreDNS still holds open.

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// mcsctlBinary is bin/mcsctl beside bin/coredns (make build builds both),
// else one built from this tree for the test.
func mcsctlBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(filepath.Dir(harness.FindTools().CoreDNS), "mcsctl")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(t.TempDir(), "mcsctl")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/mcsctl")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building mcsctl: %v\n%s", err, out)
	}
	return bin
}

// mcsctlJSON is the part of `mcsctl snapshot -o json` the test checks.
type mcsctlJSON struct {
	Copied  bool `json:"copied"`
	Sources []struct {
		Cluster      string     `json:"cluster"`
		Records      int        `json:"records"`
		Complete     bool       `json:"complete"`
		LastContact  *time.Time `json:"lastContact"`
		LastFullSync *time.Time `json:"lastFullSync"`
	} `json:"sources"`
	Services []mcsctlService `json:"services"`
}

type mcsctlService struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Clusters  []struct {
		Cluster   string   `json:"cluster"`
		Ports     []string `json:"ports"`
		Ready     int      `json:"ready"`
		Endpoints []struct {
			Pod      string   `json:"pod"`
			Hostname string   `json:"hostname"`
			IPs      []string `json:"ips"`
			Ready    bool     `json:"ready"`
		} `json:"endpoints"`
	} `json:"clusters"`
}

func TestMcsctlSnapshotWhileServing(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolCoreDNS)
	mcsctl := mcsctlBinary(t)
	c := harness.StartCluster(t, clusterID)
	ns := c.NewNamespace(t)
	eps := []endpoint{{"web-0", "web-0", "10.250.9.1"}, {"web-1", "", "10.250.9.2"}}
	createEndpoints(t, c, ns, eps...)
	snap := snapshotPath(t)
	d, _ := startOfflineCoreDNS(t, c.Kubeconfig, snap, "")
	waitEndpoints(t, d, ns, initialSync, eps...)
	// Batches are written every 100 ms: give the writer ten.
	time.Sleep(time.Second)

	c.KillAPIServer(t, syscall.SIGKILL)
	requireAPIDown(t, c)
	if !d.Running() {
		t.Fatalf("CoreDNS is not running:\n%s", d.LogTail(30))
	}

	var out, errb bytes.Buffer
	cmd := exec.Command(mcsctl, "snapshot", snap, "-o", "json")
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("mcsctl snapshot: %v\n%s", err, errb.String())
	}
	t.Logf("mcsctl snapshot took %s", time.Since(start).Round(time.Millisecond))
	var got mcsctlJSON
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !got.Copied {
		t.Error("copied is false: CoreDNS holds the file, so mcsctl must have read a copy")
	}
	if len(got.Sources) != 1 || got.Sources[0].Cluster != clusterID || got.Sources[0].Records != 2 ||
		!got.Sources[0].Complete || got.Sources[0].LastContact == nil || time.Since(*got.Sources[0].LastContact) > time.Hour {
		t.Errorf("sources: %+v", got.Sources)
	}
	i := slices.IndexFunc(got.Services, func(s mcsctlService) bool {
		return s.Namespace == ns && s.Name == "backend"
	})
	if i < 0 {
		t.Fatalf("no service %s/backend in %s", ns, out.String())
	}
	svc := got.Services[i]
	if len(svc.Clusters) != 1 || svc.Clusters[0].Cluster != clusterID || svc.Clusters[0].Ready != 2 ||
		!slices.Equal(svc.Clusters[0].Ports, []string{"dns:53/UDP->53", "http:80/TCP->8080"}) {
		t.Fatalf("service: %+v", svc)
	}
	var seen []string
	for _, ep := range svc.Clusters[0].Endpoints {
		seen = append(seen, ep.Pod+" "+ep.Hostname+" "+strings.Join(ep.IPs, ",")+" "+map[bool]string{true: "ready", false: "not ready"}[ep.Ready])
	}
	if want := []string{"web-0 web-0 10.250.9.1 ready", "web-1 10-250-9-2 10.250.9.2 ready"}; !slices.Equal(seen, want) {
		t.Errorf("endpoints %q, want %q", seen, want)
	}

	// explain, from the same file, agrees with what CoreDNS answers.
	out.Reset()
	cmd = exec.Command(mcsctl, "explain", "backend."+ns, "--snapshot", snap)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("mcsctl explain: %v\n%s", err, errb.String())
	}
	for _, w := range []string{"A    service", "10.250.9.1", "10.250.9.2", "Pod " + ns + "/web-0 (web-0, [10.250.9.1]): answered"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("explain lacks %q:\n%s", w, out.String())
		}
	}
	// CoreDNS still runs and still answers from its table.
	if !d.Running() {
		t.Fatalf("CoreDNS stopped while mcsctl read its file:\n%s", d.LogTail(30))
	}
	waitEndpoints(t, d, ns, 5*time.Second, eps...)
}
