// Command mcs-demo is `make demo`: two local Kubernetes clusters, sample
// workloads, our CoreDNS answering multi-cluster names, and what happens when
// the link to the API server is cut and CoreDNS restarts while it is.
//
// It runs real etcd and kube-apiserver processes on 127.0.0.1 through the
// end-to-end test harness (test/harness), creates the Services,
// ServiceExports and Pods of manifests/examples/<cluster>.yaml with
// client-go, acts as the Pods' kubelet, runs bin/mcs-annotator in each
// cluster (it writes the Pods' export annotations) and bin/coredns, and
// prints dig's answers at each step. It checks every
// answer and exits non-zero with a message when one is wrong; it stops every
// process it started (by PID) and removes its temporary folders, also on
// failure and on Ctrl-C.
//
// Run it with `make demo` (which first builds bin/coredns and the tools), or
// after `make build tools`:
//
//	env $(tools/install.sh env) go run ./cmd/mcs-demo
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

// peers: edge-a's CoreDNS also watches edge-b (the Corefile word
// `peer edge-b KUBECONFIG`, through a TCP proxy the demo can cut), so that
// db.demo, whose only Pod is in edge-b, resolves, also offline.
// `make demo DEMO_FLAGS=-peers=false` watches edge-a alone.
var peers = flag.Bool("peers", true, "edge-a's CoreDNS also watches edge-b (Corefile word `peer edge-b KUBECONFIG`)")

// corefile is edge-a's CoreDNS configuration; {PEERS} is one
// `peer NAME KUBECONFIG` line per peer, or nothing.
const corefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    errors
    mcsannotations clusterset.local {
        cluster ` + local + `
        kubeconfig {KUBECONFIG}
{PEERS}        snapshot {DIR}/table.db
        ttl 5
    }
}
`

func main() {
	flag.Parse()
	r := harness.NewProgram("mcs-demo", nil)
	start := time.Now()

	ok, sig := r.RunUntilSignal(func() { demo(r) })
	code := 0
	switch {
	case sig != nil:
		fmt.Fprintf(os.Stderr, "mcs-demo: %v: stopping everything\n", sig)
		code = 130
	case !ok || r.Failed():
		code = 1
	}

	switch code {
	case 0:
		fmt.Println("== step 8: clean up: stop every process by PID, remove the temporary folders")
		r.SetStep(" at clean-up")
	case 130:
		fmt.Println("== interrupted: stop every process by PID, remove the temporary folders")
		r.SetStep(" after the interrupt") // the demo's goroutine may still report what it sees going
	default:
		fmt.Println("== clean up after the failure: stop every process by PID, remove the temporary folders")
		r.SetStep(" at clean-up")
	}
	r.RunCleanups()
	procs, dirs := r.Leftovers()
	if len(procs) > 0 || len(dirs) > 0 {
		fmt.Fprintf(os.Stderr, "mcs-demo: FAILED (clean-up): still running: %v; still present: %v\n", procs, dirs)
		os.Exit(1)
	}
	fmt.Printf("   stopped every process (%s) and removed the temporary folders\n", strings.Join(r.Processes(), ", "))
	if code != 0 || r.Failed() {
		fmt.Fprintln(os.Stderr, "== demo FAILED: see the messages above")
		if code == 0 {
			code = 1
		}
		os.Exit(code)
	}
	fmt.Printf("== demo passed in %s\n", time.Since(start).Round(100*time.Millisecond))
}

// demo runs steps 1 to 7; any failure ends it through r.Fatalf.
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

	step(r, 2, "create the sample workloads from manifests/examples/, act as their kubelet, run the annotator")
	world := model{}
	for _, c := range cs {
		c.InstallMCSCRDs(r) // edge-b's db is exported by a ServiceExport
		pods, exports := createWorkloads(r, c, filepath.Join(root, "manifests", "examples", c.Name+".yaml"))
		annotate(r, c, pods, exports, world)
	}

	watched := []string{local}
	vars := map[string]string{"KUBECONFIG": a.Kubeconfig, "PEERS": ""}
	var link *harness.Proxy // edge-a's link to edge-b's API server
	if *peers {
		link = harness.StartProxy(r, b.APIServerAddr())
		vars["PEERS"] = fmt.Sprintf("        peer %s %s\n", peerName, b.KubeconfigVia(r, link))
		watched = append(watched, peerName)
	}
	step(r, 3, "start our CoreDNS for %s (watches %s; snapshot on disk)", local, strings.Join(watched, " and "))
	d := harness.StartCoreDNS(r, corefile, vars)
	fmt.Println(harness.Indent(d.Corefile, "   | "))
	checks := world.checks(watched)

	step(r, 4, "ask CoreDNS (dig @127.0.0.1 -p %d) while everything is up", d.Port)
	took := waitAll(r, d, checks, syncTimeout)
	fmt.Printf("   CoreDNS answered correctly %s after it first answered\n", took.Round(time.Millisecond))
	showAll(r, dig, d, checks)

	if link != nil {
		step(r, 5, "cut the site off: the link to %s (127.0.0.1:%d) and %s's own kube-apiserver (SIGKILL, PID %d)",
			peerName, link.Port(), local, a.APIServer().PID())
		link.Cut(r)
	} else {
		step(r, 5, "cut the link to %s's API server: kill its kube-apiserver (SIGKILL, PID %d)", local, a.APIServer().PID())
	}
	a.KillAPIServer(r, syscall.SIGKILL)
	if err := a.Ready(); err == nil {
		r.Fatalf("%s's API server still answers after it was stopped", local)
	}
	if link != nil {
		fmt.Printf("   %s's API server is down and %s is unreachable; watching the answers for %s\n", local, peerName, offlineWatch)
	} else {
		fmt.Printf("   %s's API server is down; watching the answers for %s\n", local, offlineWatch)
	}
	steady(r, d, checks, offlineWatch)
	showAll(r, dig, d, checks)

	step(r, 6, "restart CoreDNS while still cut off: it answers from its snapshot")
	d.Restart(r)
	took = waitAll(r, d, checks, restartTimeout)
	if err := a.Ready(); err == nil {
		r.Fatalf("%s's API server answers again: the step proves nothing", local)
	}
	fmt.Printf("   CoreDNS PID %d answered correctly %s after it first answered (%s's API server still down)\n",
		d.Process().PID(), took.Round(time.Millisecond), local)
	for _, l := range snapshotLines(d.Log()) {
		fmt.Println("   log: " + l)
	}
	showAll(r, dig, d, checks)

	step(r, 7, "what an operator sees while still cut off: bin/mcsctl snapshot %s", filepath.Join(d.Dir, "table.db"))
	showSnapshot(r, filepath.Join(d.Dir, "table.db"), world.checks(watched))
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
// and the ServiceExports ("namespace/name").
func createWorkloads(r *harness.Program, c *harness.Cluster, path string) ([]workloadPod, []string) {
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

// annotate runs the annotator against c, waits until it has written the
// export annotation of every Pod an exported Service selects and the Ready
// condition of each ServiceExport, and records those Pods, as the annotator
// left them, in the model.
func annotate(r *harness.Program, c *harness.Cluster, pods []workloadPod, exports []string, world model) {
	a := harness.StartAnnotator(r, c.Kubeconfig, "--cluster", c.Name, "--leader-elect=false")
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

// add records the services a Pod's export annotation names (SPEC section 2
// defaults: the Pod's namespace, targetPort = port, protocol TCP).
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

// steady checks every answer every 250 ms for a while: each must stay right.
func steady(r *harness.Program, d *harness.CoreDNS, checks []check, period time.Duration) {
	n := 0
	for end := time.Now().Add(period); time.Now().Before(end); n++ {
		if err := verifyAll(d, checks); err != nil {
			r.Fatalf("wrong answer %s after the cut: %v", time.Since(end.Add(-period)).Round(time.Millisecond), err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	fmt.Printf("   all %d answers were right %d times in a row\n", len(checks), n)
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
