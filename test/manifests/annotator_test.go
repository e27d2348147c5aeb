package manifests

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// The annotator's identity and contract (docs/DESIGN.md#the-annotator),
// written out here, not imported from the annotator, so that the manifests are
// checked against the contract.
const (
	annotatorSA        = "mcs-annotator"
	annotatorLease     = "mcs-annotator" // --lease-name's default
	annotatorBinary    = "/mcs-annotator"
	serviceExportGroup = "multicluster.x-k8s.io"
	// exportServiceAnnotation marks a Service as exported without a ServiceExport.
	exportServiceAnnotation = "multicluster.kubernetes.io/export"
	// clusterPlaceholder is the word coredns/configmap.yaml and
	// annotator/deployment.yaml hold where the cluster's ID goes.
	clusterPlaceholder = "CLUSTER_ID"
)

var serviceExports = schema.GroupVersionResource{Group: serviceExportGroup, Version: "v1beta1", Resource: "serviceexports"}

// grant is one (API group, resource, verb) an RBAC rule allows.
type grant struct{ group, resource, verb string }

func (g grant) String() string {
	if g.group == "" {
		return g.verb + " " + g.resource
	}
	return g.verb + " " + g.resource + "." + g.group
}

// annotatorClusterGrants is exactly what the contract lists cluster-wide:
// the annotator's, and the MCS controller's (--mcs-controller, the same
// identity): its derived Services, EndpointSlices and ServiceImports applied
// (an apply that creates needs create and patch) and deleted, namespaces read.
var annotatorClusterGrants = grants(
	rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch"}},
	rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch", "create", "patch", "delete"}},
	rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}},
	rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch", "create", "patch", "delete"}},
	rbacv1.PolicyRule{APIGroups: []string{serviceExportGroup}, Resources: []string{"serviceexports"}, Verbs: []string{"get", "list", "watch"}},
	rbacv1.PolicyRule{APIGroups: []string{serviceExportGroup}, Resources: []string{"serviceexports/status"}, Verbs: []string{"patch"}},
	// The peer grants (issue 26): RoleBindings of the peer reader, and
	// bind on its one ClusterRole.
	rbacv1.PolicyRule{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"rolebindings"}, Verbs: []string{"list", "create", "delete"}},
	rbacv1.PolicyRule{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterroles"}, Verbs: []string{"bind"}},
	rbacv1.PolicyRule{APIGroups: []string{serviceExportGroup}, Resources: []string{"serviceimports"}, Verbs: []string{"list", "watch", "create", "patch", "delete"}},
	rbacv1.PolicyRule{APIGroups: []string{serviceExportGroup}, Resources: []string{"serviceimports/status"}, Verbs: []string{"patch"}},
	// The controller's Events on ServiceExports and ServiceImports.
	rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
)

// annotatorLeaseGrants is what the contract lists in its own namespace.
var annotatorLeaseGrants = grants(
	rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
	// A relay hub's Leases, one per cluster it reads (--relay: server-side
	// apply; the admission policy limits them to their names).
	rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"patch"}},
	// A relay hub deletes the Leases of clusters it no longer reads, found
	// by a list at its start (the admission policy limits the deletes to
	// its own Leases).
	rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"list", "delete"}},
	// A relay hub reads its own cluster's heartbeat (the Lease mcs-heartbeat
	// only: TestAnnotatorStatic checks the name).
	rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"list", "watch"}},
	// The list of exporting namespaces (server-side apply).
	rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "patch"}},
)

// grants expands rules into the set of (group, resource, verb) they allow.
func grants(rules ...rbacv1.PolicyRule) map[grant]bool {
	out := map[grant]bool{}
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out[grant{g, res, v}] = true
				}
			}
		}
	}
	return out
}

// exactGrants fails the test unless the rules allow exactly want: nothing
// more (no wildcard, no secrets, no non-resource URL), nothing less.
func exactGrants(t *testing.T, what string, rules []rbacv1.PolicyRule, want map[grant]bool) {
	t.Helper()
	for _, r := range rules {
		if slices.Contains(r.APIGroups, "*") || slices.Contains(r.Resources, "*") || slices.Contains(r.Verbs, "*") ||
			slices.Contains(r.Resources, "secrets") || len(r.NonResourceURLs) > 0 {
			t.Errorf("%s: rule %+v is too broad", what, r)
		}
		for _, v := range r.Verbs {
			switch {
			case v == "update" && !slices.Contains(r.Resources, "leases") && !slices.Equal(r.ResourceNames, []string{exportingList}):
				t.Errorf("%s: update on %v: the annotator updates its Lease and the list of exporting namespaces only (every other write is an apply: a patch)", what, r.Resources)
			case v == "bind" && !slices.Equal(r.ResourceNames, []string{peerGrant}):
				t.Errorf("%s: bind on %v: the annotator binds the peer reader's ClusterRole %s only", what, r.ResourceNames, peerGrant)
			case (v == "create" || v == "delete" || v == "deletecollection" || v == "update") && slices.Contains(r.Resources, "pods"):
				t.Errorf("%s: %s on pods: the annotator only patches Pods' metadata", what, v)
			}
		}
	}
	got := grants(rules...)
	for g := range got {
		if !want[g] {
			t.Errorf("%s grants %s: not in the annotator's contract", what, g)
		}
	}
	for g := range want {
		if !got[g] {
			t.Errorf("%s does not grant %s, which the annotator's contract needs", what, g)
		}
	}
}

// annotator holds the typed objects of manifests/annotator.
type annotator struct {
	sa             corev1.ServiceAccount
	role           rbacv1.ClusterRole
	binding        rbacv1.ClusterRoleBinding
	leaseRole      rbacv1.Role
	leaseBinding   rbacv1.RoleBinding
	policy         admissionv1.ValidatingAdmissionPolicy
	policyBinding  admissionv1.ValidatingAdmissionPolicyBinding
	deployment     appsv1.Deployment
	objs           []*unstructured.Unstructured
	rbacObjs       []*unstructured.Unstructured // all but the Deployment
	deploymentObjs []*unstructured.Unstructured
}

func readAnnotator(t *testing.T) *annotator {
	t.Helper()
	var a annotator
	a.objs = manifests(t, "annotator")
	typed(t, a.objs, map[string]any{
		"ServiceAccount": &a.sa, "ClusterRole": &a.role, "ClusterRoleBinding": &a.binding,
		"Role": &a.leaseRole, "RoleBinding": &a.leaseBinding, "Deployment": &a.deployment,
		"ValidatingAdmissionPolicy": &a.policy, "ValidatingAdmissionPolicyBinding": &a.policyBinding,
	})
	if t.Failed() {
		t.FailNow()
	}
	for _, u := range a.objs {
		if u.GetKind() == "Deployment" {
			a.deploymentObjs = append(a.deploymentObjs, u)
		} else {
			a.rbacObjs = append(a.rbacObjs, u)
		}
	}
	return &a
}

// flags reads "--name=value" and "--name value" arguments; a repeated flag
// is an error (the last would win silently).
func flags(t *testing.T, args []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			t.Errorf("argument %q is not a flag", a)
			continue
		}
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			value = args[i+1]
			i++
		}
		if _, dup := out[name]; dup {
			t.Errorf("flag --%s given twice", name)
		}
		out[name] = value
	}
	return out
}

// probePort resolves a probe's port against the container's ports.
func probePort(ctr *corev1.Container, p *corev1.Probe) int32 {
	if p == nil || p.HTTPGet == nil {
		return 0
	}
	if p.HTTPGet.Port.Type == intstr.Int {
		return p.HTTPGet.Port.IntVal
	}
	for _, cp := range ctr.Ports {
		if cp.Name == p.HTTPGet.Port.StrVal {
			return cp.ContainerPort
		}
	}
	return 0
}

// TestAnnotatorStatic needs no cluster: manifests/annotator's objects convert
// strictly to their types, refer to each other, grant exactly the
// annotator's contract, and run it as that identity with probes on its
// --listen port.
func TestAnnotatorStatic(t *testing.T) {
	a := readAnnotator(t)

	// Names and namespaces.
	for what, ns := range map[string]string{"ServiceAccount": a.sa.Namespace, "Role": a.leaseRole.Namespace,
		"RoleBinding": a.leaseBinding.Namespace, "Deployment": a.deployment.Namespace} {
		if ns != kubeSystem {
			t.Errorf("%s in namespace %q, want %s", what, ns, kubeSystem)
		}
	}
	if a.sa.Name != annotatorSA {
		t.Errorf("ServiceAccount %q, want %s", a.sa.Name, annotatorSA)
	}
	bindsSA := func(what string, subjects []rbacv1.Subject) {
		if len(subjects) != 1 || subjects[0].Kind != "ServiceAccount" || subjects[0].Name != a.sa.Name || subjects[0].Namespace != a.sa.Namespace {
			t.Errorf("%s subjects %+v, want the ServiceAccount %s/%s only", what, subjects, a.sa.Namespace, a.sa.Name)
		}
	}
	if r := a.binding.RoleRef; r.APIGroup != rbacv1.GroupName || r.Kind != "ClusterRole" || r.Name != a.role.Name {
		t.Errorf("ClusterRoleBinding refers to %+v, the ClusterRole is %s", r, a.role.Name)
	}
	bindsSA("ClusterRoleBinding", a.binding.Subjects)
	if r := a.leaseBinding.RoleRef; r.APIGroup != rbacv1.GroupName || r.Kind != "Role" || r.Name != a.leaseRole.Name {
		t.Errorf("RoleBinding refers to %+v, the Role is %s", r, a.leaseRole.Name)
	}
	bindsSA("RoleBinding", a.leaseBinding.Subjects)

	// The admission policy: bound (Deny), matching the annotator's identity
	// only, failing closed, naming exactly the keys the annotator writes
	// and its Lease.
	if b := a.policyBinding.Spec; b.PolicyName != a.policy.Name || !slices.Equal(b.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) || b.ParamRef != nil {
		t.Errorf("ValidatingAdmissionPolicyBinding %+v: want policy %s, Deny", b, a.policy.Name)
	}
	if fp := a.policy.Spec.FailurePolicy; fp == nil || *fp != admissionv1.Fail {
		t.Errorf("failurePolicy %v, want Fail", fp)
	}
	user := harness.ServiceAccountUser(a.sa.Namespace, a.sa.Name)
	if mc := a.policy.Spec.MatchConditions; len(mc) != 1 || mc[0].Expression != "request.userInfo.username == '"+user+"'" {
		t.Errorf("matchConditions %+v: want the annotator's user %s only", mc, user)
	}
	vars := map[string]string{}
	for _, v := range a.policy.Spec.Variables {
		vars[v.Name] = v.Expression
	}
	if want := fmt.Sprintf("[%q, %q]", harness.ExporterLabel, "multicluster.kubernetes.io/importer"); strings.ReplaceAll(vars["ownLabels"], "'", `"`) != want {
		t.Errorf("ownLabels %s, want %s", vars["ownLabels"], want)
	}
	if want := fmt.Sprintf("[%q, %q, %q, %q]", harness.ExportAnnotation, "multicluster.kubernetes.io/export-signature",
		annotation.EndpointAnnotation, annotation.EndpointSignatureAnnotation); strings.ReplaceAll(vars["ownAnnotations"], "'", `"`) != want {
		t.Errorf("ownAnnotations %s, want %s", vars["ownAnnotations"], want)
	}
	leaseRule := false
	for _, v := range a.policy.Spec.Validations {
		leaseRule = leaseRule || strings.Contains(v.Expression, "object.metadata.name == '"+annotatorLease+"'")
	}
	if !leaseRule {
		t.Errorf("no validation limits Lease creates to %s", annotatorLease)
	}

	// Least privilege: exactly the contract.
	exactGrants(t, "ClusterRole "+a.role.Name, a.role.Rules, annotatorClusterGrants)
	exactGrants(t, "Role "+a.leaseRole.Name, a.leaseRole.Rules, annotatorLeaseGrants)
	for _, r := range a.leaseRole.Rules {
		if slices.Contains(r.Verbs, "watch") && !slices.Equal(r.ResourceNames, []string{"mcs-heartbeat"}) {
			t.Errorf("Role rule %+v watches Leases other than mcs-heartbeat", r)
		}
		if slices.Contains(r.Verbs, "get") && len(r.ResourceNames) == 0 {
			t.Errorf("Role rule %+v gets any Lease", r)
		}
	}
	for _, r := range a.role.Rules {
		if len(r.ResourceNames) > 0 && !slices.Equal(r.Verbs, []string{"bind"}) {
			t.Errorf("ClusterRole rule %+v is limited to names: the annotator watches all of them", r)
		}
	}

	// The Deployment runs the annotator as that identity.
	d := a.deployment
	pod := d.Spec.Template.Spec
	if pod.ServiceAccountName != a.sa.Name {
		t.Errorf("Deployment runs as %q, the ServiceAccount is %q", pod.ServiceAccountName, a.sa.Name)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2 (leader election: one writes, one stands by)", d.Spec.Replicas)
	}
	if d.Spec.Selector == nil || len(d.Spec.Selector.MatchLabels) == 0 {
		t.Fatalf("Deployment has no selector")
	}
	for k, v := range d.Spec.Selector.MatchLabels {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("selector %v does not select the template's labels %v", d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
		}
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	ctr := pod.Containers[0]
	if !slices.Equal(ctr.Command, []string{annotatorBinary}) {
		t.Errorf("command %q, want [%s]", ctr.Command, annotatorBinary)
	}
	if !strings.Contains(ctr.Image, "mcs-annotator") {
		t.Errorf("image %q is not the annotator's", ctr.Image)
	}
	f := flags(t, ctr.Args)
	for name := range f {
		if !slices.Contains([]string{"cluster", "lease-namespace", "lease-name", "listen", "leader-elect", "id", "workers",
			"lease-duration", "renew-deadline", "retry-period", "serviceexport-poll", "mcs-controller", "peer-expire", "snapshot-dir"}, name) {
			t.Errorf("flag --%s is not the annotator's (or needs a file the base does not mount)", name)
		}
	}
	if v, ok := f["mcs-controller"]; !ok || (v != "" && v != "true") {
		t.Errorf("--mcs-controller %q (given: %v): the base runs the MCS controller", v, ok)
	}

	// The cluster ID: the same placeholder as the Corefile's.
	c := readCoreDNS(t)
	if !strings.Contains(c.configMap.Data["Corefile"], "cluster "+clusterPlaceholder+"\n") || f["cluster"] != clusterPlaceholder {
		t.Errorf("--cluster %q: want the placeholder %s, as coredns/configmap.yaml has", f["cluster"], clusterPlaceholder)
	}

	// The Lease: in the Pod's namespace (the downward API), the namespace
	// of the Role; the Role's names, if any, cover the Lease.
	env := map[string]corev1.EnvVar{}
	for _, e := range ctr.Env {
		env[e.Name] = e
	}
	if f["lease-namespace"] != "$(POD_NAMESPACE)" {
		t.Errorf("--lease-namespace %q, want $(POD_NAMESPACE)", f["lease-namespace"])
	}
	if e := env["POD_NAMESPACE"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("env POD_NAMESPACE %+v: want the downward API's metadata.namespace", e)
	}
	if d.Namespace != a.leaseRole.Namespace {
		t.Errorf("the Pods run in %q (their Lease's namespace), the Role is in %q", d.Namespace, a.leaseRole.Namespace)
	}
	lease := annotatorLease
	if n, ok := f["lease-name"]; ok {
		lease = n
	}
	for _, r := range a.leaseRole.Rules {
		if len(r.ResourceNames) == 0 {
			continue
		}
		// The election's rule (get and update); the heartbeat's (read only)
		// names another Lease.
		if slices.Contains(r.Resources, "leases") && slices.Contains(r.Verbs, "update") && !slices.Contains(r.ResourceNames, lease) {
			t.Errorf("Role rule %+v: names %v do not cover the Lease %q", r, r.ResourceNames, lease)
		}
		if slices.Contains(r.Verbs, "create") {
			t.Errorf("Role rule %+v: create limited by name never matches (a create has no name to authorize)", r)
		}
	}
	if e := env["GOMEMLIMIT"]; e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil ||
		e.ValueFrom.ResourceFieldRef.Resource != "limits.memory" || ctr.Resources.Limits.Memory().IsZero() {
		t.Errorf("GOMEMLIMIT must come from the container's memory limit: env %+v, limits %v", e, ctr.Resources.Limits)
	}

	// Probes on the --listen port, which the container declares.
	_, port, ok := strings.Cut(f["listen"], ":")
	if !ok || port == "" {
		t.Fatalf("--listen %q: want an address with a port", f["listen"])
	}
	declared := false
	for _, cp := range ctr.Ports {
		declared = declared || fmt.Sprint(cp.ContainerPort) == port
	}
	if !declared {
		t.Errorf("the container does not declare the --listen port %s: %+v", port, ctr.Ports)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", ctr.LivenessProbe, "/healthz"}, {"readiness", ctr.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", p.name)
			continue
		}
		if got := probePort(&ctr, p.probe); fmt.Sprint(got) != port || p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s probe on port %d path %q, want %s on the --listen port %s", p.name, got, p.probe.HTTPGet.Path, p.path, port)
		}
	}

	// Hardening: non-root, no privilege escalation, no capability, a
	// read-only root file system.
	sc := ctr.SecurityContext
	nonRoot := func(s *bool) bool { return s != nil && *s }
	if sc == nil || !(nonRoot(sc.RunAsNonRoot) || (pod.SecurityContext != nil && nonRoot(pod.SecurityContext.RunAsNonRoot))) {
		t.Errorf("the container may run as root")
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 || (sc.Privileged != nil && *sc.Privileged) {
		t.Errorf("container securityContext %+v: want no privilege escalation, every capability dropped, a read-only root file system", sc)
	}
	if pod.HostNetwork {
		t.Errorf("hostNetwork: the annotator does not need it")
	}
	annotatorSnapshot(t, &pod, f["snapshot-dir"])
}

// annotatorSnapshot: the MCS controller's --snapshot-dir is a hostPath
// folder of its own (not CoreDNS's), as CoreDNS's snapshot is given: the only
// volume, mounted where the flag says, one replica per node (required
// anti-affinity: bbolt lets one process open the file), and an init step
// that gives the folder to the annotator's user.
func annotatorSnapshot(t *testing.T, pod *corev1.PodSpec, dir string) {
	t.Helper()
	if dir == "" || dir == "/var/lib/mcsannotations" {
		t.Fatalf("--snapshot-dir %q: want a folder of its own (CoreDNS's is /var/lib/mcsannotations)", dir)
	}
	if len(pod.Volumes) != 1 || pod.Volumes[0].HostPath == nil || pod.Volumes[0].HostPath.Path != dir ||
		pod.Volumes[0].HostPath.Type == nil || *pod.Volumes[0].HostPath.Type != corev1.HostPathDirectoryOrCreate {
		t.Fatalf("volumes %+v: want one hostPath %s, DirectoryOrCreate", pod.Volumes, dir)
	}
	vol := pod.Volumes[0].Name
	mounted := func(ms []corev1.VolumeMount) bool {
		return len(ms) == 1 && ms[0].Name == vol && ms[0].MountPath == dir && !ms[0].ReadOnly
	}
	if !mounted(pod.Containers[0].VolumeMounts) {
		t.Errorf("the annotator's mounts %+v: want the snapshot volume at %s, writable", pod.Containers[0].VolumeMounts, dir)
	}
	a := pod.Affinity
	if a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
		a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("no required pod anti-affinity by node: two replicas on a node would share the snapshot file")
	}
	if len(pod.InitContainers) != 1 {
		t.Fatalf("%d init containers, want 1 (the snapshot folder's owner)", len(pod.InitContainers))
	}
	ic := pod.InitContainers[0]
	if want := []string{"/mcs-snapshot-dir", "-owner", "65532:65532", dir}; !slices.Equal(ic.Command, want) || !mounted(ic.VolumeMounts) {
		t.Errorf("init container %v with mounts %+v: want %v with the snapshot volume", ic.Command, ic.VolumeMounts, want)
	}
	if sc := ic.SecurityContext; sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"CHOWN"}) ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("init container securityContext %+v: want CHOWN only, a read-only root file system, no privilege escalation", sc)
	}
}

// createService creates a Service with annotations, selector and ports (or
// an ExternalName Service when externalName is set).
func createService(t *testing.T, c *harness.Cluster, ns, name string, annotations, selector map[string]string, externalName string, ports ...corev1.ServicePort) {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec:       corev1.ServiceSpec{Selector: selector, Ports: ports},
	}
	if externalName != "" {
		svc.Spec.Type, svc.Spec.ExternalName = corev1.ServiceTypeExternalName, externalName
	}
	cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Client.CoreV1().Services(ns).Create(cx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service %s/%s: %v", ns, name, err)
	}
}

// createServiceExport creates a v1beta1 ServiceExport (as admin).
func createServiceExport(t *testing.T, dyn dynamic.Interface, ns, name string) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": serviceExports.GroupVersion().String(), "kind": "ServiceExport",
		"metadata": map[string]any{"name": name, "namespace": ns},
	}}
	cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := dyn.Resource(serviceExports).Namespace(ns).Create(cx, u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ServiceExport %s/%s: %v", ns, name, err)
	}
}

// condition is one status condition of a ServiceExport as the test wants it.
type condition struct{ status, reason string }

// exportConditions checks a ServiceExport's status conditions: each wanted
// type with its status and reason, and observedGeneration equal to the
// object's generation.
func exportConditions(dyn dynamic.Interface, ns, name string, want map[string]condition) error {
	cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u, err := dyn.Resource(serviceExports).Namespace(ns).Get(cx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	raw, _, err := unstructured.NestedSlice(u.Object, "status", "conditions")
	if err != nil {
		return err
	}
	got := map[string]metav1.Condition{}
	for _, r := range raw {
		var c metav1.Condition
		m, _ := r.(map[string]any)
		if err := harness.ToTyped(&unstructured.Unstructured{Object: m}, &c); err != nil {
			return fmt.Errorf("ServiceExport %s/%s: condition %v: %w", ns, name, r, err)
		}
		got[c.Type] = c
	}
	for typ, w := range want {
		c, ok := got[typ]
		if !ok || string(c.Status) != w.status || c.Reason != w.reason || c.ObservedGeneration != u.GetGeneration() {
			return fmt.Errorf("ServiceExport %s/%s: condition %s is %+v, want %s/%s at generation %d; all: %v",
				ns, name, typ, c, w.status, w.reason, u.GetGeneration(), raw)
		}
	}
	return nil
}

// podExports checks a Pod's exporter label and export annotation: absent
// when want is nil, else the annotation holds exactly want (compared as
// data, not bytes).
func podExports(c *harness.Cluster, ns, name string, want []harness.ExportService) error {
	cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := c.Client.CoreV1().Pods(ns).Get(cx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	label, hasLabel := p.Labels[harness.ExporterLabel]
	ann, hasAnn := p.Annotations[harness.ExportAnnotation]
	if want == nil {
		if hasLabel || hasAnn {
			return fmt.Errorf("pod %s/%s: label %q (%v), annotation %q (%v); want neither", ns, name, label, hasLabel, ann, hasAnn)
		}
		return nil
	}
	if label != "true" {
		return fmt.Errorf("pod %s/%s: label %s=%q (%v), want \"true\"", ns, name, harness.ExporterLabel, label, hasLabel)
	}
	var got struct {
		Services []harness.ExportService `json:"services"`
	}
	if err := json.Unmarshal([]byte(ann), &got); err != nil {
		return fmt.Errorf("pod %s/%s: annotation %q: %v", ns, name, ann, err)
	}
	if !reflect.DeepEqual(got.Services, want) {
		return fmt.Errorf("pod %s/%s: annotation %s, want %s", ns, name, ann, harness.ExportJSON(want...))
	}
	return nil
}

// annotatorArgs are the Deployment's arguments for a run on 127.0.0.1: the
// cluster placeholder replaced, $(POD_NAMESPACE) resolved as the kubelet
// would (to the Deployment's namespace), --listen left to the harness,
// --snapshot-dir a temporary folder of each run.
func annotatorArgs(t *testing.T, d *appsv1.Deployment, cluster string) []string {
	t.Helper()
	var out []string
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--listen") {
			continue
		}
		a = strings.ReplaceAll(a, clusterPlaceholder, cluster)
		a = strings.ReplaceAll(a, "$(POD_NAMESPACE)", d.Namespace)
		if strings.HasPrefix(a, "--snapshot-dir=") {
			a = "--snapshot-dir=" + t.TempDir() // each replica its folder, as each node its hostPath
		}
		out = append(out, a)
	}
	f := flags(t, out)
	if f["cluster"] != cluster || f["lease-namespace"] != kubeSystem {
		t.Fatalf("the Deployment's arguments %q give --cluster %q, --lease-namespace %q", out, f["cluster"], f["lease-namespace"])
	}
	return out
}

// clientsOf returns a typed and a dynamic client with kubeconfig's identity.
func clientsOf(t *testing.T, kubeconfig string) (*kubernetes.Clientset, dynamic.Interface) {
	t.Helper()
	cfg, err := harness.RESTConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return harness.NewClient(t, kubeconfig, 0), dyn
}

// metric reads one sample of the annotator's metrics; an absent sample
// (say, a counter vector with no such label yet) reads 0.
func metric(a *harness.Annotator, name string) (float64, error) {
	v, _, err := a.Metric(name)
	return v, err
}

// TestAnnotatorManifests applies manifests/annotator (and the MCS CRDs) to a
// real kube-apiserver and runs bin/mcs-annotator with the Deployment's
// arguments as the mcs-annotator ServiceAccount (impersonation: the API
// server authorizes each request as that account). It must become leader,
// annotate the Pods of a Service exported by annotation and of one exported
// by a ServiceExport, set ServiceExport status, remove what it wrote when a
// Service stops being exported, hand the lease over to a second replica,
// and never be forbidden; and the account may do nothing beyond the contract.
func TestAnnotatorManifests(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator)
	c := harness.StartCluster(t, "edge-a")
	waitNamespace(t, c, kubeSystem)
	c.InstallMCSCRDs(t)
	m := readAnnotator(t)
	apply(t, c, m.objs)
	dyn := c.Dynamic(t)

	// Workloads: Service backend exported by annotation (a named
	// targetPort), Service api by a ServiceExport (targetPort unset), a Pod
	// selected by both, one by neither; a ServiceExport without a Service and
	// one of an ExternalName Service.
	ns := c.NewNamespace(t)
	exported := map[string]string{exportServiceAnnotation: "true"}
	createService(t, c, ns, "backend", exported, map[string]string{"app": "backend"}, "",
		corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP})
	createService(t, c, ns, "api", nil, map[string]string{"tier": "api"}, "",
		corev1.ServicePort{Name: "grpc", Port: 9000, Protocol: corev1.ProtocolTCP})
	createService(t, c, ns, "ext", nil, nil, "example.com")
	for _, name := range []string{"api", "ghost", "ext"} {
		createServiceExport(t, dyn, ns, name)
	}
	for name, labels := range map[string]map[string]string{
		"backend-0": {"app": "backend"}, "api-0": {"tier": "api"}, "shared-0": {"app": "backend", "tier": "api"}, "other-0": {"app": "other"},
	} {
		c.CreatePodObject(t, harness.Pod{Name: name, Labels: labels}.Object(ns))
	}

	const cluster = "edge-a"
	backend := harness.ExportService{Name: "backend", Namespace: ns, Cluster: cluster,
		Ports: []harness.ExportPort{{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP"}}}
	api := harness.ExportService{Name: "api", Namespace: ns, Cluster: cluster,
		Ports: []harness.ExportPort{{Name: "grpc", Port: 9000, TargetPort: 9000, Protocol: "TCP"}}}

	saUser, saGroups := harness.ServiceAccountUser(kubeSystem, annotatorSA), harness.ServiceAccountGroups(kubeSystem)
	kubeconfig := c.KubeconfigAs(t, saUser, saGroups...)
	args := append(annotatorArgs(t, &m.deployment, cluster),
		"--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms")
	first := harness.StartAnnotator(t, kubeconfig, append(args, "--id", "first")...)
	noForbidden := func(a *harness.Annotator) {
		t.Helper()
		for _, line := range strings.Split(a.Log(), "\n") {
			if strings.Contains(strings.ToLower(line), "forbidden") {
				t.Errorf("the annotator (%s) was forbidden something: %s", a.Addr(), line)
			}
		}
	}

	t.Run("Leader", func(t *testing.T) {
		harness.Eventually(t, 20*time.Second, func() error {
			if v, err := metric(first, "mcs_annotator_leader"); err != nil || v != 1 {
				return fmt.Errorf("mcs_annotator_leader %v (%v); log:\n%s", v, err, harness.Tail(first.Process().LogPath, 20))
			}
			_, err := first.Get("/readyz")
			return err
		})
	})

	t.Run("PodsAnnotated", func(t *testing.T) {
		harness.Eventually(t, 20*time.Second, func() error {
			for name, want := range map[string][]harness.ExportService{
				"backend-0": {backend}, "api-0": {api}, "shared-0": {api, backend}, "other-0": nil,
			} {
				if err := podExports(c, ns, name, want); err != nil {
					return err
				}
			}
			return nil
		})
	})

	// The peer grants (issue 26): ns exports, so the peer reader may read
	// its Pods, and the list names it.
	t.Run("PeerGrants", func(t *testing.T) {
		harness.Eventually(t, 20*time.Second, func() error {
			cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			rb, err := c.Client.RbacV1().RoleBindings(ns).Get(cx, peerGrant, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if want := peerGrantBinding(ns); rb.RoleRef != want.RoleRef || !slices.Equal(rb.Subjects, want.Subjects) || rb.Labels[managedByLabel] != annotatorSA {
				return fmt.Errorf("RoleBinding %s/%s: %+v, want %+v", ns, peerGrant, rb, want)
			}
			cm, err := c.Client.CoreV1().ConfigMaps(kubeSystem).Get(cx, exportingList, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got := cm.Data[exportingKey]; got != ns+"\n" {
				return fmt.Errorf("ConfigMap %s/%s: %q, want %q", kubeSystem, exportingList, got, ns+"\n")
			}
			return nil
		})
	})

	t.Run("ServiceExportStatus", func(t *testing.T) {
		harness.Eventually(t, 20*time.Second, func() error {
			for name, want := range map[string]map[string]condition{
				"api":   {"Valid": {"True", "Valid"}, "Ready": {"True", "Exported"}, "Conflict": {"False", "NoConflicts"}},
				"ghost": {"Valid": {"False", "NoService"}, "Ready": {"False", "Failed"}},
				"ext":   {"Valid": {"False", "InvalidServiceType"}, "Ready": {"False", "Failed"}},
			} {
				if err := exportConditions(dyn, ns, name, want); err != nil {
					return err
				}
			}
			return nil
		})
	})

	t.Run("Unexported", func(t *testing.T) {
		// backend no longer exported: what the annotator wrote goes away.
		cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, exportServiceAnnotation)
		if _, err := c.Client.CoreV1().Services(ns).Patch(cx, "backend", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 20*time.Second, func() error {
			for name, want := range map[string][]harness.ExportService{"backend-0": nil, "api-0": {api}, "shared-0": {api}} {
				if err := podExports(c, ns, name, want); err != nil {
					return err
				}
			}
			return nil
		})
	})

	// The writes went through as the ServiceAccount, none failed (status is
	// written with server-side apply: no resourceVersion, so no conflict with
	// the annotator's own last write).
	t.Run("Writes", func(t *testing.T) {
		for _, name := range []string{`mcs_annotator_pod_writes_total{result="error"}`, `mcs_annotator_status_writes_total{result="error"}`} {
			if v, err := metric(first, name); err != nil || v != 0 {
				t.Errorf("%s %v (%v), want 0", name, v, err)
			}
		}
		// A counter moves just after the write it counts returns: wait for it.
		for _, name := range []string{`mcs_annotator_pod_writes_total{result="ok"}`, `mcs_annotator_status_writes_total{result="ok"}`} {
			harness.Eventually(t, 10*time.Second, func() error {
				if v, err := metric(first, name); err != nil || v == 0 {
					return fmt.Errorf("%s %v (%v), want > 0", name, v, err)
				}
				return nil
			})
		}
	})

	// A second replica, as the Deployment runs: it stands by, then takes the
	// lease when the leader stops (and releases it on SIGTERM). Both acquire
	// and renew the Lease as the ServiceAccount: the Role is enough.
	t.Run("HandOver", func(t *testing.T) {
		second := harness.StartAnnotator(t, kubeconfig, append(args, "--id", "second")...)
		harness.Eventually(t, 20*time.Second, func() error {
			_, err := second.Get("/readyz")
			return err
		})
		time.Sleep(time.Second) // a few retry periods: it must stay a follower
		if v, err := metric(second, "mcs_annotator_leader"); err != nil || v != 0 {
			t.Fatalf("second replica: mcs_annotator_leader %v (%v), want 0 while the first leads", v, err)
		}
		first.Kill(t, syscall.SIGTERM)
		took := harness.Eventually(t, 15*time.Second, func() error {
			if v, err := metric(second, "mcs_annotator_leader"); err != nil || v != 1 {
				return fmt.Errorf("second replica: mcs_annotator_leader %v (%v); log:\n%s", v, err, harness.Tail(second.Process().LogPath, 20))
			}
			return nil
		})
		t.Logf("the second replica leads %s after the first got SIGTERM", took.Round(time.Millisecond))
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lease, err := c.Client.CoordinationV1().Leases(kubeSystem).Get(cx, annotatorLease, metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "second" {
			t.Errorf("Lease %s/%s: %+v (%v), want held by second", kubeSystem, annotatorLease, lease, err)
		}
		// The new leader keeps the Pods as they are, and follows changes.
		cx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel2()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, exportServiceAnnotation)
		if _, err := c.Client.CoreV1().Services(ns).Patch(cx2, "backend", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 20*time.Second, func() error {
			for name, want := range map[string][]harness.ExportService{"backend-0": {backend}, "api-0": {api}, "shared-0": {api, backend}} {
				if err := podExports(c, ns, name, want); err != nil {
					return err
				}
			}
			return nil
		})
		noForbidden(second)
	})
	noForbidden(first)
	if !strings.Contains(first.Log(), "became leader") {
		t.Errorf("the first annotator never logged \"became leader\"")
	}

	// Least privilege: what the account may and may not do.
	t.Run("LeastPrivilege", func(t *testing.T) {
		cx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sa, sadyn := clientsOf(t, kubeconfig)
		allowed, forbidden := verdicts(t)
		_, err := sa.CoreV1().Pods("").List(cx, metav1.ListOptions{Limit: 1})
		allowed("list pods in all namespaces", err)
		_, err = sa.CoreV1().Services(ns).Get(cx, "api", metav1.GetOptions{})
		allowed("get a service", err)
		_, err = sadyn.Resource(serviceExports).Namespace("").List(cx, metav1.ListOptions{Limit: 1})
		allowed("list serviceexports", err)
		_, err = sa.CoordinationV1().Leases(kubeSystem).Get(cx, annotatorLease, metav1.GetOptions{})
		allowed("get its Lease", err)

		_, err = sa.CoreV1().Secrets(kubeSystem).List(cx, metav1.ListOptions{})
		forbidden("list secrets", err)
		_, err = sa.CoreV1().Secrets(ns).Get(cx, "any", metav1.GetOptions{})
		forbidden("get a secret", err)
		err = sa.CoreV1().Pods(ns).Delete(cx, "other-0", metav1.DeleteOptions{})
		forbidden("delete a pod", err)
		_, err = sa.CoreV1().Pods(ns).Create(cx, harness.Pod{Name: "x"}.Object(ns), metav1.CreateOptions{})
		forbidden("create a pod", err)
		p, err := c.Client.CoreV1().Pods(ns).Get(cx, "other-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = sa.CoreV1().Pods(ns).Update(cx, p, metav1.UpdateOptions{})
		forbidden("update a pod", err)
		_, err = sa.CoreV1().Services(ns).Patch(cx, "api", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
		forbidden("patch a service", err)
		err = sa.CoreV1().Services(ns).Delete(cx, "api", metav1.DeleteOptions{})
		forbidden("delete a service", err)
		_, err = sa.CoreV1().ConfigMaps(kubeSystem).List(cx, metav1.ListOptions{})
		forbidden("list configmaps", err)
		// The MCS controller records Events (create and patch), and never
		// reads, changes or deletes one.
		ev, err := sa.CoreV1().Events(ns).Create(cx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: ns},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "other-0"}}, metav1.CreateOptions{})
		if err != nil {
			t.Errorf("create an event: %v, want allowed (the controller's Events)", err)
		} else {
			err = sa.CoreV1().Events(ns).Delete(cx, ev.Name, metav1.DeleteOptions{})
			forbidden("delete an event", err)
			_, err = sa.CoreV1().Events(ns).List(cx, metav1.ListOptions{})
			forbidden("list events", err)
		}
		_, err = sadyn.Resource(serviceExports).Namespace(ns).Patch(cx, "api", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
		forbidden("patch a ServiceExport (not its status)", err)
		err = sadyn.Resource(serviceExports).Namespace(ns).Delete(cx, "api", metav1.DeleteOptions{})
		forbidden("delete a ServiceExport", err)
		createSE := &unstructured.Unstructured{Object: map[string]any{"apiVersion": serviceExports.GroupVersion().String(),
			"kind": "ServiceExport", "metadata": map[string]any{"name": "backend", "namespace": ns}}}
		_, err = sadyn.Resource(serviceExports).Namespace(ns).Create(cx, createSE, metav1.CreateOptions{})
		forbidden("create a ServiceExport", err)
		_, err = sa.CoordinationV1().Leases(kubeSystem).Watch(cx, metav1.ListOptions{})
		forbidden("watch leases", err)
		_, err = sa.CoordinationV1().Leases(kubeSystem).Get(cx, "kube-controller-manager", metav1.GetOptions{})
		forbidden("get another Lease", err)
		_, err = sa.CoordinationV1().Leases(ns).Get(cx, annotatorLease, metav1.GetOptions{})
		forbidden("get a Lease in another namespace", err)
		err = sa.CoordinationV1().Leases(ns).Delete(cx, annotatorLease, metav1.DeleteOptions{})
		forbidden("delete a Lease in another namespace", err)
	})

	// Last: it removes the policy's binding at the end.
	t.Run("AdmissionPolicy", func(t *testing.T) {
		admissionPolicy(t, c, harness.NewClient(t, kubeconfig, 0), m, ns)
	})
}

// admissionPolicy checks the ValidatingAdmissionPolicy against the real
// API server as the annotator's identity: what it writes passes, an image
// change or any other field is refused, another Lease cannot be created,
// other identities are not concerned; then, with the binding removed, the
// same image change goes through (RBAC alone allows it: the policy is what
// stops it).
func admissionPolicy(t *testing.T, c *harness.Cluster, sa *kubernetes.Clientset, m *annotator, ns string) {
	cx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const pod = "other-0"
	p, err := c.Client.CoreV1().Pods(ns).Get(cx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	image := fmt.Sprintf(`{"spec":{"containers":[{"name":%q,"image":"registry.example/evil:1"}]}}`, p.Spec.Containers[0].Name)
	patch := func(cl *kubernetes.Clientset, pt types.PatchType, body string) error {
		_, err := cl.CoreV1().Pods(ns).Patch(cx, pod, pt, []byte(body), metav1.PatchOptions{})
		return err
	}
	refused := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), m.policy.Name) {
			t.Errorf("%s as the annotator: %v, want refused by ValidatingAdmissionPolicy %s", what, err, m.policy.Name)
		}
	}
	// The policy takes effect shortly after it is created: wait for the
	// first refusal.
	harness.Eventually(t, 20*time.Second, func() error {
		if err := patch(sa, types.StrategicMergePatchType, image); err == nil || !strings.Contains(err.Error(), m.policy.Name) {
			return fmt.Errorf("image change as the annotator: %v, want refused by %s", err, m.policy.Name)
		}
		return nil
	})
	refused("change another label", patch(sa, types.MergePatchType, `{"metadata":{"labels":{"app":"x"}}}`))
	refused("add a label", patch(sa, types.MergePatchType, `{"metadata":{"labels":{"x":"y"}}}`))
	refused("add an annotation", patch(sa, types.MergePatchType, `{"metadata":{"annotations":{"x":"y"}}}`))
	refused("add a finalizer", patch(sa, types.MergePatchType, `{"metadata":{"finalizers":["example.com/x"]}}`))
	refused("change the image and its own label at once", patch(sa, types.StrategicMergePatchType,
		fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}},"spec":{"containers":[{"name":%q,"image":"registry.example/evil:1"}]}}`, harness.ExporterLabel, p.Spec.Containers[0].Name)))
	_, err = sa.CoordinationV1().Leases(kubeSystem).Create(cx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-controller-manager", Namespace: kubeSystem}}, metav1.CreateOptions{})
	refused("create another Lease", err)
	// RBAC allows deleting any Lease here (a relay hub's prune); the policy
	// only a relay hub's mcs-origin.<cluster> labelled with its cluster.
	dryDelete := metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	refused("delete its own Lease", sa.CoordinationV1().Leases(kubeSystem).Delete(cx, annotatorLease, dryDelete))
	for _, l := range []*coordinationv1.Lease{
		{ObjectMeta: metav1.ObjectMeta{Name: "kube-controller-manager", Namespace: kubeSystem}},
		{ObjectMeta: metav1.ObjectMeta{Name: "mcs-origin.gone", Namespace: kubeSystem, Labels: map[string]string{"multicluster.mcsannotations.io/relay-origin": "gone"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "mcs-origin.misnamed", Namespace: kubeSystem, Labels: map[string]string{"multicluster.mcsannotations.io/relay-origin": "other"}}},
	} {
		if _, err := c.Client.CoordinationV1().Leases(kubeSystem).Create(cx, l, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	refused("delete another component's Lease", sa.CoordinationV1().Leases(kubeSystem).Delete(cx, "kube-controller-manager", dryDelete))
	refused("delete a Lease named for another cluster than its label's", sa.CoordinationV1().Leases(kubeSystem).Delete(cx, "mcs-origin.misnamed", dryDelete))
	if err := sa.CoordinationV1().Leases(kubeSystem).Delete(cx, "mcs-origin.gone", dryDelete); err != nil {
		t.Errorf("delete a relay hub's Lease as the annotator: %v", err)
	}

	// The peer grants: the one RoleBinding of the one ClusterRole to the
	// peer reader, the one ConfigMap. RBAC allows each of these (create and
	// delete cannot be limited by name); the policy refuses them.
	grantNS := c.NewNamespace(t)
	other := peerGrantBinding(grantNS)
	other.Name = "other"
	_, err = sa.RbacV1().RoleBindings(grantNS).Create(cx, other, metav1.CreateOptions{})
	refused("create another RoleBinding", err)
	everyone := peerGrantBinding(grantNS)
	everyone.Subjects = []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}}
	_, err = sa.RbacV1().RoleBindings(grantNS).Create(cx, everyone, metav1.CreateOptions{})
	refused("grant every user", err)
	if _, err := c.Client.RbacV1().RoleBindings(grantNS).Create(cx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused("delete another RoleBinding", sa.RbacV1().RoleBindings(grantNS).Delete(cx, other.Name, metav1.DeleteOptions{}))
	_, err = sa.CoreV1().ConfigMaps(kubeSystem).Create(cx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: kubeSystem}}, metav1.CreateOptions{})
	refused("create another ConfigMap", err)
	own := peerGrantBinding(grantNS)
	own.Labels = nil // the running annotator would delete it (grantNS exports nothing)
	if _, err := sa.RbacV1().RoleBindings(grantNS).Create(cx, own, metav1.CreateOptions{}); err != nil {
		t.Errorf("create the peer grant as the annotator: %v", err)
	}
	if err := sa.RbacV1().RoleBindings(grantNS).Delete(cx, peerGrant, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete the peer grant as the annotator: %v", err)
	}

	ownKeys := fmt.Sprintf(`{"metadata":{"labels":{%q:"true","multicluster.kubernetes.io/importer":"true"},"annotations":{%q:"{}","multicluster.kubernetes.io/export-signature":"x",%q:"{}",%q:"x"}}}`,
		harness.ExporterLabel, harness.ExportAnnotation, annotation.EndpointAnnotation, annotation.EndpointSignatureAnnotation)
	if err := patch(sa, types.MergePatchType, ownKeys); err != nil {
		t.Errorf("set its own labels and annotations as the annotator: %v", err)
	}
	if err := patch(sa, types.MergePatchType, fmt.Sprintf(`{"metadata":{"labels":{"multicluster.kubernetes.io/importer":null},"annotations":{"multicluster.kubernetes.io/export-signature":null,%q:null,%q:null}}}`,
		annotation.EndpointAnnotation, annotation.EndpointSignatureAnnotation)); err != nil {
		t.Errorf("remove its own label and annotations as the annotator: %v", err)
	}
	if err := patch(c.Client, types.StrategicMergePatchType, `{"metadata":{"labels":{"x":"admin"}}}`); err != nil {
		t.Errorf("admin patch: %v (the policy concerns the annotator only)", err)
	}

	// Without the binding, RBAC alone lets the annotator change an image.
	if err := c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(cx, m.policyBinding.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 20*time.Second, func() error { return patch(sa, types.StrategicMergePatchType, image) })
	if err := sa.RbacV1().RoleBindings(grantNS).Delete(cx, other.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete another RoleBinding without the policy: %v (RBAC alone allows it)", err)
	}
	if got := c.GetPod(t, ns, pod).Spec.Containers[0].Image; got != "registry.example/evil:1" {
		t.Errorf("image %q after the unguarded patch", got)
	}
}

// TestAnnotatorPlaceholderClusterID: the Deployment's arguments as shipped
// (CLUSTER_ID not replaced) stop the annotator at start-up with a message
// that names the word, rather than let it write a cluster ID every reader
// rejects.
func TestAnnotatorPlaceholderClusterID(t *testing.T) {
	tools := harness.RequireTools(t, harness.ToolAnnotator)
	m := readAnnotator(t)
	args := []string{"--kubeconfig", filepath.Join(t.TempDir(), "none"), "--listen", fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))}
	for _, a := range m.deployment.Spec.Template.Spec.Containers[0].Args {
		if !strings.HasPrefix(a, "--listen") {
			args = append(args, strings.ReplaceAll(a, "$(POD_NAMESPACE)", m.deployment.Namespace))
		}
	}
	cx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cx, tools.Annotator, args...).CombinedOutput()
	if err == nil || cx.Err() != nil || !strings.Contains(string(out), `"`+clusterPlaceholder+`"`) {
		t.Errorf("mcs-annotator %q: err %v (context %v), want an exit naming %s; output:\n%s", args, err, cx.Err(), clusterPlaceholder, out)
	}
}
