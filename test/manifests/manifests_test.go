// Package manifests checks manifests/: that the objects are well formed and
// refer to each other, that a real kube-apiserver accepts them, and that the
// RBAC they grant is enough for CoreDNS with the ConfigMap's Corefile (and
// no more than reading). See manifests/README.md.
package manifests

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

const (
	kubeSystem = "kube-system"
	// The identities the manifests create.
	corednsSA = "coredns"
	peerSA    = "mcsannotations-peer-reader"
	// What the annotator binds per exporting namespace, and the list of
	// those namespaces that peers follow (issue 26).
	peerGrant      = "mcsannotations:peer-reader"
	exportingList  = "mcsannotations-exporting-namespaces"
	exportingKey   = "namespaces"
	managedByLabel = "app.kubernetes.io/managed-by"
)

// peerGrantBinding is the RoleBinding the annotator makes in an exporting
// namespace.
func peerGrantBinding(ns string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: peerGrant, Namespace: ns, Labels: map[string]string{managedByLabel: annotatorSA}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: peerGrant},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: kubeSystem, Name: peerSA}},
	}
}

// manifests renders manifests/<dir> (a kustomization) with kustomize's Go
// API, as `kubectl apply -k` would.
func manifests(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(root, "manifests", dir))
	if err != nil {
		t.Fatalf("kustomize build manifests/%s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatalf("manifests/%s: %s: %v", dir, r.CurId(), err)
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out
}

// coredns holds the typed objects of manifests/coredns.
type coredns struct {
	sa         corev1.ServiceAccount
	role       rbacv1.ClusterRole
	binding    rbacv1.ClusterRoleBinding
	configMap  corev1.ConfigMap
	deployment appsv1.Deployment
}

// typed converts each object (strictly: an unknown field fails) and checks
// that each kind appears once.
func typed(t *testing.T, objs []*unstructured.Unstructured, into map[string]any) {
	t.Helper()
	seen := map[string]int{}
	for _, u := range objs {
		dst, ok := into[u.GetKind()]
		if !ok {
			t.Errorf("%s: unexpected kind", harness.ObjectName(u))
			continue
		}
		seen[u.GetKind()]++
		if err := harness.ToTyped(u, dst); err != nil {
			t.Error(err)
		}
	}
	for kind := range into {
		if seen[kind] != 1 {
			t.Errorf("%d objects of kind %s, want 1", seen[kind], kind)
		}
	}
}

func readCoreDNS(t *testing.T) *coredns {
	t.Helper()
	var c coredns
	typed(t, manifests(t, "coredns"), map[string]any{
		"ServiceAccount": &c.sa, "ClusterRole": &c.role, "ClusterRoleBinding": &c.binding,
		"ConfigMap": &c.configMap, "Deployment": &c.deployment,
	})
	if t.Failed() {
		t.FailNow()
	}
	return &c
}

// readOnly fails the test for any verb but get, list and watch.
func readOnly(t *testing.T, role *rbacv1.ClusterRole) {
	t.Helper()
	for _, r := range role.Rules {
		for _, v := range r.Verbs {
			if v != "get" && v != "list" && v != "watch" {
				t.Errorf("ClusterRole %s grants %q on %v: least privilege is read only", role.Name, v, r.Resources)
			}
		}
		if slices.Contains(r.Resources, "*") || slices.Contains(r.APIGroups, "*") || slices.Contains(r.Resources, "secrets") {
			t.Errorf("ClusterRole %s: rule %+v is too broad", role.Name, r)
		}
	}
}

// TestStatic needs no cluster: the objects convert strictly to their types
// and refer to each other consistently.
func TestStatic(t *testing.T) {
	c := readCoreDNS(t)
	pod := c.deployment.Spec.Template.Spec

	if c.sa.Namespace != kubeSystem || c.configMap.Namespace != kubeSystem || c.deployment.Namespace != kubeSystem {
		t.Errorf("namespaces: ServiceAccount %q, ConfigMap %q, Deployment %q; want %s", c.sa.Namespace, c.configMap.Namespace, c.deployment.Namespace, kubeSystem)
	}
	if pod.ServiceAccountName != c.sa.Name || c.sa.Name != corednsSA {
		t.Errorf("Deployment runs as %q, the ServiceAccount is %q", pod.ServiceAccountName, c.sa.Name)
	}
	if c.binding.RoleRef.Kind != "ClusterRole" || c.binding.RoleRef.Name != c.role.Name {
		t.Errorf("ClusterRoleBinding refers to %s %s, the ClusterRole is %s", c.binding.RoleRef.Kind, c.binding.RoleRef.Name, c.role.Name)
	}
	if len(c.binding.Subjects) != 1 || c.binding.Subjects[0].Kind != "ServiceAccount" ||
		c.binding.Subjects[0].Name != c.sa.Name || c.binding.Subjects[0].Namespace != c.sa.Namespace {
		t.Errorf("ClusterRoleBinding subjects %+v, want the ServiceAccount %s/%s only", c.binding.Subjects, c.sa.Namespace, c.sa.Name)
	}
	readOnly(t, &c.role)
	for _, r := range c.role.Rules {
		if slices.Contains(r.Resources, "pods") && slices.Contains(r.Verbs, "get") {
			t.Errorf("ClusterRole %s grants get on pods: neither plugin reads a single Pod", c.role.Name)
		}
	}

	// The kube-dns Service selects k8s-app: kube-dns.
	if c.deployment.Spec.Template.Labels["k8s-app"] != "kube-dns" || c.deployment.Spec.Selector.MatchLabels["k8s-app"] != "kube-dns" {
		t.Errorf("Deployment labels %v, selector %v: the kube-dns Service selects k8s-app: kube-dns", c.deployment.Spec.Template.Labels, c.deployment.Spec.Selector.MatchLabels)
	}

	corefile := c.configMap.Data["Corefile"]
	for _, want := range []string{
		"mcsannotations clusterset.local cluster.local {", "cluster CLUSTER_ID", "snapshot /var/lib/mcsannotations/table.db",
		"kubernetes cluster.local in-addr.arpa ip6.arpa {", "errors", "health", "ready", "prometheus :9153",
		"forward . /etc/resolv.conf", "cache 30", "loop", "reload", "loadbalance", "bufsize 1232",
	} {
		if !strings.Contains(corefile, want) {
			t.Errorf("the Corefile has no %q:\n%s", want, corefile)
		}
	}

	// Volumes: the ConfigMap holds the Corefile that args name; the snapshot
	// is on a hostPath mounted where the Corefile puts it.
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	ctr := pod.Containers[0]
	// The collector is held under the container's memory limit.
	memLimit := false
	for _, e := range ctr.Env {
		if e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil &&
			e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" {
			memLimit = true
		}
	}
	if !memLimit || ctr.Resources.Limits.Memory().IsZero() {
		t.Errorf("GOMEMLIMIT must come from the container's memory limit: env %+v, limits %v", ctr.Env, ctr.Resources.Limits)
	}
	mounts := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	var cfgVol, snapVol string
	for name, v := range vols {
		if v.ConfigMap != nil && v.ConfigMap.Name == c.configMap.Name {
			cfgVol = name
		}
		if v.HostPath != nil {
			snapVol = name
			if v.HostPath.Path != "/var/lib/mcsannotations" || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
				t.Errorf("hostPath volume %s: %+v, want /var/lib/mcsannotations DirectoryOrCreate", name, v.HostPath)
			}
		}
	}
	if cfgVol == "" || snapVol == "" {
		t.Fatalf("volumes %v: want one from ConfigMap %s and one hostPath", vols, c.configMap.Name)
	}
	if got := strings.Join(ctr.Args, " "); got != "-conf "+filepath.Join(mounts[cfgVol], "Corefile") {
		t.Errorf("args %q do not name the Corefile of the ConfigMap mounted at %q", got, mounts[cfgVol])
	}
	if mounts[snapVol] != "/var/lib/mcsannotations" {
		t.Errorf("the snapshot volume is mounted at %q, the Corefile writes /var/lib/mcsannotations/table.db", mounts[snapVol])
	}
	if pa := pod.Affinity; pa == nil || pa.PodAntiAffinity == nil || len(pa.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) == 0 {
		t.Errorf("no required pod anti-affinity: two replicas on a node would share the snapshot file")
	}
	if !strings.Contains(ctr.Image, "coredns-mcsannotations") {
		t.Errorf("image %q is not the custom build", ctr.Image)
	}
	nonRootCoreDNS(t, &c.deployment, snapVol)

	// The peer reader: Pods list/watch in a ClusterRole that nothing binds
	// cluster-wide (the annotator binds it per exporting namespace), and
	// the list of exporting namespaces by name.
	var p struct {
		sa          corev1.ServiceAccount
		role        rbacv1.ClusterRole
		listRole    rbacv1.Role
		listBinding rbacv1.RoleBinding
		secret      corev1.Secret
	}
	typed(t, manifests(t, "peer"), map[string]any{"ServiceAccount": &p.sa, "ClusterRole": &p.role, "Role": &p.listRole, "RoleBinding": &p.listBinding, "Secret": &p.secret})
	readOnly(t, &p.role)
	if p.role.Name != peerGrant || len(p.role.Rules) != 1 || !slices.Equal(p.role.Rules[0].Resources, []string{"pods"}) ||
		!slices.Equal(p.role.Rules[0].Verbs, []string{"list", "watch"}) {
		t.Errorf("peer ClusterRole %+v: want %s, pods list and watch only", p.role, peerGrant)
	}
	if r := p.listRole; r.Namespace != kubeSystem || len(r.Rules) != 2 || !slices.Equal(r.Rules[0].Resources, []string{"configmaps"}) ||
		!slices.Equal(r.Rules[0].ResourceNames, []string{exportingList}) || !slices.Equal(r.Rules[0].Verbs, []string{"get", "list", "watch"}) ||
		!slices.Equal(r.Rules[1].APIGroups, []string{"coordination.k8s.io"}) || !slices.Equal(r.Rules[1].Resources, []string{"leases"}) ||
		!slices.Equal(r.Rules[1].ResourceNames, []string{"mcs-heartbeat"}) || !slices.Equal(r.Rules[1].Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("peer Role %+v: want configmap %s/%s and lease %s/mcs-heartbeat get, list, watch only", r, kubeSystem, exportingList, kubeSystem)
	}
	if b := p.listBinding; b.Namespace != kubeSystem || b.RoleRef.Kind != "Role" || b.RoleRef.Name != p.listRole.Name ||
		len(b.Subjects) != 1 || b.Subjects[0].Name != p.sa.Name || b.Subjects[0].Namespace != p.sa.Namespace || p.sa.Name != peerSA {
		t.Errorf("peer RoleBinding %+v does not bind %s to %s", b, p.sa.Name, p.listRole.Name)
	}
	if p.secret.Annotations[corev1.ServiceAccountNameKey] != p.sa.Name || p.secret.Type != corev1.SecretTypeServiceAccountToken {
		t.Errorf("peer token Secret: type %s, for %q", p.secret.Type, p.secret.Annotations[corev1.ServiceAccountNameKey])
	}

	// The hub reader: EndpointSlices and, in the hub controller's
	// namespace, Leases; read only, bound to its ServiceAccount.
	var h struct {
		sa           corev1.ServiceAccount
		role         rbacv1.ClusterRole
		roleBinding  rbacv1.ClusterRoleBinding
		leaseRole    rbacv1.Role
		leaseBinding rbacv1.RoleBinding
		secret       corev1.Secret
	}
	typed(t, manifests(t, "hub-reader"), map[string]any{"ServiceAccount": &h.sa, "ClusterRole": &h.role, "ClusterRoleBinding": &h.roleBinding,
		"Role": &h.leaseRole, "RoleBinding": &h.leaseBinding, "Secret": &h.secret})
	readOnly(t, &h.role)
	if r := h.role.Rules; len(r) != 1 || !slices.Equal(r[0].APIGroups, []string{"discovery.k8s.io"}) || !slices.Equal(r[0].Resources, []string{"endpointslices"}) ||
		!slices.Equal(r[0].Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("hub reader ClusterRole %+v: want endpointslices get, list, watch only", h.role)
	}
	if r := h.leaseRole; r.Namespace != kubeSystem || len(r.Rules) != 1 || !slices.Equal(r.Rules[0].Resources, []string{"leases"}) ||
		!slices.Equal(r.Rules[0].Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("hub reader Role %+v: want leases in %s get, list, watch only", r, kubeSystem)
	}
	for what, b := range map[string]struct {
		ref      rbacv1.RoleRef
		subjects []rbacv1.Subject
		want     string
	}{
		"ClusterRoleBinding": {h.roleBinding.RoleRef, h.roleBinding.Subjects, h.role.Name},
		"RoleBinding":        {h.leaseBinding.RoleRef, h.leaseBinding.Subjects, h.leaseRole.Name},
	} {
		if b.ref.Name != b.want || len(b.subjects) != 1 || b.subjects[0].Name != h.sa.Name || b.subjects[0].Namespace != h.sa.Namespace {
			t.Errorf("hub reader %s %+v %+v does not bind %s to %s", what, b.ref, b.subjects, h.sa.Name, b.want)
		}
	}
	if h.secret.Annotations[corev1.ServiceAccountNameKey] != h.sa.Name || h.secret.Type != corev1.SecretTypeServiceAccountToken {
		t.Errorf("hub reader token Secret: type %s, for %q", h.secret.Type, h.secret.Annotations[corev1.ServiceAccountNameKey])
	}
}

// waitNamespace waits until the API server has made a system namespace.
func waitNamespace(t *testing.T, c *harness.Cluster, name string) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, func() error {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.Client.CoreV1().Namespaces().Get(cx, name, metav1.GetOptions{})
		return err
	})
}

// fieldManager is kubectl's, as `kubectl apply --server-side` names it.
const fieldManager = "kubectl"

// apply applies objects with server-side apply, as `kubectl apply
// --server-side -k` does: a dry run of all of them first, then for real, and
// checks the server stored each one.
func apply(t *testing.T, c *harness.Cluster, objs []*unstructured.Unstructured) {
	t.Helper()
	if _, err := serverSideApply(c, objs, true); err != nil {
		t.Fatalf("cluster %s: dry run: %v", c.Name, err)
	}
	got, err := serverSideApply(c, objs, false)
	if err != nil {
		t.Fatalf("cluster %s: %v", c.Name, err)
	}
	for i, u := range got {
		if u.GetUID() == "" || u.GetName() != objs[i].GetName() {
			t.Errorf("cluster %s: %s stored as %s (uid %q)", c.Name, harness.ObjectName(objs[i]), harness.ObjectName(u), u.GetUID())
		}
	}
}

// serverSideApply applies each object in order as admin (strict field
// validation: an unknown field fails), finding its resource through
// discovery, and returns what the server stored (or would store).
func serverSideApply(c *harness.Cluster, objs []*unstructured.Unstructured, dryRun bool) ([]*unstructured.Unstructured, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var out []*unstructured.Unstructured
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return out, fmt.Errorf("%s (%s): %w", harness.ObjectName(u), gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		got, err := ri.Apply(cx, u.GetName(), u, opts)
		cancel()
		if err != nil {
			return out, fmt.Errorf("apply %s: %w", harness.ObjectName(u), err)
		}
		out = append(out, got)
	}
	return out, nil
}

// TestManifests applies manifests/coredns to cluster edge-a and
// manifests/peer to edge-b, then runs bin/coredns with the ConfigMap's
// Corefile as edge-a's coredns ServiceAccount, watching edge-b as its peer
// reader (both through impersonation: the API server authorizes each
// request as that account, as with its own token; nothing here issues
// tokens). It must become ready (every informer of mcsannotations and of
// the kubernetes plugin synced), answer from both plugins and both
// clusters, and never be forbidden; and the accounts may do nothing but read.
func TestManifests(t *testing.T) {
	harness.RequireTools(t)
	cs := harness.StartClusters(t, "edge-a", "edge-b")
	a, b := cs[0], cs[1]
	for _, c := range cs {
		waitNamespace(t, c, kubeSystem)
	}
	// What kubectl apply --server-side -k manifests/overlays/<cluster> does,
	// twice: the second apply changes nothing and conflicts with nothing.
	overlayA, overlayB := manifests(t, "overlays/edge-a"), manifests(t, "overlays/edge-b")
	apply(t, a, overlayA)
	apply(t, b, overlayB)
	apply(t, a, overlayA)
	keys := newClusterKeys(t, a.Name, b.Name)

	// Workloads: local exporters and a Service in edge-a, a peer exporter in
	// edge-b, each export signed with its cluster's key; one unsigned.
	const ns = "shop"
	a.CreateNamespace(t, ns)
	b.CreateNamespace(t, ns)
	httpPort := []harness.ExportPort{{Name: "http", Port: 80, TargetPort: 8080}}
	pods := []harness.ReadyPod{{Pod: harness.ExporterPod("backend-0", "backend-0",
		harness.ExportService{Name: "backend", Ports: httpPort}), IPs: []string{"10.1.0.10"}},
		{Pod: harness.ExporterPod("rogue-0", "rogue-0", harness.ExportService{Name: "rogue", Ports: httpPort}), IPs: []string{"10.1.0.11"}}}
	// big: more endpoints than 1232 bytes hold (bufsize below).
	const bigPods = 40
	for i := range bigPods {
		name := fmt.Sprintf("big-%d", i)
		pods = append(pods, harness.ReadyPod{Pod: harness.ExporterPod(name, name, harness.ExportService{Name: "big", Ports: httpPort}),
			IPs: []string{fmt.Sprintf("10.1.1.%d", i+1)}})
	}
	a.CreateReadyPods(t, ns, pods...)
	for _, p := range pods {
		if p.Name != "rogue-0" {
			keys.sign(t, a, ns, p.Name)
		}
	}
	b.CreateReadyPods(t, ns, harness.ReadyPod{Pod: harness.ExporterPod("db-0", "db-0",
		harness.ExportService{Name: "db", Ports: []harness.ExportPort{{Name: "postgres", Port: 5432}}}), IPs: []string{"10.2.0.20"}})
	keys.sign(t, b, ns, "db-0")
	cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	web, err := a.Client.CoreV1().Services(ns).Create(cx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// edge-b's annotator would grant the peer reader shop (it exports) and
	// publish the list; here its identity writes what it would (the
	// annotator's own tests check that it does), which also checks that its
	// RBAC and admission policy allow it.
	annotatorB := harness.NewClient(t, b.KubeconfigAs(t, harness.ServiceAccountUser(kubeSystem, annotatorSA), harness.ServiceAccountGroups(kubeSystem)...), 0)
	harness.Eventually(t, 20*time.Second, func() error { // the policy and RBAC just applied
		_, err := annotatorB.RbacV1().RoleBindings(ns).Create(cx, peerGrantBinding(ns), metav1.CreateOptions{})
		return err
	})
	if _, err := annotatorB.CoreV1().ConfigMaps(kubeSystem).Create(cx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: exportingList, Namespace: kubeSystem, Labels: map[string]string{managedByLabel: annotatorSA}},
		Data:       map[string]string{exportingKey: ns + "\n"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	saKubeconfig := a.KubeconfigAs(t, harness.ServiceAccountUser(kubeSystem, corednsSA), harness.ServiceAccountGroups(kubeSystem)...)
	peerKubeconfig := b.KubeconfigAs(t, harness.ServiceAccountUser(kubeSystem, peerSA), harness.ServiceAccountGroups(kubeSystem)...)

	// edge-a's CoreDNS with the overlay's Corefile (cluster edge-a, peer
	// edge-b, verify), as the coredns ServiceAccount.
	t.Run("CoreDNSAsServiceAccount", func(t *testing.T) {
		corefile := find(t, overlayA, "ConfigMap", "coredns").Object["data"].(map[string]any)["Corefile"].(string)
		ready := harness.FreePort(t)
		resolv := filepath.Join(t.TempDir(), "resolv.conf")
		if err := os.WriteFile(resolv, []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		tmpl := loopbackCorefile(t, corefile,
			rule{`(?m)^(\s*)peer edge-b /etc/mcs/peers/edge-b\.kubeconfig$`, "${1}peer edge-b {PEER_KUBECONFIG}"},
			rule{`(?m)^(\s*)verify /etc/mcs/keys$`, "${1}verify {KEYS}"})
		d := harness.StartCoreDNS(t, tmpl, map[string]string{
			"KUBECONFIG":      saKubeconfig,
			"PEER_KUBECONFIG": peerKubeconfig,
			"KEYS":            keys.dir,
			"HEALTH":          fmt.Sprint(harness.FreePort(t)),
			"READY":           fmt.Sprint(ready),
			"METRICS":         fmt.Sprint(harness.FreePort(t)),
			"RESOLV":          resolv,
		})
		// Ready: both plugins' informers have listed what they need. Queries
		// wait for it, so that no early NXDOMAIN lands in the cache.
		took := harness.Eventually(t, 30*time.Second, func() error {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/ready", ready))
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("/ready: %s; CoreDNS log:\n%s", resp.Status, d.LogTail(20))
			}
			return nil
		})
		t.Logf("CoreDNS ready %s after it answered", took.Round(time.Millisecond))

		for _, q := range []struct {
			name string
			want string
		}{
			{"backend." + ns + ".svc.clusterset.local.", "10.1.0.10"}, // mcsannotations, edge-a
			{"db." + ns + ".svc.clusterset.local.", "10.2.0.20"},      // mcsannotations, peer edge-b
			{"web." + ns + ".svc.cluster.local.", web.Spec.ClusterIP}, // the kubernetes plugin
		} {
			m := d.Query(t, q.name, dns.TypeA, false)
			if got := harness.Addrs(m); len(got) != 1 || got[0] != q.want {
				t.Errorf("%s A: %s %v, want %s", q.name, harness.Rcode(m), got, q.want)
			}
		}
		// verify: an unsigned export is not answered.
		if m := d.Query(t, "rogue."+ns+".svc.clusterset.local.", dns.TypeA, false); m.Rcode != dns.RcodeNameError {
			t.Errorf("unsigned rogue: %s %v, want NXDOMAIN (verify)", harness.Rcode(m), harness.Addrs(m))
		}

		// bufsize 1232: a client offering 65535 bytes over UDP gets at most
		// 1232 and TC; over TCP the whole answer.
		big := "_http._tcp.big." + ns + ".svc.clusterset.local."
		harness.Eventually(t, 10*time.Second, func() error {
			m, err := harness.Exchange(d.Addr(), harness.Query{Name: big, Type: dns.TypeSRV, TCP: true})
			if err != nil || len(m.Answer) != bigPods {
				return fmt.Errorf("%s SRV over TCP: %d answers (%v), want %d", big, len(m.Answer), err, bigPods)
			}
			return nil
		})
		m, wire, err := harness.ExchangeWire(d.Addr(), harness.Query{Name: big, Type: dns.TypeSRV, UDPSize: 65535})
		if err != nil {
			t.Fatal(err)
		}
		if len(wire) > 1232 || !m.Truncated {
			t.Errorf("%s SRV over UDP with EDNS 65535: %d bytes, TC %v; want at most 1232 and TC", big, len(wire), m.Truncated)
		}
		if log := d.Log(); strings.Contains(strings.ToLower(log), "forbidden") {
			t.Errorf("a request was forbidden; CoreDNS log:\n%s", log)
		}
	})

	t.Run("LeastPrivilege", func(t *testing.T) {
		cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		sa := harness.NewClient(t, saKubeconfig, 0)
		peer := harness.NewClient(t, peerKubeconfig, 0)
		allowed, forbidden := verdicts(t)
		_, err := sa.CoreV1().Pods("").List(cx, metav1.ListOptions{Limit: 1})
		allowed("coredns: list pods", err)
		_, err = sa.CoreV1().Pods(ns).Get(cx, "backend-0", metav1.GetOptions{})
		forbidden("coredns: get a pod (list/watch suffice)", err)
		_, err = sa.CoreV1().Services("").List(cx, metav1.ListOptions{})
		allowed("coredns: list services", err)
		_, err = sa.CoreV1().Secrets(kubeSystem).List(cx, metav1.ListOptions{})
		forbidden("coredns: list secrets", err)
		_, err = sa.CoreV1().ConfigMaps(kubeSystem).List(cx, metav1.ListOptions{})
		forbidden("coredns: list configmaps", err)
		_, err = sa.CoreV1().Pods(ns).Patch(cx, "backend-0", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
		forbidden("coredns: patch a pod", err)
		err = sa.CoreV1().Pods(ns).Delete(cx, "backend-0", metav1.DeleteOptions{})
		forbidden("coredns: delete a pod", err)
		_, err = sa.CoreV1().Services(ns).Get(cx, "web", metav1.GetOptions{})
		forbidden("coredns: get a service (list/watch suffice)", err)

		_, err = peer.CoreV1().Pods(ns).List(cx, metav1.ListOptions{LabelSelector: harness.ExporterLabel + "=true"})
		allowed("peer reader: list exporter pods of an exporting namespace", err)
		_, err = peer.CoreV1().Pods("").List(cx, metav1.ListOptions{LabelSelector: harness.ExporterLabel + "=true"})
		forbidden("peer reader: list pods of every namespace", err)
		_, err = peer.CoreV1().Pods(kubeSystem).List(cx, metav1.ListOptions{})
		forbidden("peer reader: list kube-system's pods", err)
		_, err = peer.CoreV1().Pods(ns).Get(cx, "db-0", metav1.GetOptions{})
		forbidden("peer reader: get a pod (list/watch suffice)", err)
		_, err = peer.CoreV1().ConfigMaps(kubeSystem).Get(cx, exportingList, metav1.GetOptions{})
		allowed("peer reader: get the list of exporting namespaces", err)
		_, err = peer.CoreV1().ConfigMaps(kubeSystem).List(cx, metav1.ListOptions{FieldSelector: "metadata.name=" + exportingList})
		allowed("peer reader: list the list of exporting namespaces by name", err)
		_, err = peer.CoreV1().ConfigMaps(kubeSystem).List(cx, metav1.ListOptions{})
		forbidden("peer reader: list kube-system's configmaps", err)
		_, err = peer.CoordinationV1().Leases(kubeSystem).List(cx, metav1.ListOptions{FieldSelector: "metadata.name=mcs-heartbeat"})
		allowed("peer reader: list the heartbeat Lease by name", err)
		_, err = peer.CoordinationV1().Leases(kubeSystem).List(cx, metav1.ListOptions{})
		forbidden("peer reader: list kube-system's leases", err)
		_, err = peer.CoreV1().Services("").List(cx, metav1.ListOptions{})
		forbidden("peer reader: list services", err)
		_, err = peer.CoreV1().Secrets(kubeSystem).Get(cx, "mcsannotations-peer-reader-token", metav1.GetOptions{})
		forbidden("peer reader: read its own token Secret", err)
		_, err = peer.CoreV1().Pods(ns).Create(cx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}}}, metav1.CreateOptions{})
		forbidden("peer reader: create a pod", err)
	})
}

// TestPlaceholderClusterID: the ConfigMap as shipped (CLUSTER_ID not
// replaced) stops CoreDNS at start-up with a message that names the word.
func TestPlaceholderClusterID(t *testing.T) {
	tools := harness.RequireTools(t, harness.ToolCoreDNS)
	c := readCoreDNS(t)
	dir := t.TempDir()
	r := strings.NewReplacer("{PORT}", fmt.Sprint(harness.FreePort(t)), "{HEALTH}", fmt.Sprint(harness.FreePort(t)),
		"{READY}", fmt.Sprint(harness.FreePort(t)), "{METRICS}", fmt.Sprint(harness.FreePort(t)),
		"{DIR}", dir, "{KUBECONFIG}", filepath.Join(dir, "none"), "{RESOLV}", "/etc/resolv.conf")
	path := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(path, []byte(r.Replace(loopbackCorefile(t, c.configMap.Data["Corefile"]))), 0o644); err != nil {
		t.Fatal(err)
	}
	cx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cx, tools.CoreDNS, "-conf", path).CombinedOutput()
	if err == nil || cx.Err() != nil || !strings.Contains(string(out), `"CLUSTER_ID"`) {
		t.Errorf("CoreDNS with cluster CLUSTER_ID: err %v (context %v), want an exit naming CLUSTER_ID; output:\n%s", err, cx.Err(), out)
	}
}

// loopbackCorefile rewrites the ConfigMap's Corefile for a test on
// 127.0.0.1: harness placeholders for ports and paths, a kubeconfig for
// both plugins (and the peer line uncommented when peer is true), no loop
// plugin (it needs a real upstream). Each rewrite must match exactly once,
// so that a change to the ConfigMap shows here instead of being missed.
// rule is one rewrite of loopbackCorefile: a regular expression and its
// replacement.
type rule struct{ re, repl string }

// loopbackCorefile rewrites a shipped Corefile for a test on 127.0.0.1:
// harness placeholders for ports and paths, a kubeconfig for both plugins,
// no loop plugin (it needs a real upstream), then the extra rules. Each
// rewrite must match exactly once, so that a change to the Corefile shows
// here instead of being missed.
func loopbackCorefile(t *testing.T, corefile string, extra ...rule) string {
	t.Helper()
	rules := append([]rule{
		{`(?m)^\.:53 \{$`, ".:{PORT} {\n    bind 127.0.0.1"},
		{`(?m)^(\s*)health \{$`, "${1}health 127.0.0.1:{HEALTH} {"},
		{`(?m)^(\s*)ready$`, "${1}ready 127.0.0.1:{READY}"},
		{`(?m)^(\s*)prometheus :9153$`, "${1}prometheus 127.0.0.1:{METRICS}"},
		{`(?m)^(\s*)snapshot /var/lib/mcsannotations/table\.db$`, "${1}snapshot {DIR}/table.db"},
		{`(?m)^(\s*)(mcsannotations clusterset\.local cluster\.local \{)$`, "${1}${2}\n${1}    kubeconfig {KUBECONFIG}"},
		{`(?m)^(\s*)(kubernetes cluster\.local in-addr\.arpa ip6\.arpa \{)$`, "${1}${2}\n${1}    kubeconfig {KUBECONFIG}"},
		{`(?m)^(\s*)forward \. /etc/resolv\.conf \{$`, "${1}forward . {RESOLV} {"},
		{`(?m)^\s*loop\n`, ""},
	}, extra...)
	for _, r := range rules {
		re := regexp.MustCompile(r.re)
		if n := len(re.FindAllStringIndex(corefile, -1)); n != 1 {
			t.Fatalf("the Corefile matches %s %d times, want once: update loopbackCorefile\n%s", r.re, n, corefile)
		}
		corefile = re.ReplaceAllString(corefile, r.repl)
	}
	return corefile
}

// verdicts returns checks of a request's error made as a restricted
// identity: allowed wants none, forbidden wants Forbidden.
func verdicts(t *testing.T) (allowed, forbidden func(what string, err error)) {
	allowed = func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v, want allowed", what, err)
		}
	}
	forbidden = func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", what, err)
		}
	}
	return allowed, forbidden
}
