package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// rejectedPod is a Pod whose export annotation was (partly) rejected.
type rejectedPod struct {
	cluster, namespace, name string
	rejections               []annotation.Rejection
}

// runExplain says why a name answers what it answers, from a snapshot file
// or from a live cluster: the answer the plugin's own table gives, the Pods
// of each cluster behind it, those left out and why.
func runExplain(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := flags("explain", stderr)
	file := fs.String("snapshot", "", "a snapshot file")
	kubeconfig := fs.String("kubeconfig", "", "a cluster's kubeconfig (instead of --snapshot)")
	kubecontext := fs.String("context", "", "the kubeconfig context")
	cluster := fs.String("cluster", "", "with --kubeconfig: that cluster's ID")
	verify := fs.String("verify", "", "with --kubeconfig: a verify folder, to check signatures as the plugin does")
	local := fs.String("local", "", "the local cluster's ID, for the prefer-local answer (with --kubeconfig: --cluster)")
	zone := fs.String("zone", "clusterset.local", "the clusterset zone")
	expire := fs.Duration("expire", 0, "with --snapshot: the Corefile's expire, for which policy applies to a cluster out of contact (0: none)")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on reading the snapshot or listing the Pods")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (*file == "") == (*kubeconfig == "") || (*kubeconfig != "" && *cluster == "") {
		fmt.Fprintln(stderr, "usage: mcsctl explain NAME --snapshot FILE [--local ID] [--expire D]\n       mcsctl explain NAME --kubeconfig K --cluster ID [--context C] [--verify DIR]")
		return errUsage
	}
	z := dns.Fqdn(strings.ToLower(*zone))
	qname := dns.Fqdn(strings.ToLower(pos[0]))
	if !dns.IsSubDomain(z, qname) {
		// "backend.default" is short for backend.default.svc.<zone>.
		qname = strings.TrimSuffix(qname, ".") + ".svc." + z
	}
	_, svcName, svcNS, ok := table.SplitServiceName(qname, z)
	if !ok {
		return fmt.Errorf("%s is not a service name: want [PREFIX.]SERVICE.NAMESPACE.svc.%s", qname, z)
	}

	pods := map[string][]*store.Pod{}
	metas := map[string]snapshot.Meta{}
	var imports []table.ClusterSetIP
	var rejected []rejectedPod
	from := ""
	now := time.Now()
	if *file != "" {
		s, err := readSite(*file, *timeout)
		if err != nil {
			return err
		}
		pods, metas, imports = s.pods, s.metas, s.clusterSetIPs
		from = "snapshot " + *file
	} else {
		metas[*cluster] = snapshot.Meta{State: "connected"} // it just answered
		*local = *cluster
		var key ed25519.PublicKey
		if *verify != "" {
			keys, err := annotation.ReadPublicKeys(*verify)
			if err != nil {
				return fmt.Errorf("verify %s: %w", *verify, err)
			}
			if key = keys[*cluster]; key == nil {
				return fmt.Errorf("verify %s: no %s%s", *verify, *cluster, annotation.KeySuffix)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		defer cancel()
		ps, rej, err := livePods(ctx, *kubeconfig, *kubecontext, *cluster, svcNS, key)
		if err != nil {
			return err
		}
		pods[*cluster], rejected = ps, rej
		from = fmt.Sprintf("cluster %s (namespace %s, Pods labelled %s=%s)", *cluster, svcNS, annotation.ExporterLabel, annotation.LabelValue)
	}

	// The table answers as the plugin's would now: an expired cluster's
	// records dropped, a stale one's as its services' policies say.
	records := store.New()
	t := table.New(table.Config{Zone: z, TTL: 5, LocalCluster: *local, Locality: table.PreferLocal}, records)
	states := map[string]string{}
	ages := map[string]time.Duration{}
	for c, ps := range pods {
		states[c], ages[c] = contactState(metas[c], now, *expire)
		if states[c] != stateExpired {
			records.ReplaceCluster(c, ps)
		}
	}
	t.SetClusterSetIPs(imports)
	t.Rebuild()
	for c, state := range states {
		if state == stateStale && ages[c] > 0 {
			t.SetStaleFor(c, ages[c])
		}
	}
	ix := t.Rebuild()

	fmt.Fprintf(stdout, "%s (from %s)\n\nAnswers:\n", qname, from)
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV} {
		a := ix.Lookup(qname, qt)
		fmt.Fprintf(stdout, "  %-4s %s\n", dns.TypeToString[qt], a.Kind)
		for _, rr := range answerRRs(a) {
			rr.Header().Name = qname
			fmt.Fprintf(stdout, "       %s\n", rr)
		}
	}

	fmt.Fprintf(stdout, "\nWhy:\n")
	for _, ci := range imports {
		if ci.Namespace == svcNS && ci.Name == svcName {
			fmt.Fprintf(stdout, "  a ClusterSetIP ServiceImport gives %s/%s the IPs %v: its name answers with them instead of the endpoints\n", svcNS, svcName, ci.IPs)
		}
	}
	hasLocal := *local != "" && localReady(pods[*local], svcNS, svcName)
	for _, c := range slices.Sorted(maps.Keys(pods)) {
		if policies := stalePolicyOf(pods[c], svcNS, svcName); len(policies) > 0 {
			fmt.Fprintf(stdout, "  cluster %s: %s\n", c, staleLine(states[c], ages[c], applies(policies, *expire, hasLocal, *local != "")))
		}
	}
	found := false
	for c, ps := range pods {
		if states[c] == stateExpired {
			continue
		}
		for _, p := range ps {
			for _, e := range p.Exports {
				if e.Namespace != svcNS || e.Name != svcName {
					continue
				}
				found = true
				why := "answered: ready, with an IP"
				switch {
				case len(p.IPs) > 0 && p.Ready && states[c] == stateStale &&
					ix.Lookup(p.EndpointHostname()+"."+c+"."+svcName+"."+svcNS+".svc."+z, dns.TypeA).Kind != table.KindEndpoint:
					why = "not answered: its cluster has been out of contact for longer than the stale policy allows"
				case len(p.IPs) == 0:
					why = "not answered: the Pod has no IP"
				case !p.Ready:
					why = "not answered: the Pod is not ready"
				case *local != "" && c != *local && localReady(pods[*local], svcNS, svcName):
					why = "answered by its endpoint name and SRV; left out of the service's A/AAAA: the local cluster has ready endpoints (prefer-local)"
				}
				fmt.Fprintf(stdout, "  cluster %s: Pod %s/%s (%s, %v): %s\n", c, p.Namespace, p.Name, p.EndpointHostname(), p.IPs, why)
			}
		}
	}
	if !found {
		fmt.Fprintf(stdout, "  no Pod exports %s/%s\n", svcNS, svcName)
	}
	for _, r := range rejected {
		for _, rj := range r.rejections {
			fmt.Fprintf(stdout, "  cluster %s: Pod %s/%s: rejected (%s): %s\n", r.cluster, r.namespace, r.name, rj.Reason, rj)
		}
	}
	if *file != "" {
		fmt.Fprintf(stdout, "  (a snapshot holds only what the plugin accepted: for rejected annotations, run explain with --kubeconfig)\n")
	}
	return nil
}

// localReady reports whether a local Pod is a ready endpoint of the service.
func localReady(pods []*store.Pod, ns, name string) bool {
	for _, p := range pods {
		if !p.Ready || len(p.IPs) == 0 {
			continue
		}
		for _, e := range p.Exports {
			if e.Namespace == ns && e.Name == name {
				return true
			}
		}
	}
	return false
}

func answerRRs(a table.Answer) []dns.RR {
	var out []dns.RR
	for i := range a.A {
		out = append(out, &a.A[i])
	}
	for i := range a.AAAA {
		out = append(out, &a.AAAA[i])
	}
	if a.SRV != nil {
		for i := range a.SRV.SRV {
			out = append(out, &a.SRV.SRV[i])
		}
	}
	return out
}

// livePods lists the exporting Pods of namespace from a cluster's API server
// and makes of them what the plugin's source makes: the records, and the
// rejections of the Pods whose annotation was not accepted whole.
func livePods(ctx context.Context, kubeconfig, kubecontext, cluster, namespace string, key ed25519.PublicKey) ([]*store.Pod, []rejectedPod, error) {
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
		&clientcmd.ConfigOverrides{CurrentContext: kubecontext}).ClientConfig()
	if err != nil {
		return nil, nil, err
	}
	rc.UserAgent = "mcsctl"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	return listPods(ctx, client, cluster, namespace, key)
}

// listPods is livePods with a client.
func listPods(ctx context.Context, client kubernetes.Interface, cluster, namespace string, key ed25519.PublicKey) ([]*store.Pod, []rejectedPod, error) {
	sel := labels.Set{annotation.ExporterLabel: annotation.LabelValue}.AsSelector().String()
	list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, nil, fmt.Errorf("cluster %s: listing Pods: %w", cluster, err)
	}
	var pods []*store.Pod
	var rejected []rejectedPod
	for i := range list.Items {
		p := &list.Items[i]
		rec, rej := source.Record(cluster, key, p)
		pods = append(pods, rec)
		if len(rej) > 0 {
			rejected = append(rejected, rejectedPod{cluster, p.Namespace, p.Name, rej})
		}
	}
	return pods, rejected, nil
}
