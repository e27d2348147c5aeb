package node

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// Addresses every cluster uses inside its own node: the Service range, the
// kube-dns ClusterIP the kubelet writes into each Pod's resolv.conf (kubeadm's
// defaults), and the whole Pod network (every node's Pod CIDR is in it:
// kube-proxy does not masquerade traffic from Pods of any cluster).
const (
	ServiceCIDR = "10.96.0.0/16"
	ClusterDNS  = "10.96.0.10"
	podNetwork  = "10.244.0.0/16"
	apiPort     = 6443
)

// Bounds of the waits.
const (
	readyTimeout = 3 * time.Minute // a component on a loaded 2-core machine
	stopGrace    = 15 * time.Second
)

// Cluster is one real single-node Kubernetes cluster: in the node's network
// namespace, etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// containerd (its own root, state, socket), kubelet (its own root folder and
// cgroup root) and kube-proxy (iptables), with the CNI bridge for Pods. The
// API server listens on the node IP, which the test reaches through the
// Network's hub.
type Cluster struct {
	Name    string
	Dir     string
	NetNS   string
	NodeIP  netip.Addr
	PodCIDR netip.Prefix
	// On a dual-stack Network: the node's IPv6 address, Pod CIDR and
	// Service range (invalid otherwise).
	NodeIP6      netip.Addr
	PodCIDR6     netip.Prefix
	ServiceCIDR6 netip.Prefix
	podNetwork6  netip.Prefix // every cluster's IPv6 Pod CIDR is in it

	Token      string
	Kubeconfig string // admin, for the test and kubectl
	Client     *kubernetes.Clientset

	tools      Tools
	cgroupRoot string // "/mcs-<id>-<name>" under every cgroup v1 controller
	sock       string // containerd's socket
	mountNS    string // /proc/PID/ns/mnt of the node's mount namespace
	procs      []*proc
}

// Server is the API server's URL, reachable from the test and from every node.
func (c *Cluster) Server() string {
	return "https://" + net.JoinHostPort(c.NodeIP.String(), strconv.Itoa(apiPort))
}

// StartCluster starts a cluster on a new node of n, imports the images and
// waits until the node is Ready, kube-proxy has programmed the kubernetes
// Service, and the default ServiceAccount exists. Cleanup stops everything
// by PID, removes the containers, mounts and cgroups.
func StartCluster(t harness.T, n *Network, tools Tools, name string) *Cluster {
	t.Helper()
	c := &Cluster{Name: name, tools: tools}
	c.Dir = filepath.Join(harness.TempDir(t), name)
	c.NetNS, c.NodeIP, c.PodCIDR = n.AddNode(t, name)
	if n.DualStack {
		nd := n.node(name)
		c.NodeIP6, c.PodCIDR6, c.ServiceCIDR6, c.podNetwork6 = nd.ip6, nd.podCIDR6, n.ServiceCIDR6, n.PodNetwork6
	}
	c.cgroupRoot = "/mcs-" + n.ID + "-" + name
	c.sock = filepath.Join(c.Dir, "containerd", "containerd.sock")
	t.Cleanup(func() { c.stop(t) })
	if err := c.prepare(); err != nil {
		t.Fatalf("node %s: %v", name, err)
	}
	start := time.Now()
	c.start(t, "etcd", tools.Etcd,
		"--name", name, "--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", name+"=http://127.0.0.1:2380", "--unsafe-no-fsync", "--log-level", "warn")
	pki := filepath.Join(c.Dir, "pki")
	c.start(t, "kube-apiserver", tools.APIServer,
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", c.NodeIP.String(), "--advertise-address", c.NodeIP.String(),
		"--secure-port", strconv.Itoa(apiPort),
		"--tls-cert-file", filepath.Join(pki, "apiserver.crt"), "--tls-private-key-file", filepath.Join(pki, "apiserver.key"),
		"--service-cluster-ip-range", c.both(ServiceCIDR, c.ServiceCIDR6),
		"--token-auth-file", filepath.Join(pki, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", filepath.Join(pki, "sa.key"),
		"--service-account-signing-key-file", filepath.Join(pki, "sa.key"),
		"--allow-privileged=true", "--enable-priority-and-fairness=false",
		"--kubelet-preferred-address-types", "InternalIP")
	c.wait(t, "kube-apiserver /readyz", func() error {
		_, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		return err
	})
	kc := c.Kubeconfig
	c.start(t, "kube-controller-manager", tools.ControllerManager,
		"--kubeconfig", kc, "--bind-address", "127.0.0.1", "--leader-elect=false",
		"--root-ca-file", filepath.Join(pki, "ca.crt"),
		"--service-account-private-key-file", filepath.Join(pki, "sa.key"),
		"--cluster-name", name, "--use-service-account-credentials=false",
		"--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc)
	c.start(t, "kube-scheduler", tools.Scheduler,
		"--kubeconfig", kc, "--bind-address", "127.0.0.1", "--leader-elect=false",
		"--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc)
	c.makeMountNS(t)
	c.startIn(t, c.mountNS, "containerd", "containerd", "--config", filepath.Join(c.Dir, "containerd", "config.toml"))
	c.wait(t, "containerd", func() error {
		_, err := run(10*time.Second, "", "ctr", "--address", c.sock, "version")
		return err
	})
	c.importImages(t)
	c.startIn(t, c.mountNS, "kubelet", tools.Kubelet,
		"--config", filepath.Join(c.Dir, "kubelet", "config.yaml"),
		"--kubeconfig", kc, "--root-dir", filepath.Join(c.Dir, "kubelet", "root"),
		"--hostname-override", name, "--node-ip", c.both(c.NodeIP.String(), c.NodeIP6), "--v", "1")
	// -v 4: its conntrack clean-ups are logged (ConntrackCleanups).
	c.start(t, "kube-proxy", tools.KubeProxy, "--config", filepath.Join(c.Dir, "kube-proxy.yaml"), "--v", "4")
	c.wait(t, "node Ready", func() error {
		nd, err := c.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range nd.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("node %s not Ready", name)
	})
	c.wait(t, "default ServiceAccount and kube-root-ca.crt", func() error {
		if _, err := c.Client.CoreV1().ServiceAccounts("default").Get(context.Background(), "default", metav1.GetOptions{}); err != nil {
			return err
		}
		_, err := c.Client.CoreV1().ConfigMaps("default").Get(context.Background(), "kube-root-ca.crt", metav1.GetOptions{})
		return err
	})
	c.wait(t, "kube-proxy rules for the kubernetes Service", func() error {
		out, err := run(10*time.Second, c.NetNS, "iptables", "-w", "5", "-t", "nat", "-S", "KUBE-SERVICES")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "default/kubernetes:https") {
			return fmt.Errorf("no rule for default/kubernetes yet")
		}
		return nil
	})
	t.Logf("node: cluster %s up at %s (node %s, Pod CIDR %s) in %s", name, c.Server(), c.NodeIP, c.PodCIDR,
		time.Since(start).Round(time.Second))
	return c
}

// both is v4, followed by ",v6" when v6 is valid (dual stack): the form of
// the components' dual-stack flags.
func (c *Cluster) both(v4 string, v6 interface {
	IsValid() bool
	String() string
}) string {
	if !v6.IsValid() {
		return v4
	}
	return v4 + "," + v6.String()
}

// start runs one component in the node's network namespace; a failure later
// prints its log's tail (stop).
func (c *Cluster) start(t harness.T, name, bin string, args ...string) {
	t.Helper()
	c.startIn(t, "", name, bin, args...)
}

// startIn is start, in mount namespace mountNS as well when not "".
func (c *Cluster) startIn(t harness.T, mountNS, name, bin string, args ...string) {
	t.Helper()
	p, err := startProc(c.Name+"/"+name, filepath.Join(c.Dir, name+".log"), c.NetNS, mountNS, bin, args...)
	if err != nil {
		t.Fatalf("node %s: %v", c.Name, err)
	}
	c.procs = append(c.procs, p)
}

// wait polls f (bounded by readyTimeout); on timeout it fails with the last
// error and the tail of every component's log. A component that exits
// meanwhile fails it at once.
func (c *Cluster) wait(t harness.T, what string, f func() error) {
	t.Helper()
	if err := c.poll(f); err != nil {
		t.Fatalf("node %s: no %s after %s: %v\n%s", c.Name, what, readyTimeout, err, c.Logs(30))
	}
}

// poll calls f every 500 ms until it returns nil, for at most readyTimeout,
// or until a component has exited; it returns f's last error.
func (c *Cluster) poll(f func() error) error {
	deadline := time.Now().Add(readyTimeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return nil
		}
		for _, p := range c.procs {
			if !p.running() {
				return fmt.Errorf("%w; %s exited: %v\n%s", err, p.name, p.err, p.tail(40))
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	return err
}

// StopAPIServer stops the cluster's kube-apiserver (SIGTERM) by PID;
// everything else keeps running. Until StartAPIServer, no wait of the
// cluster's may be used.
func (c *Cluster) StopAPIServer(t harness.T) {
	t.Helper()
	if err := c.component("kube-apiserver").stop(stopGrace); err != nil {
		t.Fatalf("node %s: %v", c.Name, err)
	}
}

// StartAPIServer starts the stopped kube-apiserver again and waits until it
// is ready.
func (c *Cluster) StartAPIServer(t harness.T) {
	t.Helper()
	for i, p := range c.procs {
		if p.name == c.Name+"/kube-apiserver" {
			np, err := p.restart()
			if err != nil {
				t.Fatalf("node %s: %v", c.Name, err)
			}
			c.procs[i] = np
		}
	}
	c.wait(t, "kube-apiserver /readyz", func() error {
		_, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		return err
	})
}

func (c *Cluster) component(name string) *proc {
	for _, p := range c.procs {
		if p.name == c.Name+"/"+name {
			return p
		}
	}
	return nil
}

// NodeDig asks the kube-dns Service from the node's own network namespace
// (through kube-proxy's rules, as a Pod's query goes, without the API
// server: for when it is down) and returns the addresses of the answer.
func (c *Cluster) NodeDig(name string) ([]string, error) {
	out, err := run(30*time.Second, c.NetNS, "dig", "+short", "+time=2", "+tries=2", "@"+ClusterDNS, name)
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}

// NodeGet makes one HTTP GET from the node's own network namespace and
// returns the body.
func (c *Cluster) NodeGet(url string) (string, error) {
	return run(30*time.Second, c.NetNS, "python3", "-c",
		"import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())", url)
}

// Logs is the last n lines of every component's log and of every
// container's (the kubelet's podLogsDir).
func (c *Cluster) Logs(n int) string {
	var b strings.Builder
	for _, p := range c.procs {
		fmt.Fprintf(&b, "--- %s (PID %d):\n%s\n", p.name, p.pid(), p.tail(n))
	}
	_ = filepath.WalkDir(filepath.Join(c.Dir, "kubelet", "logs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".log") {
			fmt.Fprintf(&b, "--- container log %s:\n%s\n", strings.TrimPrefix(p, c.Dir+"/"), harness.Tail(p, n))
		}
		return nil
	})
	return b.String()
}

// prepare writes keys, certificates, tokens, kubeconfig, the configurations
// of containerd, CNI, kubelet and kube-proxy, and makes the cgroup root.
func (c *Cluster) prepare() error {
	pki := filepath.Join(c.Dir, "pki")
	for _, d := range []string{pki, filepath.Join(c.Dir, "containerd"), filepath.Join(c.Dir, "cni"),
		filepath.Join(c.Dir, "kubelet", "manifests"), filepath.Join(c.Dir, "kubelet", "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := writeCerts(pki, []net.IP{c.NodeIP.AsSlice(), net.ParseIP("10.96.0.1")}); err != nil {
		return err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(pki, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY",
		Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	c.Token = hex.EncodeToString(tok)
	if err := os.WriteFile(filepath.Join(pki, "tokens.csv"), []byte(c.Token+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := harness.WriteKubeconfig(c.Kubeconfig, c.Name, c.Server(), c.Token); err != nil {
		return err
	}
	cfg, err := harness.RESTConfig(c.Kubeconfig)
	if err != nil {
		return err
	}
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	files := map[string]string{
		"containerd/config.toml": c.containerdConfig(),
		"cni/10-mcs.conflist":    c.cniConfig(),
		"kubelet/config.yaml":    c.kubeletConfig(),
		"kubelet/resolv.conf":    "nameserver " + c.NodeIP.String() + "\n",
		"kube-proxy.yaml":        c.kubeProxyConfig(),
	}
	for name, s := range files {
		if err := os.WriteFile(filepath.Join(c.Dir, name), []byte(s), 0o644); err != nil {
			return err
		}
	}
	return c.makeCgroups()
}

// The CRI settings RECIPES.md found: runc cannot lower oom_score_adj here
// (restrict_oom_score_adj), no systemd (cgroupfs), the sandbox image is our
// pause image, and Pod network namespaces are mounted under our state
// folder, not /run/netns.
func (c *Cluster) containerdConfig() string {
	d := filepath.Join(c.Dir, "containerd")
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[4]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[5]q
    conf_dir = %[6]q
`, filepath.Join(d, "root"), filepath.Join(d, "state"), c.sock, PauseImage, cniBinDir, filepath.Join(c.Dir, "cni"))
}

// The bridge plugin with host-local addresses from the node's Pod CIDR,
// no masquerade (the Pod network is flat across clusters), its own IPAM
// folder (host-local's default is shared by every node on the machine).
func (c *Cluster) cniConfig() string {
	ranges, routes := fmt.Sprintf(`[{"subnet": %q}]`, c.PodCIDR.String()), `{"dst": "0.0.0.0/0"}`
	if c.PodCIDR6.IsValid() {
		ranges += fmt.Sprintf(`, [{"subnet": %q}]`, c.PodCIDR6.String())
		routes += `, {"dst": "::/0"}`
	}
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "mcs-%[1]s",
  "plugins": [{
    "type": "bridge",
    "bridge": "cni0",
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "ranges": [%[2]s],
      "routes": [%[4]s],
      "dataDir": %[3]q
    }
  }]
}
`, c.Name, ranges, filepath.Join(c.Dir, "cni", "ipam"), routes)
}

func (c *Cluster) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: %[1]s
failSwapOn: false
containerRuntimeEndpoint: unix://%[2]s
address: %[3]s
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
clusterDNS: [%[4]s]
clusterDomain: cluster.local
resolvConf: %[5]s
staticPodPath: %[6]s
podLogsDir: %[7]s
# Side-loaded images only: never collect them, never evict for disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "0%%"
  imagefs.available: "0%%"
  nodefs.inodesFree: "0%%"
serializeImagePulls: false
`, c.cgroupRoot, c.sock, c.NodeIP, ClusterDNS, filepath.Join(c.Dir, "kubelet", "resolv.conf"),
		filepath.Join(c.Dir, "kubelet", "manifests"), filepath.Join(c.Dir, "kubelet", "logs"))
}

// kube-proxy in iptables mode. Conntrack settings are left as they are: the
// table size is the machine's, not the node's.
func (c *Cluster) kubeProxyConfig() string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %[1]s
mode: iptables
hostnameOverride: %[2]s
clusterCIDR: %[3]s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  minSyncPeriod: 0s
`, c.Kubeconfig, c.Name, c.both(podNetwork, c.podNetwork6))
}

// makeMountNS makes the node's own mount namespace, shared by containerd and
// the kubelet (the volumes the kubelet mounts must be visible to the
// containers containerd starts) and by nothing else: a process holds it
// (unshare; the machine's mounts propagate in, none propagate out), and in
// it folders of the node's own are mounted over /var/lib (hostPath volumes
// such as CoreDNS's snapshot folder /var/lib/mcsannotations are per node, as
// on separate machines), /var/log (the kubelet's /var/log/containers links)
// and /run/containerd (the shims' sockets, runc's state). Nothing of the
// machine's is written, and the mounts go with the namespace.
func (c *Cluster) makeMountNS(t harness.T) {
	t.Helper()
	c.start(t, "mount-namespace", "unshare", "--mount", "--propagation", "slave", "--", "sleep", "infinity")
	holder := c.procs[len(c.procs)-1]
	own, _ := os.Readlink("/proc/self/ns/mnt")
	ns := fmt.Sprintf("/proc/%d/ns/mnt", holder.pid())
	c.wait(t, "the node's mount namespace", func() error {
		if l, err := os.Readlink(ns); err != nil || l == own {
			return fmt.Errorf("%s: %q (ours %q), %v", ns, l, own, err)
		}
		return nil
	})
	for _, m := range [][2]string{{"var-lib", "/var/lib"}, {"var-log", "/var/log"}, {"run-containerd", "/run/containerd"}} {
		src := filepath.Join(c.Dir, m[0])
		if err := os.MkdirAll(src, 0o755); err != nil {
			t.Fatalf("node %s: %v", c.Name, err)
		}
		if _, err := run(cmdTimeout, "", "nsenter", "--mount="+ns, "--", "sh", "-c",
			`mkdir -p "$2" && mount --bind "$1" "$2"`, "sh", src, m[1]); err != nil {
			t.Fatalf("node %s: %v", c.Name, err)
		}
	}
	c.mountNS = ns
}

// cgroupControllers are the cgroup v1 hierarchies under /sys/fs/cgroup.
func cgroupControllers() []string {
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// makeCgroups creates the kubelet's cgroup root in every hierarchy (kubelet
// refuses to start otherwise); cpuset needs its CPUs and memory nodes copied
// from the parent before anything can join it.
func (c *Cluster) makeCgroups() error {
	for _, ctrl := range cgroupControllers() {
		d := filepath.Join("/sys/fs/cgroup", ctrl, c.cgroupRoot)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if ctrl == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuset", f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// stop ends everything the cluster started, in order: kubelet (so that it
// restarts nothing), the containers (every process in the node's cgroup
// root), containerd and its shims, then the other components; it unmounts
// what the kubelet and containerd mounted under the cluster's folder and
// removes the cgroups.
func (c *Cluster) stop(t harness.T) {
	if t.Failed() {
		t.Logf("node %s: logs:\n%s", c.Name, c.Logs(40))
	}
	var errs []string
	byName := map[string]*proc{}
	for _, p := range c.procs {
		byName[strings.TrimPrefix(p.name, c.Name+"/")] = p
	}
	stopOne := func(name string) {
		if p := byName[name]; p != nil {
			if err := p.stop(stopGrace); err != nil {
				errs = append(errs, err.Error())
			}
			delete(byName, name)
		}
	}
	stopOne("kubelet")
	if err := c.killContainers(); err != nil {
		errs = append(errs, err.Error())
	}
	stopOne("containerd")
	if err := c.killShims(); err != nil {
		errs = append(errs, err.Error())
	}
	stopOne("mount-namespace")
	for _, name := range []string{"kube-proxy", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		stopOne(name)
	}
	if err := unmountUnder(c.Dir); err != nil {
		errs = append(errs, err.Error())
	}
	if err := c.removeCgroups(); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		t.Errorf("node %s: cleanup: %s", c.Name, strings.Join(errs, "; "))
	}
}

// killContainers SIGKILLs every process in the node's cgroup root (the
// containers: only processes this cluster's containerd started live there)
// until none is left (bounded).
func (c *Cluster) killContainers() error {
	dir := filepath.Join("/sys/fs/cgroup/pids", c.cgroupRoot)
	for i := 0; i < 50; i++ {
		pids := cgroupPIDs(dir)
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("processes left in %s: %v", dir, cgroupPIDs(dir))
}

func cgroupPIDs(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// killShims ends the containerd-shim-runc-v2 processes of this cluster's
// containerd (they outlive it: each is its own session), found by the
// containerd address on their command line.
func (c *Cluster) killShims() error {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || !strings.HasSuffix(args[0], "containerd-shim-runc-v2") {
			continue
		}
		for i := range args[:len(args)-1] {
			if args[i] == "-address" && args[i+1] == c.sock {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return nil
}

// unmountUnder lazily unmounts every mount point under dir, deepest first
// (Pod volumes, container root file systems, network namespace files).
func unmountUnder(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var mps []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mps = append(mps, f[4])
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	var errs []string
	for _, mp := range mps {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL && err != syscall.ENOENT {
			errs = append(errs, mp+": "+err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("unmount: %s", strings.Join(errs, "; "))
	}
	return nil
}

// removeCgroups removes the cgroup root and everything the kubelet made
// under it, deepest first.
func (c *Cluster) removeCgroups() error {
	var errs []string
	for _, ctrl := range cgroupControllers() {
		root := filepath.Join("/sys/fs/cgroup", ctrl, c.cgroupRoot)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := syscall.Rmdir(dirs[i]); err != nil && err != syscall.ENOENT {
				errs = append(errs, dirs[i]+": "+err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("cgroups: %s", strings.Join(errs, "; "))
	}
	return nil
}
