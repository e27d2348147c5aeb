// Command mcs-demo is `make demo`: two local Kubernetes clusters, sample
// workloads, the MCS objects (ServiceImports with their ClusterSetIPs,
// EndpointSlices) our controller keeps in each, our CoreDNS answering
// multi-cluster names, and what happens when the links between the clusters
// and to an API server are cut and CoreDNS and the controllers restart while
// they are.
//
// It runs real etcd and kube-apiserver processes on 127.0.0.1 through the
// end-to-end test harness (test/harness), creates the Services,
// ServiceExports and Pods of manifests/examples/<cluster>.yaml with
// client-go, acts as the Pods' kubelet, and runs in each cluster
// bin/mcs-annotator with its MCS controller (it writes the Pods' export
// annotations, and the ServiceImports, derived Services and EndpointSlices
// from both clusters' exports) and bin/coredns, each watching the other
// cluster through a link the demo cuts. It prints the MCS objects and dig's
// answers at each step, checks every object and answer, and exits non-zero
// with a message when one is wrong; it stops every process it started (by
// PID) and removes its temporary folders, also on failure and on Ctrl-C.
//
// Run it with `make demo` (which first builds bin/coredns and the tools), or
// after `make build tools`:
//
//	env $(tools/install.sh env) go run ./test/demo
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

const (
	zone     = "clusterset.local."
	local    = "edge-a" // the cluster whose CoreDNS the demo runs
	peerName = "edge-b"
	ns       = "demo"

	syncTimeout     = 20 * time.Second // first answers after CoreDNS starts
	annotateTimeout = 20 * time.Second // the annotator's first writes
	offlineWatch    = 6 * time.Second  // how long answers are watched after the cut
	restartTimeout  = 5 * time.Second  // answers after the restart
)

// peers: each cluster's CoreDNS and MCS controller also watch the other
// cluster (the Corefile word `peer NAME KUBECONFIG` and the controller's
// --peer NAME=KUBECONFIG, through a TCP proxy the demo can cut), so that
// db.demo, whose only Pod is in edge-b, resolves in edge-a, also offline.
// `make demo DEMO_FLAGS=-peers=false` watches each cluster alone.
var peers = flag.Bool("peers", true, "each cluster's CoreDNS and MCS controller also watch the other cluster")

// corefile is a cluster's CoreDNS configuration; {PEERS} is one
// `peer NAME KUBECONFIG` line per peer, or nothing.
const corefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    errors
    mcsannotations clusterset.local {
        cluster {CLUSTER}
        kubeconfig {KUBECONFIG}
{PEERS}        snapshot {DIR}/table.db
        ttl 5
    }
}
`

// site is one demo cluster: its API server, its link to the other
// cluster's, its annotator with the MCS controller, its CoreDNS.
type site struct {
	c       *harness.Cluster
	link    *harness.Proxy // to the peer's API server (nil: -peers=false)
	watched []string       // this cluster, and its peer
	ctlArgs []string
	ctl     *harness.Annotator
	dns     *harness.CoreDNS
	checks  []check // what its CoreDNS must answer
}

// startController runs bin/mcs-annotator with its MCS controller.
func (s *site) startController(r *harness.Program) {
	s.ctl = harness.StartAnnotator(r, s.c.Kubeconfig, s.ctlArgs...)
}

// waitReconciled waits until the controller has written (or found right)
// everything once since it started.
func (s *site) waitReconciled(r *harness.Program) {
	harness.Eventually(r, mcsTimeout, func() error {
		v, ok, err := s.ctl.Metric("mcs_controller_reconcile_seconds_count")
		if err != nil || !ok || v == 0 {
			return fmt.Errorf("%s: the MCS controller has not reconciled since it started (%v, %v); log:\n%s",
				s.c.Name, v, err, harness.Tail(s.ctl.Process().LogPath, 20))
		}
		return nil
	})
}

func main() {
	flag.Parse()
	r := harness.NewProgram("mcs-demo", nil)
	start := time.Now()
	if code := r.Main(func() { demo(r) }); code != 0 {
		fmt.Fprintln(os.Stderr, "== demo FAILED: see the messages above")
		os.Exit(code)
	}
	fmt.Printf("== demo passed in %s\n", time.Since(start).Round(100*time.Millisecond))
}

// demo runs steps 1 to 8; any failure ends it through r.Fatalf.
func demo(r *harness.Program) {
	harness.RequireTools(r) // every tool, or a clear failure
	dig, err := exec.LookPath("dig")
	if err != nil {
		r.Fatalf("dig not found: `make tools` installs it (Debian package bind9-dnsutils)")
	}
	root, err := harness.RepoRoot()
	if err != nil {
		r.Fatalf("%v (run the demo from the repository)", err)
	}

	step(r, 1, "start two local clusters, %s and %s (etcd + kube-apiserver each, on 127.0.0.1)", local, peerName)
	cs := harness.StartClusters(r, local, peerName)
	a, b := cs[0], cs[1]
	sites := []*site{{c: a, watched: []string{local}}, {c: b, watched: []string{peerName}}}
	if *peers {
		// Each cluster watches the other through a link the demo can cut.
		for i, s := range sites {
			other := sites[1-i].c
			s.link = harness.StartProxy(r, other.APIServerAddr())
			s.watched = append(s.watched, other.Name)
		}
	}
	ea := sites[0]

	step(r, 2, "create the sample workloads from manifests/examples/, act as their kubelet, run the annotator with its MCS controller")
	world := model{}
	types := map[string]mcsv1beta1.ServiceImportType{}
	for i, s := range sites {
		s.c.InstallMCSCRDs(r) // ServiceExports and the controller's ServiceImports
		pods, exports := createWorkloads(r, s.c, filepath.Join(root, "manifests", "examples", s.c.Name+".yaml"), types)
		s.ctlArgs = []string{"--cluster", s.c.Name, "--leader-elect=false", "--mcs-controller"}
		if s.link != nil {
			other := sites[1-i].c
			s.ctlArgs = append(s.ctlArgs, "--peer", other.Name+"="+other.KubeconfigVia(r, s.link))
		}
		s.startController(r)
		annotate(r, s.c, s.ctl, pods, exports, world)
	}

	step(r, 3, "the MCS objects the controllers wrote, in each cluster (every exported service, with its ClusterSetIP)")
	objs := waitMCS(r, sites, world, types)
	for _, s := range sites {
		showMCS(s.c.Name, objs[s.c.Name])
	}

	step(r, 4, "start our CoreDNS in each cluster (it watches %s; snapshot on disk) and ask it (dig)", strings.Join(ea.watched, " and "))
	for i, s := range sites {
		vars := map[string]string{"CLUSTER": s.c.Name, "KUBECONFIG": s.c.Kubeconfig, "PEERS": ""}
		if s.link != nil {
			other := sites[1-i].c
			vars["PEERS"] = fmt.Sprintf("        peer %s %s\n", other.Name, other.KubeconfigVia(r, s.link))
		}
		s.dns = harness.StartCoreDNS(r, corefile, vars)
		s.checks = objs[s.c.Name].clusterSetIPChecks()
		if s == ea {
			s.checks = append(world.checks(ea.watched), s.checks...)
		}
		if len(objs[s.c.Name].clusterSetIPChecks()) == 0 {
			r.Fatalf("%s: no ClusterSetIP service to ask for (manifests/examples exports web as one)", s.c.Name)
		}
	}
	fmt.Println(harness.Indent(ea.dns.Corefile, "   | "))
	for _, s := range sites {
		took := waitAll(r, s.dns, s.checks, syncTimeout)
		fmt.Printf("   %s's CoreDNS answered correctly %s after it first answered\n", s.c.Name, took.Round(time.Millisecond))
		showAll(r, dig, s.dns, s.checks)
	}

	if ea.link != nil {
		step(r, 5, "cut the clusters apart (both links) and %s off: its own kube-apiserver too (SIGKILL, PID %d)", local, a.APIServer().PID())
		for _, s := range sites {
			s.link.Cut(r)
		}
	} else {
		step(r, 5, "cut the link to %s's API server: kill its kube-apiserver (SIGKILL, PID %d)", local, a.APIServer().PID())
	}
	a.KillAPIServer(r, syscall.SIGKILL)
	if err := a.Ready(); err == nil {
		r.Fatalf("%s's API server still answers after it was stopped", local)
	}
	fmt.Printf("   %s's API server is down and the clusters cannot reach each other; watching the answers (and %s's objects) for %s\n",
		local, peerName, offlineWatch)
	steady(r, sites, func() { sameMCS(r, sites, objs, "after the cut") }, offlineWatch)
	for _, s := range sites {
		showAll(r, dig, s.dns, s.checks)
	}

	step(r, 6, "restart %s's CoreDNS while still cut off: it answers from its snapshot", local)
	d := ea.dns
	d.Restart(r)
	took := waitAll(r, d, ea.checks, restartTimeout)
	if err := a.Ready(); err == nil {
		r.Fatalf("%s's API server answers again: the step proves nothing", local)
	}
	fmt.Printf("   CoreDNS PID %d answered correctly %s after it first answered (%s's API server still down)\n",
		d.Process().PID(), took.Round(time.Millisecond), local)
	for _, l := range snapshotLines(d.Log()) {
		fmt.Println("   log: " + l)
	}
	showAll(r, dig, d, ea.checks)

	step(r, 7, "what an operator sees while still cut off: bin/mcsctl snapshot %s", filepath.Join(d.Dir, "table.db"))
	showSnapshot(r, filepath.Join(d.Dir, "table.db"), ea.checks)

	if ea.link != nil {
		step(r, 8, "%s's API server comes back, the clusters stay cut apart; restart both CoreDNS and both MCS controllers", local)
	} else {
		step(r, 8, "%s's API server comes back; restart both CoreDNS and both MCS controllers", local)
	}
	a.StartAPIServer(r)
	for _, s := range sites {
		if s.link != nil && s.link.Mode() != harness.Cut {
			r.Fatalf("the link of %s is %s: the step proves nothing", s.c.Name, s.link.Mode())
		}
		s.ctl.Stop(r)
		s.startController(r)
		s.dns.Restart(r)
	}
	for _, s := range sites {
		s.waitReconciled(r)
		took := waitAll(r, s.dns, s.checks, restartTimeout)
		fmt.Printf("   %s: controller PID %d reconciled, CoreDNS PID %d answered correctly %s after it first answered\n",
			s.c.Name, s.ctl.Process().PID(), s.dns.Process().PID(), took.Round(time.Millisecond))
	}
	fmt.Printf("   watching the objects of both clusters and the answers for %s\n", offlineWatch)
	steady(r, sites, func() { sameMCS(r, sites, objs, "after the restarts while cut apart") }, offlineWatch)
	after := map[string]mcsObjects{}
	for _, s := range sites {
		o, err := readMCS(r, s.c)
		if err != nil {
			r.Fatalf("%v", err)
		}
		after[s.c.Name] = o
		showMCS(s.c.Name, o)
		showAll(r, dig, s.dns, s.checks)
	}
	sameMCS(r, sites, objs, "at the end")
	fmt.Println("   the objects and the answers are what they were before the cut")
}

// showSnapshot runs bin/mcsctl (built beside bin/coredns by make build) on
// CoreDNS's snapshot file while CoreDNS holds it, prints the table, and
// fails unless every service the checks ask for is in it.
func showSnapshot(r *harness.Program, path string, checks []check) {
	mcsctl := filepath.Join(filepath.Dir(harness.FindTools().CoreDNS), "mcsctl")
	if _, err := os.Stat(mcsctl); err != nil {
		r.Fatalf("%s: %v (make build builds it)", mcsctl, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, mcsctl, "snapshot", path).CombinedOutput()
	fmt.Println(harness.Indent(strings.TrimRight(string(out), "\n"), "   | "))
	if err != nil {
		r.Fatalf("mcsctl snapshot %s: %v", path, err)
	}
	for _, c := range checks {
		prefix, _, ok := strings.Cut(c.name, ".svc.")
		labels := strings.Split(prefix, ".")
		if !ok || c.rcode != dns.RcodeSuccess || len(labels) < 2 {
			continue // not an answered service name
		}
		svc := labels[len(labels)-2] + "." + labels[len(labels)-1] // name.namespace
		name, ns, _ := strings.Cut(svc, ".")
		if !strings.Contains(string(out), ns+"/"+name) {
			r.Fatalf("mcsctl snapshot does not show service %s/%s (asked as %s)", ns, name, c.name)
		}
	}
}

// step prints one line per step and names it in failure messages.
func step(r *harness.Program, n int, format string, args ...any) {
	fmt.Printf("== step %d: %s\n", n, fmt.Sprintf(format, args...))
	r.SetStep(" at step " + strconv.Itoa(n))
}

// workloadPod is a Pod the demo created, with the IPs it reported for it
// and whether an exported Service of the sample selects it.
type workloadPod struct {
	namespace, name string
	ips             []string
	exported        bool
}

// createWorkloads creates the objects of one cluster's manifest file
// (Namespaces, Services, ServiceExports, Pods), then makes each Pod Running
// and Ready with the IPs of its `status` (as a kubelet would). It returns
// the Pods, each marked when an exported Service (annotation
// multicluster.kubernetes.io/export: "true", or a ServiceExport) selects it,
// and the ServiceExports ("namespace/name"); it records in types the type of
// ServiceImport each exported Service gets ("name.namespace": Headless for
// clusterIP None, else ClusterSetIP).
func createWorkloads(r *harness.Program, c *harness.Cluster, path string, types map[string]mcsv1beta1.ServiceImportType) ([]workloadPod, []string) {
	objs, err := harness.ReadManifests(path)
	if err != nil {
		r.Fatalf("%v", err)
	}
	var selectors []labels.Selector
	var exports []string
	exportedBy := map[string]bool{}
	for _, u := range objs {
		if u.GetKind() == "ServiceExport" {
			exports = append(exports, u.GetNamespace()+"/"+u.GetName())
			exportedBy[u.GetNamespace()+"/"+u.GetName()] = true
		}
	}
	var pods []workloadPod
	var created []string
	for _, u := range objs {
		switch u.GetKind() {
		case "Namespace":
			c.CreateNamespace(r, u.GetName())
		case "Service", "ServiceExport":
			if u.GetKind() == "Service" {
				var svc corev1.Service
				if err := harness.ToTyped(u, &svc); err != nil {
					r.Fatalf("%s: %v", path, err)
				}
				if svc.Annotations[harness.ServiceExportAnnotation] == "true" || exportedBy[svc.Namespace+"/"+svc.Name] {
					selectors = append(selectors, labels.SelectorFromSet(svc.Spec.Selector))
					types[svc.Name+"."+svc.Namespace] = mcsv1beta1.ClusterSetIP
					if svc.Spec.ClusterIP == corev1.ClusterIPNone {
						types[svc.Name+"."+svc.Namespace] = mcsv1beta1.Headless
					}
				}
			}
			if _, err := c.CreateObjects([]*unstructured.Unstructured{u}, false); err != nil {
				r.Fatalf("%s: %v", path, err)
			}
			created = append(created, u.GetKind()+" "+u.GetNamespace()+"/"+u.GetName())
		case "Pod":
			var p corev1.Pod
			if err := harness.ToTyped(u, &p); err != nil {
				r.Fatalf("%s: %v", path, err)
			}
			var ips []string
			for _, ip := range p.Status.PodIPs {
				ips = append(ips, ip.IP)
			}
			if len(ips) == 0 {
				r.Fatalf("%s: Pod %s/%s: give it status.podIPs (the IPs the demo's kubelet reports)", path, p.Namespace, p.Name)
			}
			c.CreatePodObject(r, &p)
			c.SetPodReady(r, p.Namespace, p.Name, true, ips...)
			pods = append(pods, workloadPod{namespace: p.Namespace, name: p.Name, ips: ips})
			created = append(created, fmt.Sprintf("Pod %s/%s %s (Ready)", p.Namespace, p.Name, strings.Join(ips, ",")))
		default:
			r.Fatalf("%s: %s: the demo creates Namespaces, Services, ServiceExports and Pods only", path, harness.ObjectName(u))
		}
	}
	for i := range pods {
		p := c.GetPod(r, pods[i].namespace, pods[i].name)
		for _, sel := range selectors {
			if sel.Matches(labels.Set(p.Labels)) {
				pods[i].exported = true
			}
		}
	}
	fmt.Printf("   %s: %s\n", c.Name, strings.Join(created, ", "))
	return pods, exports
}

// annotate waits until the annotator a, running against c, has written the
// export annotation of every Pod an exported Service selects and the Ready
// condition of each ServiceExport, and records those Pods, as the annotator
// left them, in the model.
func annotate(r *harness.Program, c *harness.Cluster, a *harness.Annotator, pods []workloadPod, exports []string, world model) {
	var shown bool
	took := harness.Eventually(r, annotateTimeout, func() error {
		for _, w := range pods {
			p := c.GetPod(r, w.namespace, w.name)
			if _, has := p.Annotations[harness.ExportAnnotation]; has != w.exported {
				return fmt.Errorf("%s: Pod %s/%s: export annotation %v, want %v", c.Name, w.namespace, w.name, has, w.exported)
			}
		}
		for _, e := range exports {
			ns, name, _ := strings.Cut(e, "/")
			_, conds, err := c.ServiceExportStatus(ns, name)
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(conds, func(c metav1.Condition) bool { return c.Type == "Ready" && c.Status == metav1.ConditionTrue }) {
				return fmt.Errorf("%s: ServiceExport %s: not Ready yet: %v", c.Name, e, conds)
			}
		}
		return nil
	})
	for _, w := range pods {
		if !w.exported {
			continue
		}
		p := c.GetPod(r, w.namespace, w.name)
		if err := world.add(c.Name, p, w.ips); err != nil {
			r.Fatalf("%s: %v", c.Name, err)
		}
		if !shown {
			fmt.Printf("   %s: mcs-annotator (PID %d) annotated the exported Pods in %s, e.g. %s/%s:\n     %s: %s\n",
				c.Name, a.Process().PID(), took.Round(time.Millisecond), w.namespace, w.name,
				harness.ExportAnnotation, strings.TrimSpace(p.Annotations[harness.ExportAnnotation]))
			shown = true
		}
	}
	for _, e := range exports {
		ns, name, _ := strings.Cut(e, "/")
		_, conds, err := c.ServiceExportStatus(ns, name)
		if err != nil {
			r.Fatalf("%s: ServiceExport %s: %v", c.Name, e, err)
		}
		var shownConds []string
		for _, cd := range conds {
			shownConds = append(shownConds, fmt.Sprintf("%s=%s (%s)", cd.Type, cd.Status, cd.Reason))
		}
		fmt.Printf("   %s: ServiceExport %s status: %s\n", c.Name, e, strings.Join(shownConds, ", "))
	}
}

func plural(n int, s string) string {
	if n == 1 {
		return "1 " + s
	}
	return strconv.Itoa(n) + " " + s + "s"
}

// endpoint is one exported endpoint of a service, as the plugin should see it.
type endpoint struct {
	cluster, hostname, ip string
	ports                 []harness.ExportPort
}

// model holds the endpoints of each service ("name.namespace") in every cluster.
type model map[string][]endpoint

// add records the services a Pod's export annotation names (the defaults of
// docs/DESIGN.md#wire-format: the Pod's namespace, targetPort = port, protocol
// TCP).
func (m model) add(cluster string, p *corev1.Pod, ips []string) error {
	raw, ok := p.Annotations[harness.ExportAnnotation]
	if !ok || p.Labels[harness.ExporterLabel] != "true" {
		return fmt.Errorf("Pod %s/%s: no exporter label or export annotation", p.Namespace, p.Name)
	}
	var a struct {
		Services []harness.ExportService `json:"services"`
	}
	if err := json.Unmarshal([]byte(raw), &a); err != nil {
		return fmt.Errorf("Pod %s/%s: export annotation: %w", p.Namespace, p.Name, err)
	}
	for _, ip := range ips {
		if strings.Contains(ip, ":") {
			return fmt.Errorf("Pod %s/%s: the demo checks IPv4 answers only", p.Namespace, p.Name)
		}
	}
	host := p.Spec.Hostname
	if host == "" {
		host = strings.ReplaceAll(ips[0], ".", "-")
	}
	for _, s := range a.Services {
		n := s.Namespace
		if n == "" {
			n = p.Namespace
		}
		ports := make([]harness.ExportPort, len(s.Ports))
		for i, pt := range s.Ports {
			if pt.TargetPort == 0 {
				pt.TargetPort = pt.Port
			}
			if pt.Protocol == "" {
				pt.Protocol = "TCP"
			}
			ports[i] = pt
		}
		m[s.Name+"."+n] = append(m[s.Name+"."+n], endpoint{cluster: cluster, hostname: host, ip: ips[0], ports: ports})
	}
	return nil
}

// selected is what a service name answers with when CoreDNS watches these
// clusters, locality prefer-local (the default): the local cluster's
// endpoints when it has any, else every watched cluster's.
func (m model) selected(svc string, watched []string) []endpoint {
	var mine, all []endpoint
	for _, e := range m[svc] {
		for _, w := range watched {
			if e.cluster == w {
				all = append(all, e)
				if w == local {
					mine = append(mine, e)
				}
			}
		}
	}
	if len(mine) > 0 {
		return mine
	}
	return all
}

// check is one query and the answer it must get.
type check struct {
	name  string
	qtype uint16
	rcode int
	want  []string // sorted: addresses (A), "port target" (SRV) or strings (TXT)
	note  string   // why, printed under dig's answer
}

// checks are the demo's queries and their expected answers.
func (m model) checks(watched []string) []check {
	svcName := func(svc string) string { return svc + ".svc." + zone } // svc is "name.namespace"
	addrs := func(svc string) check {
		c := check{name: svcName(svc), qtype: dns.TypeA, rcode: dns.RcodeSuccess}
		var from []string
		for _, e := range m.selected(svc, watched) {
			c.want = append(c.want, e.ip)
			from = append(from, e.cluster)
		}
		sort.Strings(c.want)
		if len(c.want) == 0 {
			c.rcode = dns.RcodeNameError
			c.note = "not in any watched cluster (" + strings.Join(watched, ", ") + ")"
		} else {
			c.note = "the ready Pods in " + strings.Join(uniq(from), " and ")
			if others := m.selected(svc, watched[1:]); len(others) > 0 && len(from) > 0 && from[0] == local {
				c.note += " (locality prefer-local: the other clusters' Pods answer only when " + local + " has none)"
			}
		}
		return c
	}
	srv := func(svc, port string) check {
		c := check{name: "_" + port + "._tcp." + svcName(svc), qtype: dns.TypeSRV, rcode: dns.RcodeSuccess}
		for _, e := range m.selected(svc, watched) {
			for _, p := range e.ports {
				if p.Name == port && p.Protocol == "TCP" {
					c.want = append(c.want, fmt.Sprintf("%d %s.%s.%s", p.TargetPort, e.hostname, e.cluster, svcName(svc)))
				}
			}
		}
		sort.Strings(c.want)
		if len(c.want) == 0 {
			c.rcode = dns.RcodeNameError
		}
		c.note = "one record per ready endpoint, port = targetPort"
		return c
	}
	version := check{name: "dns-version." + zone, qtype: dns.TypeTXT, rcode: dns.RcodeSuccess, want: []string{"1.0.0"},
		note: "the MCS DNS specification version"}
	db := addrs("db." + ns)
	if len(db.want) == 0 {
		db.note = "its only Pod is in " + peerName + ", which edge-a does not watch here (-peers=false)"
	}
	out := []check{addrs("backend." + ns), srv("backend."+ns, "http"), version, db}
	// One endpoint by name: <hostname>.<clusterid>.<svc>.<ns>.svc.<zone>.
	for _, e := range m.selected("db."+ns, watched) {
		out = append(out, check{name: e.hostname + "." + e.cluster + "." + svcName("db."+ns), qtype: dns.TypeA,
			rcode: dns.RcodeSuccess, want: []string{e.ip}, note: "one endpoint, named by its hostname and cluster"})
		break
	}
	return out
}

func uniq(ss []string) []string {
	sort.Strings(ss)
	out := ss[:0]
	for i, s := range ss {
		if i == 0 || s != ss[i-1] {
			out = append(out, s)
		}
	}
	return out
}

// verify asks CoreDNS once and compares the answer with the check.
func verify(d *harness.CoreDNS, c check) error {
	m, err := d.Exchange(harness.Query{Name: c.name, Type: c.qtype})
	if err != nil {
		return err
	}
	var got []string
	switch c.qtype {
	case dns.TypeA:
		got = harness.Addrs(m)
	case dns.TypeSRV:
		got = harness.SRVs(m)
	case dns.TypeTXT:
		got = harness.TXTs(m)
		sort.Strings(got)
	}
	if m.Rcode != c.rcode || strings.Join(got, " ") != strings.Join(c.want, " ") {
		return fmt.Errorf("%s %s: got %s %q, want %s %q", c.name, dns.TypeToString[c.qtype],
			dns.RcodeToString[m.Rcode], got, dns.RcodeToString[c.rcode], c.want)
	}
	return nil
}

func verifyAll(d *harness.CoreDNS, checks []check) error {
	for _, c := range checks {
		if err := verify(d, c); err != nil {
			return err
		}
	}
	return nil
}

// waitAll polls until every check passes and returns how long that took.
func waitAll(r *harness.Program, d *harness.CoreDNS, checks []check, timeout time.Duration) time.Duration {
	start := time.Now()
	for {
		err := verifyAll(d, checks)
		if err == nil {
			return time.Since(start)
		}
		if !d.Running() {
			r.Fatalf("CoreDNS exited; its log:\n%s", d.LogTail(30))
		}
		if time.Since(start) > timeout {
			r.Fatalf("wrong answer after %s: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// steady checks every answer of every site, and runs also (which fails the
// demo itself when something is wrong), every 250 ms for a while: each must
// stay right.
func steady(r *harness.Program, sites []*site, also func(), period time.Duration) {
	n, answers := 0, 0
	for end := time.Now().Add(period); time.Now().Before(end); n++ {
		for _, s := range sites {
			if err := verifyAll(s.dns, s.checks); err != nil {
				r.Fatalf("%s: wrong answer %s into the watch: %v", s.c.Name, time.Since(end.Add(-period)).Round(time.Millisecond), err)
			}
			if n == 0 {
				answers += len(s.checks)
			}
		}
		also()
		time.Sleep(250 * time.Millisecond)
	}
	fmt.Printf("   all %d answers (and the objects) were right %d times in a row\n", answers, n)
}

// showAll prints dig's view of every check, and fails when dig's status
// disagrees with the expected one.
func showAll(r *harness.Program, dig string, d *harness.CoreDNS, checks []check) {
	for _, c := range checks {
		args := []string{"@127.0.0.1", "-p", strconv.Itoa(d.Port), "+time=2", "+tries=1",
			"+noall", "+comments", "+answer", "+additional", strings.TrimSuffix(c.name, "."), dns.TypeToString[c.qtype]}
		out, err := exec.Command(dig, args...).CombinedOutput()
		if err != nil {
			r.Fatalf("dig %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		status, records := digAnswer(string(out))
		fmt.Printf("   $ dig %s\n", strings.Join(args[:3], " ")+" "+strings.Join(args[len(args)-2:], " "))
		fmt.Printf("     status %s: %s\n", status, c.note)
		for _, rec := range records {
			fmt.Println("     " + rec)
		}
		if status != dns.RcodeToString[c.rcode] {
			r.Fatalf("dig %s %s: status %s, want %s", c.name, dns.TypeToString[c.qtype], status, dns.RcodeToString[c.rcode])
		}
		if c.qtype == dns.TypeA {
			if got := digAddrs(records, c.name); strings.Join(got, " ") != strings.Join(c.want, " ") {
				r.Fatalf("dig %s A: addresses %q, want %q", c.name, got, c.want)
			}
		}
	}
}

// digAnswer reads dig's status and its answer and additional records (with
// tabs turned into single spaces) from `+noall +comments +answer +additional`.
func digAnswer(out string) (status string, records []string) {
	status = "?"
	for _, l := range strings.Split(out, "\n") {
		if i := strings.Index(l, "status: "); i >= 0 && strings.Contains(l, "->>HEADER<<-") {
			status = strings.TrimSuffix(strings.Fields(l[i+len("status: "):])[0], ",")
			continue
		}
		if l = strings.TrimSpace(l); l == "" || strings.HasPrefix(l, ";") {
			continue
		}
		records = append(records, strings.Join(strings.Fields(l), " "))
	}
	return status, records
}

// digAddrs returns the sorted addresses of the A records of name among
// dig's records ("name ttl IN A address").
func digAddrs(records []string, name string) []string {
	var out []string
	for _, rec := range records {
		f := strings.Fields(rec)
		if len(f) == 5 && strings.EqualFold(f[0], name) && f[2] == "IN" && f[3] == "A" {
			out = append(out, f[4])
		}
	}
	sort.Strings(out)
	return out
}

// snapshotLines are the plugin's log lines about the snapshot since the last
// start of CoreDNS.
func snapshotLines(log string) []string {
	if i := strings.LastIndex(log, " start coredns: "); i >= 0 {
		log = log[i:]
	}
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "mcsannotations") && strings.Contains(l, "snapshot") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}
