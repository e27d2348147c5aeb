package harness

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Bounds of the control plane's waits.
const (
	etcdReadyTimeout      = 30 * time.Second
	apiserverReadyTimeout = 90 * time.Second // far above a cold start on a busy machine
	apiserverStopTimeout  = 30 * time.Second
)

// clientTimeout bounds each of the harness's own API requests (Config,
// Client). A variable so that a test of the bound can shorten it.
var clientTimeout = 15 * time.Second

// Cluster is one simulated Kubernetes cluster: an etcd and a kube-apiserver on
// 127.0.0.1, with an admin token. Nothing else runs: no controllers, no
// scheduler, no kubelet (the test acts as the kubelet; see CreatePod and
// SetPodStatus).
type Cluster struct {
	Name string
	Dir  string // the cluster's own temporary folder: etcd data, certs, logs, kubeconfigs

	EtcdPort      int
	APIServerPort int
	Token         string // bearer token of user admin (group system:masters)

	// Kubeconfig is the path of a kubeconfig that points straight at the API
	// server; KubeconfigVia writes one that goes through a Proxy.
	Kubeconfig string
	Config     *rest.Config
	Client     *kubernetes.Clientset
	// WatchConfig and WatchClient are Config and Client without the request
	// timeout: client-go applies it to a watch's whole stream too, which
	// would end every watch made through Client after 15 s.
	WatchConfig *rest.Config
	WatchClient *kubernetes.Clientset

	t         T
	tools     Tools
	etcd      *Process
	apiserver *Process
}

// StartCluster starts one cluster and waits until its API server is ready.
func StartCluster(t T, name string) *Cluster {
	t.Helper()
	return StartClusters(t, name)[0]
}

// StartClusters starts independent clusters side by side (their start-ups
// overlap) and waits until every API server is ready. Names are used in file
// names and kubeconfigs.
func StartClusters(t T, names ...string) []*Cluster {
	t.Helper()
	tools := RequireTools(t, ToolEtcd, ToolAPIServer)
	base := TempDir(t)
	cs := make([]*Cluster, len(names))
	for i, name := range names {
		c := &Cluster{Name: name, Dir: filepath.Join(base, name), t: t, tools: tools}
		if err := c.prepare(t); err != nil {
			t.Fatalf("harness: cluster %s: %v", name, err)
		}
		startProcess(t, c.etcd, 40)
		cs[i] = c
	}
	deadline := time.Now().Add(etcdReadyTimeout)
	for _, c := range cs {
		if err := c.waitEtcd(deadline); err != nil {
			t.Fatalf("harness: cluster %s: %v", c.Name, err)
		}
	}
	for _, c := range cs {
		startProcess(t, c.apiserver, 40)
	}
	deadline = time.Now().Add(apiserverReadyTimeout)
	for _, c := range cs {
		start := time.Now()
		if err := c.waitReady(deadline); err != nil {
			t.Fatalf("harness: cluster %s: %v", c.Name, err)
		}
		t.Logf("harness: cluster %s ready at %s (etcd PID %d, kube-apiserver PID %d, waited %s)",
			c.Name, c.Server(), c.etcd.PID(), c.apiserver.PID(), time.Since(start).Round(time.Millisecond))
	}
	return cs
}

// prepare makes the folder, ports, keys, token file, process descriptions and
// client of a cluster.
func (c *Cluster) prepare(t T) error {
	if err := os.MkdirAll(filepath.Join(c.Dir, "certs"), 0o755); err != nil {
		return err
	}
	c.EtcdPort = FreePort(t)
	peerPort := FreePort(t)
	c.APIServerPort = FreePort(t)

	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	c.Token = hex.EncodeToString(tok)
	tokens := filepath.Join(c.Dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(c.Token+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		return err
	}
	saKey := filepath.Join(c.Dir, "sa.key")
	if err := writeRSAKey(saKey); err != nil {
		return err
	}

	etcdURL := "http://" + net.JoinHostPort(Loopback, strconv.Itoa(c.EtcdPort))
	peerURL := "http://" + net.JoinHostPort(Loopback, strconv.Itoa(peerPort))
	c.etcd = newProcess(c.Name+"/etcd", filepath.Join(c.Dir, "etcd.log"), c.tools.Etcd,
		"--name", "etcd-"+c.Name,
		"--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "etcd-"+c.Name+"="+peerURL,
		"--unsafe-no-fsync", "--log-level", "warn",
	)
	c.apiserver = newProcess(c.Name+"/kube-apiserver", filepath.Join(c.Dir, "kube-apiserver.log"), c.tools.APIServer,
		"--etcd-servers", etcdURL,
		"--bind-address", Loopback, "--advertise-address", Loopback,
		"--secure-port", strconv.Itoa(c.APIServerPort),
		"--cert-dir", filepath.Join(c.Dir, "certs"),
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--token-auth-file", tokens,
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", saKey, "--service-account-signing-key-file", saKey,
		// Nothing creates default ServiceAccounts, and nothing reconciles endpoints.
		"--disable-admission-plugins", "ServiceAccount",
		"--endpoint-reconciler-type", "none",
		"--enable-priority-and-fairness=false",
		// /debug/pprof, for test/bench's profile of a relist (admin only).
		"--profiling=true",
	)

	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := WriteKubeconfig(c.Kubeconfig, c.Name, c.Server(), c.Token); err != nil {
		return err
	}
	cfg, err := RESTConfig(c.Kubeconfig)
	if err != nil {
		return err
	}
	c.Config = cfg
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	c.WatchConfig = WatchConfig(cfg)
	c.WatchClient, err = kubernetes.NewForConfig(c.WatchConfig)
	return err
}

// writeRSAKey writes a new 2048-bit RSA private key in PEM (PKCS #1), the
// service-account signing key.
func writeRSAKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	return os.WriteFile(path, b, 0o600)
}

// Server is the API server's URL.
func (c *Cluster) Server() string {
	return "https://" + c.APIServerAddr()
}

// APIServerAddr is the API server's host:port, the target of a Proxy.
func (c *Cluster) APIServerAddr() string {
	return net.JoinHostPort(Loopback, strconv.Itoa(c.APIServerPort))
}

// APIServer is the kube-apiserver process.
func (c *Cluster) APIServer() *Process { return c.apiserver }

// Etcd is the etcd process.
func (c *Cluster) Etcd() *Process { return c.etcd }

func (c *Cluster) waitEtcd(deadline time.Time) error {
	url := "http://" + net.JoinHostPort(Loopback, strconv.Itoa(c.EtcdPort)) + "/health"
	hc := &http.Client{Timeout: 2 * time.Second}
	var last error
	for time.Now().Before(deadline) {
		if !c.etcd.Running() {
			return fmt.Errorf("etcd exited; see %s", c.etcd.LogPath)
		}
		resp, err := hc.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"health":"true"`) {
				return nil
			}
			err = fmt.Errorf("%s: %s %s", url, resp.Status, b)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("etcd not healthy in time: %v", last)
}

// Ready tells whether GET /readyz answers 200 now.
func (c *Cluster) Ready() error {
	hc := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true},
	}
	req, err := http.NewRequest(http.MethodGet, c.Server()+"/readyz", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return nil
}

func (c *Cluster) waitReady(deadline time.Time) error {
	var last error
	for time.Now().Before(deadline) {
		if !c.apiserver.Running() {
			return fmt.Errorf("kube-apiserver exited; see %s", c.apiserver.LogPath)
		}
		if last = c.Ready(); last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready in time: %v", last)
}

// KillAPIServer sends sig (SIGTERM for a clean loss, SIGKILL for a crash) to
// the kube-apiserver by PID and waits until it has exited. After SIGTERM,
// kube-apiserver 1.34 stops listening at once but can take 30 s more to end
// (its ServiceCIDR allocator): after termGrace it gets SIGKILL, and the test
// a note.
func (c *Cluster) KillAPIServer(t T, sig syscall.Signal) {
	t.Helper()
	start := time.Now()
	p := c.apiserver
	var err error
	if sig == syscall.SIGTERM {
		err = p.Kill(sig, termGrace)
		if err != nil && p.Running() {
			t.Logf("harness: cluster %s: kube-apiserver still running %s after SIGTERM (it has stopped listening): SIGKILL", c.Name, termGrace)
			err = p.Kill(syscall.SIGKILL, killGrace)
		}
	} else {
		err = p.Kill(sig, apiserverStopTimeout)
	}
	if err != nil {
		t.Fatalf("harness: cluster %s: %v", c.Name, err)
	}
	t.Logf("harness: cluster %s: kube-apiserver exited on %v in %s", c.Name, sig, time.Since(start).Round(time.Millisecond))
}

// PauseAPIServer sends SIGSTOP: the API server keeps its connections and port
// but answers nothing (a hang, not a loss).
func (c *Cluster) PauseAPIServer(t T) {
	t.Helper()
	if err := c.apiserver.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("harness: cluster %s: %v", c.Name, err)
	}
	// kill returns before every thread has stopped; one still running
	// could answer a request sent right after.
	if err := waitStopped(c.apiserver.PID(), 5*time.Second); err != nil {
		t.Fatalf("harness: cluster %s: kube-apiserver after SIGSTOP: %v", c.Name, err)
	}
}

// waitStopped polls /proc until every thread of pid is stopped (state T).
func waitStopped(pid int, within time.Duration) error {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	deadline := time.Now().Add(within)
	for {
		tasks, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		running := 0
		for _, task := range tasks {
			f, err := procStat(filepath.Join(dir, task.Name(), "stat"))
			if err != nil {
				continue // the thread has exited
			}
			if len(f) == 0 || f[0] != "T" {
				running++
			}
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d threads still not stopped after %s", running, len(tasks), within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ResumeAPIServer sends SIGCONT after PauseAPIServer.
func (c *Cluster) ResumeAPIServer(t T) {
	t.Helper()
	if err := c.apiserver.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("harness: cluster %s: %v", c.Name, err)
	}
}

// RestartAPIServer stops the API server when it runs (SIGTERM, then SIGKILL),
// starts it again with the same flags, port and etcd, and waits until ready.
func (c *Cluster) RestartAPIServer(t T) {
	t.Helper()
	start := time.Now()
	if err := c.apiserver.Stop(termGrace); err != nil {
		t.Fatalf("harness: cluster %s: %v", c.Name, err)
	}
	t.Logf("harness: cluster %s: kube-apiserver stopped in %s", c.Name, time.Since(start).Round(time.Millisecond))
	c.StartAPIServer(t)
}

// StartAPIServer starts the API server again after KillAPIServer, on the same
// port with the same etcd, and waits until ready. The cleanup registered when
// the cluster started stops it.
func (c *Cluster) StartAPIServer(t T) {
	t.Helper()
	start := time.Now()
	if err := c.apiserver.start(); err != nil {
		t.Fatalf("harness: cluster %s: %v", c.Name, err)
	}
	if err := c.waitReady(time.Now().Add(apiserverReadyTimeout)); err != nil {
		t.Fatalf("harness: cluster %s: %v", c.Name, err)
	}
	t.Logf("harness: cluster %s: kube-apiserver PID %d ready again in %s", c.Name, c.apiserver.PID(), time.Since(start).Round(time.Millisecond))
}

// KubeconfigVia writes a kubeconfig that reaches this cluster's API server
// through p (TLS passes through the proxy untouched) and returns its path.
func (c *Cluster) KubeconfigVia(t T, p *Proxy) string {
	t.Helper()
	path := filepath.Join(c.Dir, "kubeconfig-via-"+strconv.Itoa(p.Port()))
	if err := WriteKubeconfig(path, c.Name, "https://"+p.Addr(), c.Token); err != nil {
		t.Fatalf("harness: %v", err)
	}
	return path
}

// WriteKubeconfig writes a kubeconfig with one cluster, user and context,
// all named after name, a bearer token and no TLS verification (the API
// server's certificate is self-signed). Every string is quoted: a cluster
// named n, y, no or 1 would otherwise be read as a boolean or a number.
func WriteKubeconfig(path, name, server, token string) error {
	return writeKubeconfig(path, name, server, token, "", nil)
}

// writeKubeconfig is WriteKubeconfig, impersonating asUser (with asGroups)
// when asUser is not empty.
func writeKubeconfig(path, name, server, token, asUser string, asGroups []string) error {
	q := strconv.Quote
	as := ""
	if asUser != "" {
		as = "\n    as: " + q(asUser)
		if len(asGroups) > 0 {
			as += "\n    as-groups: " + quoteList(asGroups)
		}
	}
	s := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: %[1]s
  cluster:
    server: %[2]s
    insecure-skip-tls-verify: true
users:
- name: %[3]s
  user:
    token: %[4]s%[5]s
contexts:
- name: %[1]s
  context:
    cluster: %[1]s
    user: %[3]s
current-context: %[1]s
`, q(name), q(server), q(name+"-admin"), q(token), as)
	return os.WriteFile(path, []byte(s), 0o600)
}

// RESTConfig loads a kubeconfig with the harness's request timeout and a rate
// limit high enough to create hundreds of Pods quickly.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = clientTimeout
	cfg.QPS, cfg.Burst = 500, 1000
	return cfg, nil
}

// WatchConfig is a copy of cfg without its request timeout, for watches and
// other long requests (a watch ends when its context is cancelled).
func WatchConfig(cfg *rest.Config) *rest.Config {
	w := rest.CopyConfig(cfg)
	w.Timeout = 0
	return w
}

// NewClient returns a clientset for a kubeconfig with the given per-request
// timeout (the clientset's own when zero).
func NewClient(t T, kubeconfig string, timeout time.Duration) *kubernetes.Clientset {
	t.Helper()
	cfg, err := RESTConfig(kubeconfig)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	if timeout > 0 {
		cfg.Timeout = timeout
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	return cs
}

// ctx returns a context bounded by the harness's request timeout.
func ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), clientTimeout+5*time.Second)
}
