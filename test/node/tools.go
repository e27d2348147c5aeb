package node

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// Environment variables naming what a real node runs, beyond harness.Tools
// (MCS_E2E_ETCD, MCS_E2E_APISERVER). `tools/install.sh env` prints the
// Kubernetes ones; `make e2e-node` sets them all.
const (
	EnvKubelet           = "MCS_E2E_KUBELET"
	EnvKubeProxy         = "MCS_E2E_KUBE_PROXY"
	EnvControllerManager = "MCS_E2E_KUBE_CONTROLLER_MANAGER"
	EnvScheduler         = "MCS_E2E_KUBE_SCHEDULER"
	EnvKubectl           = "MCS_E2E_KUBECTL"
	// EnvImages is the folder of `make image`'s archives
	// (coredns-mcsannotations.oci.tar, mcs-annotator.oci.tar); EnvTestImages
	// the folder of workload.oci.tar and pause.oci.tar (`make node-images`).
	EnvImages     = "MCS_E2E_IMAGES"
	EnvTestImages = "MCS_E2E_TEST_IMAGES"
)

// Tools are the binaries and image archives of a real-node cluster.
type Tools struct {
	harness.Tools
	Kubelet, KubeProxy, ControllerManager, Scheduler, Kubectl string
	Images, TestImages                                        string
}

// Images side-loaded into every node, by archive file name.
var (
	productImages = []string{"coredns-mcsannotations.oci.tar", "mcs-annotator.oci.tar"}
	testImages    = []string{"workload.oci.tar", "pause.oci.tar"}
)

// RequireTools returns the tools after checking that every one exists, and
// that the machine has what a node needs (root, containerd, runc, the CNI
// plugins, iptables, nsenter). When something is missing the test is
// skipped, or fails with CI=true.
func RequireTools(t harness.T) Tools {
	t.Helper()
	ht := harness.FindTools()
	root, _ := harness.RepoRoot()
	k8s := func(env, name string) string {
		if v := os.Getenv(env); v != "" {
			return v
		}
		m, _ := filepath.Glob(filepath.Join(root, ".cache/tools", name+"-*", name))
		if len(m) == 0 {
			return filepath.Join(root, ".cache/tools", name+"-VERSION", name)
		}
		return m[len(m)-1]
	}
	dir := func(env, def string) string {
		if v := os.Getenv(env); v != "" {
			return v
		}
		return filepath.Join(root, def)
	}
	tools := Tools{
		Tools:             ht,
		Kubelet:           k8s(EnvKubelet, "kubelet"),
		KubeProxy:         k8s(EnvKubeProxy, "kube-proxy"),
		ControllerManager: k8s(EnvControllerManager, "kube-controller-manager"),
		Scheduler:         k8s(EnvScheduler, "kube-scheduler"),
		Kubectl:           k8s(EnvKubectl, "kubectl"),
		Images:            dir(EnvImages, "bin/images"),
		TestImages:        dir(EnvTestImages, "bin/images/node"),
	}
	var missing []string
	for _, f := range []string{tools.Etcd, tools.APIServer, tools.Kubelet, tools.KubeProxy,
		tools.ControllerManager, tools.Scheduler, tools.Kubectl} {
		if st, err := os.Stat(f); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, f+" (tools/install.sh node)")
		}
	}
	for _, f := range productImages {
		if _, err := os.Stat(filepath.Join(tools.Images, f)); err != nil {
			missing = append(missing, filepath.Join(tools.Images, f)+" (make image)")
		}
	}
	for _, f := range testImages {
		if _, err := os.Stat(filepath.Join(tools.TestImages, f)); err != nil {
			missing = append(missing, filepath.Join(tools.TestImages, f)+" (make node-images)")
		}
	}
	for _, c := range []string{"containerd", "ctr", "runc", "containerd-shim-runc-v2", "iptables", "nsenter", "ip", "unshare", "openssl", "dig", "python3"} {
		if _, err := lookPath(c); err != nil {
			missing = append(missing, c+" (make tools; tools/install.sh node)")
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			missing = append(missing, filepath.Join(cniBinDir, p)+" (containernetworking-plugins)")
		}
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "root (network namespaces, cgroups, containerd)")
	}
	if len(missing) > 0 {
		msg := "real-node tools missing: " + strings.Join(missing, ", ")
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s; CI=true, so this is a failure, not a skip", msg)
		}
		t.Skip(msg)
	}
	return tools
}

// cniBinDir is where Debian's containernetworking-plugins puts the plugins.
const cniBinDir = "/usr/lib/cni"

// lookPath finds a command in PATH or in the sbin folders, which a
// non-login root shell may lack.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}
