package node

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// InstallClusterset installs the product in every cluster the way the
// README's "Install on a cluster" section says, with the images already
// side-loaded (StartCluster): each cluster's ed25519 signing key made with
// openssl, Secret mcs-annotator-signing-key, ConfigMap mcsannotations-keys
// with every public key, Secret mcsannotations-peers with every other
// cluster's peer-reader kubeconfig (manifests/README.md, "Peers"), then
// `kubectl apply --server-side --force-conflicts -k manifests/overlays/<cluster>`,
// unmodified. It waits until the coredns and mcs-annotator Deployments have
// a ready Pod of the applied template.
//
// The peer-reader token of a cluster exists only once its peer/ component is
// applied, which the overlay of that cluster does; so that every peer
// kubeconfig can be written before the first overlay is applied, the
// peer component is applied on its own first (`kubectl apply -k
// manifests/peer`), as the README says.
func InstallClusterset(t harness.T, cs []*Cluster) {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	dir := filepath.Join(harness.TempDir(t), "clusterset")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatalf("node: %v", err)
	}
	mustRun := func(argv ...string) {
		t.Helper()
		if out, err := run(time.Minute, "", argv...); err != nil {
			t.Fatalf("node: %v\n%s", err, out)
		}
	}
	for _, c := range cs {
		key, pub := filepath.Join(dir, c.Name+".key"), filepath.Join(dir, c.Name+".pub")
		mustRun("openssl", "genpkey", "-algorithm", "ed25519", "-out", key)
		mustRun("openssl", "pkey", "-in", key, "-pubout", "-out", pub)
		c.mustKubectl(t, "apply", "-k", filepath.Join(root, "manifests", "peer"))
	}
	for _, c := range cs {
		c.mustKubectl(t, "-n", "kube-system", "create", "secret", "generic", "mcs-annotator-signing-key",
			"--from-file=key.pem="+filepath.Join(dir, c.Name+".key"))
		keys := []string{"-n", "kube-system", "create", "configmap", "mcsannotations-keys"}
		peers := []string{"-n", "kube-system", "create", "secret", "generic", "mcsannotations-peers"}
		for _, o := range cs {
			keys = append(keys, "--from-file="+o.Name+".pub="+filepath.Join(dir, o.Name+".pub"))
			if o != c {
				kc := filepath.Join(dir, c.Name+"-"+o.Name+".kubeconfig")
				o.writePeerKubeconfig(t, kc)
				peers = append(peers, "--from-file="+o.Name+".kubeconfig="+kc)
			}
		}
		c.mustKubectl(t, keys...)
		c.mustKubectl(t, peers...)
		c.mustKubectl(t, "apply", "--server-side", "--force-conflicts", "-k", filepath.Join(root, "manifests", "overlays", c.Name))
	}
	for _, c := range cs {
		c.WaitRollout(t, "kube-system", "mcs-annotator")
		c.WaitRollout(t, "kube-system", "coredns")
		out, _ := c.Kubectl(time.Minute, "get", "pods", "-A", "-o", "wide")
		t.Logf("node %s: the product installed:\n%s", c.Name, out)
	}
}

func (c *Cluster) mustKubectl(t harness.T, args ...string) string {
	t.Helper()
	out, err := c.Kubectl(2*time.Minute, args...)
	if err != nil {
		t.Fatalf("node %s: %v\n%s", c.Name, err, out)
	}
	return out
}

// writePeerKubeconfig writes the kubeconfig other clusters read this one
// with (manifests/README.md, "Peers"): this API server's address and CA, and
// the token of Secret mcsannotations-peer-reader-token, once the token
// controller has filled it in.
func (c *Cluster) writePeerKubeconfig(t harness.T, path string) {
	t.Helper()
	var token []byte
	c.waitFor(t, "the peer reader's token", func() error {
		s, err := c.Client.CoreV1().Secrets("kube-system").Get(context.Background(), "mcsannotations-peer-reader-token", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if token = s.Data["token"]; len(token) == 0 {
			return fmt.Errorf("no token in Secret mcsannotations-peer-reader-token yet")
		}
		return nil
	})
	ca, err := os.ReadFile(filepath.Join(c.Dir, "pki", "ca.crt"))
	if err != nil {
		t.Fatalf("node %s: %v", c.Name, err)
	}
	s := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: %[1]q
  cluster:
    server: %[2]q
    certificate-authority-data: %[3]s
users:
- name: %[4]q
  user:
    token: %[5]q
contexts:
- name: %[1]q
  context:
    cluster: %[1]q
    user: %[4]q
current-context: %[1]q
`, c.Name, c.Server(), base64.StdEncoding.EncodeToString(ca), "mcsannotations-peer-reader", string(token))
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatalf("node %s: %v", c.Name, err)
	}
}

// ApplyYAML applies objects with kubectl (retrying for a bounded time: a
// CRD's kind is served shortly after the CRD is created).
func (c *Cluster) ApplyYAML(t harness.T, yaml string) {
	t.Helper()
	f := filepath.Join(c.Dir, fmt.Sprintf("apply-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		t.Fatalf("node %s: %v", c.Name, err)
	}
	c.waitFor(t, "kubectl apply -f "+f, func() error {
		_, err := c.Kubectl(time.Minute, "apply", "-f", f)
		return err
	})
}

// GetPodIP is the Pod's IP.
func (c *Cluster) GetPodIP(t harness.T, ns, name string) string {
	t.Helper()
	p, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil || p.Status.PodIP == "" {
		t.Fatalf("node %s: Pod %s/%s IP: %v", c.Name, ns, name, err)
	}
	return p.Status.PodIP
}

// PodIPs are the Pod's IPs (status.podIPs: the IPv4 one first, then the
// IPv6 one on a dual-stack node).
func (c *Cluster) PodIPs(t harness.T, ns, name string) []string {
	t.Helper()
	p, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil || len(p.Status.PodIPs) == 0 {
		t.Fatalf("node %s: Pod %s/%s IPs: %v", c.Name, ns, name, err)
	}
	var ips []string
	for _, ip := range p.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	return ips
}

// ClusterSetIP waits (bounded) for the ServiceImport of ns/name to have an
// IP and returns the first.
func (c *Cluster) ClusterSetIP(t harness.T, ns, name string) string {
	t.Helper()
	return c.ClusterSetIPs(t, ns, name, 1)[0]
}

// ClusterSetIPs waits (bounded) for the ServiceImport of ns/name to have n
// IPs (one per family) and returns them.
func (c *Cluster) ClusterSetIPs(t harness.T, ns, name string, n int) []string {
	t.Helper()
	var ips []string
	c.waitFor(t, fmt.Sprintf("ServiceImport %s/%s with %d ClusterSetIPs", ns, name, n), func() error {
		out, err := c.Kubectl(time.Minute, "-n", ns, "get", "serviceimports.multicluster.x-k8s.io", name, "-o", "jsonpath={.spec.ips[*]}")
		if err != nil {
			return err
		}
		if ips = strings.Fields(out); len(ips) < n {
			return fmt.Errorf("spec.ips %v", ips)
		}
		return nil
	})
	return ips
}
