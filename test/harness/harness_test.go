package harness

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// TestCluster checks the control-plane half of the harness against a real
// etcd and kube-apiserver: a Pod made Ready by the harness acting as kubelet,
// annotations, delete, and the proxy cutting, blackholing and restoring a link.
func TestCluster(t *testing.T) {
	c := StartCluster(t, "n") // "n" reads as a YAML boolean unless quoted
	ns := c.NewNamespace(t)

	pod := ExporterPod("web-0", "web-0", ExportService{Name: "backend",
		Ports: []ExportPort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}}})
	c.CreatePod(t, ns, pod)
	c.SetPodReady(t, ns, "web-0", true, "10.244.0.5", "fd00:10:244::5")

	got := c.GetPod(t, ns, "web-0")
	if got.Spec.NodeName != FakeNode || got.Spec.Hostname != "web-0" {
		t.Errorf("spec: nodeName %q hostname %q", got.Spec.NodeName, got.Spec.Hostname)
	}
	if got.Labels[ExporterLabel] != "true" {
		t.Errorf("labels: %v", got.Labels)
	}
	if want := `{"services":[{"name":"backend","ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}]}]}`; got.Annotations[ExportAnnotation] != want {
		t.Errorf("annotation:\n got %s\nwant %s", got.Annotations[ExportAnnotation], want)
	}
	if got.Status.Phase != corev1.PodRunning || got.Status.PodIP != "10.244.0.5" {
		t.Errorf("status: phase %s podIP %s", got.Status.Phase, got.Status.PodIP)
	}
	var ips []string
	for _, ip := range got.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	if !reflect.DeepEqual(ips, []string{"10.244.0.5", "fd00:10:244::5"}) {
		t.Errorf("podIPs: %v", ips)
	}
	if !podReady(got) {
		t.Errorf("pod not Ready: %+v", got.Status.Conditions)
	}

	// Not Ready keeps the IPs; a changed IP replaces them.
	c.SetPodReady(t, ns, "web-0", false)
	if got := c.GetPod(t, ns, "web-0"); podReady(got) || got.Status.PodIP != "10.244.0.5" {
		t.Errorf("after not-ready: ready %v podIP %s", podReady(got), got.Status.PodIP)
	}
	c.SetPodReady(t, ns, "web-0", true, "10.244.0.9")
	if got := c.GetPod(t, ns, "web-0"); !podReady(got) || got.Status.PodIP != "10.244.0.9" || len(got.Status.PodIPs) != 1 {
		t.Errorf("after IP change: ready %v podIP %s podIPs %v", podReady(got), got.Status.PodIP, got.Status.PodIPs)
	}

	c.SetPodAnnotation(t, ns, "web-0", ExportAnnotation, "{not json")
	if got := c.GetPod(t, ns, "web-0"); got.Annotations[ExportAnnotation] != "{not json" {
		t.Errorf("annotation after update: %q", got.Annotations[ExportAnnotation])
	}
	c.RemovePodAnnotation(t, ns, "web-0", ExportAnnotation)
	if got := c.GetPod(t, ns, "web-0"); len(got.Annotations) != 0 {
		t.Errorf("annotations after remove: %v", got.Annotations)
	}

	// The kubeconfig quotes names: client-go reads it back with the cluster named "n".
	kc, err := os.ReadFile(c.Kubeconfig)
	if err != nil || !strings.Contains(string(kc), `- name: "n"`) {
		t.Errorf("kubeconfig does not quote the name: %v\n%s", err, kc)
	}

	// Through the proxy.
	p := StartProxy(t, c.APIServerAddr())
	viaProxy := NewClient(t, c.KubeconfigVia(t, p), 2*time.Second)
	list := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := viaProxy.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err
	}
	before := p.Received()
	if err := list(); err != nil {
		t.Fatalf("list through the proxy: %v", err)
	}
	// At least the TLS records of the list's answer came back through it.
	if got := p.Received() - before; got < 100 {
		t.Errorf("the proxy counted %d bytes from the API server for a list", got)
	}
	p.Cut(t)
	if err := list(); err == nil {
		t.Fatalf("list through a cut proxy succeeded")
	} else {
		t.Logf("cut: %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Errorf("a cut proxy accepted a connection")
	}
	p.Restore(t)
	Eventually(t, 10*time.Second, list)

	p.Blackhole(t)
	start := time.Now()
	if err := list(); err == nil {
		t.Fatalf("list through a blackholed proxy succeeded")
	} else {
		t.Logf("blackhole: %v after %s", err, time.Since(start).Round(time.Millisecond))
	}
	p.Restore(t)
	Eventually(t, 10*time.Second, list)

	c.DeletePod(t, ns, "web-0")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil || len(pods.Items) != 0 {
		t.Errorf("after delete: %v, %d pods", err, len(pods.Items))
	}
}

// TestAPIServerSignals pauses, kills and restarts a kube-apiserver: the data
// survives in etcd and the server comes back on the same port.
func TestAPIServerSignals(t *testing.T) {
	c := StartCluster(t, "sig")
	ns := c.NewNamespace(t)
	c.CreateReadyPods(t, ns, ReadyPod{Pod: Pod{Name: "a"}, IPs: []string{"10.244.1.1"}})

	c.PauseAPIServer(t)
	if err := c.Ready(); err == nil {
		t.Errorf("a stopped (SIGSTOP) API server answered /readyz")
	}
	c.ResumeAPIServer(t)
	Eventually(t, 10*time.Second, c.Ready)

	pid := c.APIServer().PID()
	c.KillAPIServer(t, syscall.SIGKILL)
	if c.APIServer().Running() || c.Ready() == nil {
		t.Fatalf("API server still up after SIGKILL")
	}
	c.StartAPIServer(t)
	if c.APIServer().PID() == pid {
		t.Errorf("same PID after restart")
	}
	if got := c.GetPod(t, ns, "a"); got.Status.PodIP != "10.244.1.1" {
		t.Errorf("pod after restart: %s", got.Status.PodIP)
	}

	c.RestartAPIServer(t) // SIGTERM path
	if got := c.GetPod(t, ns, "a"); !podReady(got) {
		t.Errorf("pod not Ready after restart")
	}

	// A clean loss: kube-apiserver may linger after SIGTERM; KillAPIServer
	// returns within its bounds either way, with the server gone.
	c.KillAPIServer(t, syscall.SIGTERM)
	if c.APIServer().Running() || c.Ready() == nil {
		t.Fatalf("API server still up after KillAPIServer(SIGTERM)")
	}
}

// TestTwoClusters starts two clusters side by side; they share nothing.
func TestTwoClusters(t *testing.T) {
	cs := StartClusters(t, "edge-a", "edge-b")
	nsA := cs[0].NewNamespace(t)
	cs[0].CreatePod(t, nsA, Pod{Name: "only-in-a"})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cs[1].Client.CoreV1().Namespaces().Get(ctx, nsA, metav1.GetOptions{}); err == nil {
		t.Errorf("namespace %s of edge-a is visible in edge-b", nsA)
	}
	if cs[0].APIServerPort == cs[1].APIServerPort || cs[0].EtcdPort == cs[1].EtcdPort {
		t.Errorf("clusters share ports")
	}
}

// TestCoreDNS checks the CoreDNS half of the harness with stock plugins only
// (whoami, template), so it passes whatever state mcsannotations is in: the
// server answers over UDP and TCP, from a chosen source address, with EDNS0,
// restarts on the same port, and a second server is refused that port.
func TestCoreDNS(t *testing.T) {
	const corefile = `example.test:{PORT} {
    bind 127.0.0.1
    whoami
}
big.test:{PORT} {
    bind 127.0.0.1
    template IN A big.test {
        answer "{{ .Name }} 5 IN A 10.0.0.1"
{ANSWERS}    }
}
`
	var answers strings.Builder
	for i := 2; i <= 60; i++ {
		answers.WriteString(`        answer "{{ .Name }} 5 IN A 10.0.0.` + itoa(i) + "\"\n")
	}
	d := StartCoreDNS(t, corefile, map[string]string{"ANSWERS": answers.String()})

	for _, tcp := range []bool{false, true} {
		m, err := d.Exchange(Query{Name: "example.test", Type: dns.TypeA, TCP: tcp, Source: "127.0.0.2"})
		if err != nil {
			t.Fatal(err)
		}
		if got := ExtraAddrs(m); len(got) != 1 || !strings.HasSuffix(got[0], " 127.0.0.2") {
			t.Errorf("tcp=%v: whoami saw %v, want source 127.0.0.2", tcp, got)
		}
	}

	m := d.Query(t, "big.test", dns.TypeA, false)
	if !m.Truncated {
		t.Errorf("60 A records over plain UDP: TC not set (%d answers)", len(m.Answer))
	}
	m = d.Query(t, "big.test", dns.TypeA, true)
	if m.Truncated || len(Addrs(m)) != 60 {
		t.Errorf("over TCP: TC %v, %d addresses", m.Truncated, len(Addrs(m)))
	}
	m, err := d.Exchange(Query{Name: "big.test", Type: dns.TypeA, UDPSize: 4096})
	if err != nil || m.Truncated || len(Addrs(m)) != 60 {
		t.Errorf("over UDP with EDNS0 4096: %v, TC %v, %d addresses", err, m != nil && m.Truncated, len(m.Answer))
	}

	// The port is held: a second server must be refused it.
	if err := PortFree(d.Port); err == nil {
		t.Errorf("PortFree says CoreDNS's port %d is free", d.Port)
	}

	pid := d.Process().PID()
	d.Restart(t)
	if d.Process().PID() == pid || !d.Running() {
		t.Errorf("restart: PID %d -> %d, running %v", pid, d.Process().PID(), d.Running())
	}
	if m := d.Query(t, "example.test", dns.TypeA, false); Rcode(m) != "NOERROR" {
		t.Errorf("after restart: %s", Rcode(m))
	}
	if !strings.Contains(d.Log(), "=== harness: ") {
		t.Errorf("log has no start marker: %s", d.LogPath())
	}
}

// TestProcessStop checks Stop's SIGTERM-then-SIGKILL path on a process that
// ignores SIGTERM, and that a stopped (SIGSTOP) process is stopped too.
func TestProcessStop(t *testing.T) {
	sh, err := lookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	p := newProcess("stubborn", filepath.Join(t.TempDir(), "log"), sh, "-c", `trap "" TERM; echo trapped$((40+2)); while :; do sleep 0.05; done`)
	startProcess(t, p, 5)
	Eventually(t, 5*time.Second, func() error {
		// (the start marker holds the command line, so look for what only the shell prints)
		if !strings.Contains(Tail(p.LogPath, 5), "trapped42") {
			return errNotYet
		}
		return nil
	})
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := p.Stop(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if p.Running() {
		t.Fatalf("still running")
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("stopped after %s: SIGTERM should have been ignored until the grace ran out", took)
	}
	t.Logf("stopped in %s\n%s", time.Since(start).Round(time.Millisecond), Tail(p.LogPath, 5))
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

var errNotYet = errors.New("not yet")

func itoa(i int) string { return strconv.Itoa(i) }

func lookPath(name string) (string, error) { return exec.LookPath(name) }

// A watch through WatchClient outlives the harness's request timeout, which
// ends a watch made through Client: client-go applies it to the stream.
func TestWatchOutlivesRequestTimeout(t *testing.T) {
	defer func(d time.Duration) { clientTimeout = d }(clientTimeout)
	clientTimeout = 2 * time.Second
	c := StartCluster(t, "watch")
	ns := c.NewNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The watch through WatchClient starts first: were the timeout applied
	// to it, it would end before the other.
	long, err := c.WatchClient.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer long.Stop()
	short, err := c.Client.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Stop()
	// The request timeout ends the first watch (the namespace has no
	// ConfigMap: the only event it may see is an error).
	bound := time.After(clientTimeout + 20*time.Second)
	for ended := false; !ended; {
		select {
		case ev, ok := <-short.ResultChan():
			if ok && ev.Type != watch.Error {
				t.Fatalf("event %s on a namespace with no ConfigMap", ev.Type)
			}
			ended = !ok
		case <-bound:
			t.Fatalf("the watch through Client still runs %s after its start, past the request timeout of %s", clientTimeout+20*time.Second, clientTimeout)
		}
	}
	// Past the request timeout, the other watch still sees a change.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-timeout"}}
	if _, err := c.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev, ok := <-long.ResultChan():
		if !ok {
			t.Fatal("the watch through WatchClient ended with the request timeout")
		}
		if got, _ := ev.Object.(*corev1.ConfigMap); ev.Type != watch.Added || got == nil || got.Name != cm.Name {
			t.Fatalf("watch through WatchClient: %s %T, want ADDED of %s", ev.Type, ev.Object, cm.Name)
		}
	case <-ctx.Done():
		t.Fatal("the watch through WatchClient saw no ADDED event")
	}
}
