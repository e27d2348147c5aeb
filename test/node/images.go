package node

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// The test images' names (tools/image build -test-images -registry
// localhost/mcsannotations -tag node): fully qualified, as CRI looks images up
// by normalized name.
const (
	PauseImage    = "localhost/mcsannotations/pause:node"
	WorkloadImage = "localhost/mcsannotations/workload:node"
)

// importImages side-loads every archive into the node's containerd, as the
// README's install section does: `ctr -n k8s.io images import`.
func (c *Cluster) importImages(t harness.T) {
	t.Helper()
	var files []string
	for _, f := range productImages {
		files = append(files, filepath.Join(c.tools.Images, f))
	}
	for _, f := range testImages {
		files = append(files, filepath.Join(c.tools.TestImages, f))
	}
	for _, f := range files {
		if out, err := run(2*time.Minute, "", "ctr", "--address", c.sock, "-n", "k8s.io", "images", "import", f); err != nil {
			t.Fatalf("node %s: import %s: %v\n%s", c.Name, f, err, out)
		}
	}
	out, err := run(time.Minute, "", "ctr", "--address", c.sock, "-n", "k8s.io", "images", "ls", "-q")
	if err != nil {
		t.Fatalf("node %s: %v", c.Name, err)
	}
	t.Logf("node %s: images: %s", c.Name, strings.Join(strings.Fields(out), " "))
}

// Kubectl runs kubectl against the cluster (admin), bounded by timeout, and
// returns its standard output; an error carries standard error.
func (c *Cluster) Kubectl(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.tools.Kubectl, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Exec runs a command in a Pod's first container (kubectl exec, through the
// API server and the kubelet, as an operator would) and returns its output.
func (c *Cluster) Exec(ns, pod string, argv ...string) (string, error) {
	return c.Kubectl(30*time.Second, append([]string{"-n", ns, "exec", pod, "--"}, argv...)...)
}
