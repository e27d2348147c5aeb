package manifests

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// The user the images run as (tools/image) and the Deployment's Pods with it.
const (
	imageUID = 65532
	imageGID = 65532
)

// find returns the object of kind and name among objs, or fails.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	var found *unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			if found != nil {
				t.Fatalf("two %s %s", kind, name)
			}
			found = u
		}
	}
	if found == nil {
		t.Fatalf("no %s %s", kind, name)
	}
	return found
}

// clusterKeys are an ed25519 key pair per cluster, the public keys written
// as a verify folder reads them (<cluster>.pub).
type clusterKeys struct {
	dir  string
	priv map[string]ed25519.PrivateKey
}

func newClusterKeys(t *testing.T, clusters ...string) *clusterKeys {
	t.Helper()
	k := &clusterKeys{dir: t.TempDir(), priv: map[string]ed25519.PrivateKey{}}
	for _, c := range clusters {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(k.dir, c+annotation.KeySuffix), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
			t.Fatal(err)
		}
		k.priv[c] = priv
	}
	return k
}

// sign signs a Pod's export annotation as c's annotator would.
func (k *clusterKeys) sign(t *testing.T, c *harness.Cluster, ns, name string) {
	t.Helper()
	p := c.GetPod(t, ns, name)
	v := p.Annotations[annotation.ExportAnnotation]
	c.SetPodAnnotation(t, ns, name, annotation.SignatureAnnotation, annotation.Sign(k.priv[c.Name], c.Name, ns, name, string(p.UID), v))
}

// nonRootCoreDNS checks that CoreDNS runs as the image's non-root user with
// no capability, binds port 53 through the namespaced sysctl, and that an
// init step running as root with CHOWN alone gives it the snapshot folder.
func nonRootCoreDNS(t *testing.T, d *appsv1.Deployment, snapVol string) {
	t.Helper()
	pod := d.Spec.Template.Spec
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsUser == nil || *psc.RunAsUser != imageUID || psc.RunAsGroup == nil || *psc.RunAsGroup != imageGID ||
		psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("Pod securityContext %+v: want runAsNonRoot, user and group %d:%d", psc, imageUID, imageGID)
	}
	port := false
	for _, s := range psc.Sysctls {
		port = port || (s.Name == "net.ipv4.ip_unprivileged_port_start" && s.Value == "53")
	}
	if !port {
		t.Errorf("Pod sysctls %+v: want net.ipv4.ip_unprivileged_port_start=53, so that a user without capabilities binds port 53", psc.Sysctls)
	}
	sc := pod.Containers[0].SecurityContext
	if sc == nil || (sc.RunAsUser != nil && *sc.RunAsUser == 0) || (sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot) ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("CoreDNS securityContext %+v: want non-root, every capability dropped and none added, no escalation, read-only root", sc)
	}
	if len(pod.InitContainers) != 1 {
		t.Fatalf("%d init containers, want 1 (the snapshot folder's owner)", len(pod.InitContainers))
	}
	ic := pod.InitContainers[0]
	want := []string{"/mcs-snapshot-dir", "-owner", fmt.Sprintf("%d:%d", imageUID, imageGID), "/var/lib/mcsannotations"}
	if !slices.Equal(ic.Command, want) || ic.Image != pod.Containers[0].Image {
		t.Errorf("init container %q image %q: want %q from CoreDNS's image %q", ic.Command, ic.Image, want, pod.Containers[0].Image)
	}
	if len(ic.VolumeMounts) != 1 || ic.VolumeMounts[0].Name != snapVol || ic.VolumeMounts[0].MountPath != "/var/lib/mcsannotations" {
		t.Errorf("init container mounts %+v: want the snapshot volume %q only, at /var/lib/mcsannotations", ic.VolumeMounts, snapVol)
	}
	isc := ic.SecurityContext
	if isc == nil || isc.Capabilities == nil || !slices.Equal(isc.Capabilities.Add, []corev1.Capability{"CHOWN"}) ||
		!slices.Equal(isc.Capabilities.Drop, []corev1.Capability{"ALL"}) || isc.AllowPrivilegeEscalation == nil || *isc.AllowPrivilegeEscalation ||
		isc.ReadOnlyRootFilesystem == nil || !*isc.ReadOnlyRootFilesystem {
		t.Errorf("init securityContext %+v: want CHOWN alone, no escalation, read-only root", isc)
	}
}

// TestOverlaysStatic needs no cluster: each example overlay renders (with
// kustomize's Go API) to the base with the cluster's ID in the Corefile and
// the annotator's flags, its peer, signature verification and signing, and
// the images' tag; nothing else in the Corefile differs.
// secretsReadable checks that a Pod running as a non-root user can read its
// Secret volumes: the kubelet writes Secret files owned by root unless the
// Pod has an fsGroup, which then owns them; so the Pod needs the fsGroup
// and the mode must let that group read.
func secretsReadable(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	sc := d.Spec.Template.Spec.SecurityContext
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
			continue // root reads anything
		}
		if sc.FSGroup == nil {
			t.Errorf("%s: Secret volume %s, user %d and no fsGroup: its files stay root's and unreadable", d.Name, v.Name, *sc.RunAsUser)
		}
		if m := v.Secret.DefaultMode; m != nil && *m&0o040 == 0 {
			t.Errorf("%s: Secret volume %s has mode %#o: the fsGroup cannot read it", d.Name, v.Name, *m)
		}
	}
}

func TestOverlaysStatic(t *testing.T) {
	base := manifests(t, "base")
	baseCorefile := find(t, base, "ConfigMap", "coredns").Object["data"].(map[string]any)["Corefile"].(string)
	for me, peer := range map[string]string{"edge-a": "edge-b", "edge-b": "edge-a"} {
		t.Run(me, func(t *testing.T) {
			objs := manifests(t, "overlays/"+me)
			if len(objs) != len(base) {
				t.Errorf("%d objects, the base has %d", len(objs), len(base))
			}
			for _, b := range base {
				find(t, objs, b.GetKind(), b.GetName())
			}
			corefile := find(t, objs, "ConfigMap", "coredns").Object["data"].(map[string]any)["Corefile"].(string)
			wantCorefile := strings.NewReplacer(
				"cluster "+clusterPlaceholder+"\n", "cluster "+me+"\n",
				"# peer edge-b /etc/mcs/peers/edge-b.kubeconfig\n", "peer "+peer+" /etc/mcs/peers/"+peer+".kubeconfig\n",
				"snapshot /var/lib/mcsannotations/table.db\n", "snapshot /var/lib/mcsannotations/table.db\n"+
					"        # Answer only what the annotator of each cluster signed: the\n"+
					"        # public keys <cluster>.pub of ConfigMap mcsannotations-keys.\n"+
					"        verify /etc/mcs/keys\n",
			).Replace(baseCorefile)
			if corefile != wantCorefile {
				t.Errorf("the Corefile differs from the base's by more than cluster, peer and verify:\n%s\nwant:\n%s", corefile, wantCorefile)
			}
			var dns, ann appsv1.Deployment
			if err := harness.ToTyped(find(t, objs, "Deployment", "coredns"), &dns); err != nil {
				t.Fatal(err)
			}
			if err := harness.ToTyped(find(t, objs, "Deployment", annotatorSA), &ann); err != nil {
				t.Fatal(err)
			}
			mounts := map[string]string{}
			for _, m := range dns.Spec.Template.Spec.Containers[0].VolumeMounts {
				mounts[m.Name] = m.MountPath
			}
			vols := map[string]corev1.Volume{}
			for _, v := range dns.Spec.Template.Spec.Volumes {
				vols[v.Name] = v
			}
			if v := vols["keys"]; mounts["keys"] != "/etc/mcs/keys" || v.ConfigMap == nil || v.ConfigMap.Name != "mcsannotations-keys" {
				t.Errorf("CoreDNS: keys volume %+v mounted at %q, want ConfigMap mcsannotations-keys at /etc/mcs/keys", v, mounts["keys"])
			}
			for _, d := range []*appsv1.Deployment{&dns, &ann} {
				for _, c := range append(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers...) {
					if !strings.HasSuffix(c.Image, ":v0.1.0") || !strings.HasPrefix(c.Image, "localhost/mcsannotations/") {
						t.Errorf("%s/%s: image %q, want the overlay's tag v0.1.0", d.Name, c.Name, c.Image)
					}
				}
			}
			nonRootCoreDNS(t, &dns, "snapshot")
			secretsReadable(t, &dns)
			secretsReadable(t, &ann)
			ctr := ann.Spec.Template.Spec.Containers[0]
			f := flags(t, ctr.Args)
			if f["cluster"] != me || f["sign-key"] != "/etc/mcs/signing/key.pem" || f["lease-namespace"] != "$(POD_NAMESPACE)" {
				t.Errorf("annotator flags %v: want --cluster=%s, --sign-key=/etc/mcs/signing/key.pem, the base's others", f, me)
			}
			signing := false
			for _, m := range ctr.VolumeMounts {
				for _, v := range ann.Spec.Template.Spec.Volumes {
					signing = signing || (m.Name == v.Name && m.MountPath == "/etc/mcs/signing" && v.Secret != nil && v.Secret.SecretName == "mcs-annotator-signing-key")
				}
			}
			if !signing {
				t.Errorf("the annotator does not mount Secret mcs-annotator-signing-key at /etc/mcs/signing")
			}

			// The MCS controller reads the peer as CoreDNS does: the
			// Corefile's kubeconfig path, from the same Secret at the
			// same place.
			peerFile := "/etc/mcs/peers/" + peer + ".kubeconfig"
			if _, on := f["mcs-controller"]; !on || f["peer"] != peer+"="+peerFile {
				t.Errorf("annotator flags %v: want --mcs-controller and --peer=%s=%s", f, peer, peerFile)
			}
			if !strings.Contains(corefile, "peer "+peer+" "+peerFile+"\n") {
				t.Errorf("the Corefile does not read %s from %s, as the controller's --peer does", peer, peerFile)
			}
			secretAt := func(d *appsv1.Deployment, ctr corev1.Container) string {
				for _, m := range ctr.VolumeMounts {
					for _, v := range d.Spec.Template.Spec.Volumes {
						if m.Name == v.Name && m.MountPath == "/etc/mcs/peers" && v.Secret != nil {
							return v.Secret.SecretName
						}
					}
				}
				return ""
			}
			if a, c := secretAt(&ann, ctr), secretAt(&dns, dns.Spec.Template.Spec.Containers[0]); a == "" || a != c {
				t.Errorf("/etc/mcs/peers: the annotator mounts Secret %q, CoreDNS %q: want the same", a, c)
			}
		})
	}
}

// TestNonRootSnapshot runs what the Deployment runs on a node, as the users
// it names: bin/coredns as 65532 cannot create its snapshot in a folder that
// root owns (as the kubelet makes a hostPath), and can once the init step
// (bin/mcs-snapshot-dir, as root with CAP_CHOWN only) has run; a snapshot
// an older root CoreDNS left there is handed over too.
func TestNonRootSnapshot(t *testing.T) {
	tools := harness.RequireTools(t, harness.ToolCoreDNS)
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs processes as the Deployment's users")
	}
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	prepare := filepath.Join(root, "bin", "mcs-snapshot-dir")
	if _, err := os.Stat(prepare); err != nil {
		t.Fatalf("%v (make build)", err)
	}
	c := readCoreDNS(t)
	initArgs := c.deployment.Spec.Template.Spec.InitContainers[0].Command[1:]

	// A folder the non-root user can reach (t.TempDir's are 0700), and in
	// it the hostPath as the kubelet makes it: root's, 0755.
	top, err := os.MkdirTemp("", "mcs-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	hostPath := filepath.Join(top, "var-lib-mcsannotations")
	if err := os.Mkdir(hostPath, 0o755); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(hostPath, "table.db.old")
	if err := os.WriteFile(old, []byte("left by a root CoreDNS"), 0o600); err != nil {
		t.Fatal(err)
	}
	corefile := filepath.Join(top, "Corefile")
	r := strings.NewReplacer("{PORT}", fmt.Sprint(harness.FreePort(t)), "{HEALTH}", fmt.Sprint(harness.FreePort(t)),
		"{READY}", fmt.Sprint(harness.FreePort(t)), "{METRICS}", fmt.Sprint(harness.FreePort(t)),
		"{DIR}", hostPath, "{KUBECONFIG}", filepath.Join(top, "kubeconfig"), "{RESOLV}", "/etc/resolv.conf")
	tmpl := loopbackCorefile(t, c.configMap.Data["Corefile"], rule{`(?m)^(\s*)cluster CLUSTER_ID$`, "${1}cluster edge-a"})
	if err := os.WriteFile(corefile, []byte(r.Replace(tmpl)), 0o644); err != nil {
		t.Fatal(err)
	}
	// A kubeconfig whose API server is not there: CoreDNS starts offline.
	kubeconfig := filepath.Join(top, "kubeconfig")
	if err := harness.WriteKubeconfig(kubeconfig, "edge-a", fmt.Sprintf("https://127.0.0.1:%d", harness.FreePort(t)), "none"); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(kubeconfig, 0o644); err != nil {
		t.Fatal(err)
	}
	// run starts a process as uid:gid for at most d and returns its output.
	run := func(d time.Duration, uid, gid uint32, name string, args ...string) (string, error) {
		cx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		cmd := exec.CommandContext(cx, name, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	snapshot := filepath.Join(hostPath, "table.db")
	// corednsFor runs CoreDNS as the image's user until it has either
	// created its snapshot or logged that it cannot (bounded), and returns
	// its log.
	corednsFor := func() string {
		log := filepath.Join(top, "coredns.log")
		f, err := os.Create(log)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd := exec.Command(tools.CoreDNS, "-conf", corefile)
		cmd.Stdout, cmd.Stderr = f, f
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: imageUID, Gid: imageGID}, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		harness.Eventually(t, 60*time.Second, func() error {
			b, _ := os.ReadFile(log)
			if _, err := os.Stat(snapshot); err == nil || strings.Contains(string(b), "permission denied") {
				return nil
			}
			return fmt.Errorf("CoreDNS as %d: no snapshot and no refusal yet; log:\n%s", imageUID, b)
		})
		b, _ := os.ReadFile(log)
		return string(b)
	}

	out := corednsFor()
	if _, err := os.Stat(snapshot); err == nil {
		t.Fatalf("CoreDNS as %d created its snapshot in root's folder; the test proves nothing:\n%s", imageUID, out)
	}
	if !strings.Contains(out, "permission denied") {
		t.Errorf("CoreDNS as %d in root's folder: no \"permission denied\" in its log:\n%s", imageUID, out)
	}

	// The init step as the Deployment runs it: root with CAP_CHOWN alone
	// (setpriv cuts the bounding set, as the runtime does for drop: [ALL],
	// add: [CHOWN]), no new privileges.
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("%v (util-linux)", err)
	}
	args := append([]string{"--bounding-set=-all,+chown", "--inh-caps=-all", "--no-new-privs", prepare}, initArgs[:len(initArgs)-1]...)
	if out, err := run(30*time.Second, 0, 0, setpriv, append(args, hostPath)...); err != nil {
		t.Fatalf("mcs-snapshot-dir: %v\n%s", err, out)
	}
	for _, p := range []string{hostPath, old} {
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := info.Sys().(*syscall.Stat_t); st.Uid != imageUID || st.Gid != imageGID {
			t.Errorf("%s owned by %d:%d after the init step, want %d:%d", p, st.Uid, st.Gid, imageUID, imageGID)
		}
	}

	out = corednsFor()
	info, err := os.Stat(snapshot)
	if err != nil {
		t.Fatalf("CoreDNS as %d after the init step: no snapshot (%v); log:\n%s", imageUID, err, out)
	}
	if st := info.Sys().(*syscall.Stat_t); st.Uid != imageUID {
		t.Errorf("snapshot owned by %d, want %d", st.Uid, imageUID)
	}
}

// The example edge that reads two relay hubs: its Corefile is the base's
// with its ID, verify and a hub line per hub; its MCS controller reads the
// same hubs (--hub) from the same Secret at the same place as CoreDNS, and
// states its endpoints signed, so that hubs can relay its exports.
func TestOverlayEdgeReadingHubs(t *testing.T) {
	base := manifests(t, "base")
	baseCorefile := find(t, base, "ConfigMap", "coredns").Object["data"].(map[string]any)["Corefile"].(string)
	objs := manifests(t, "overlays/edge-c")
	if len(objs) != len(base) {
		t.Errorf("%d objects, the base has %d", len(objs), len(base))
	}
	corefile := find(t, objs, "ConfigMap", "coredns").Object["data"].(map[string]any)["Corefile"].(string)
	wantCorefile := strings.NewReplacer(
		"cluster "+clusterPlaceholder+"\n", "cluster edge-c\n",
		"        # One line per peer cluster; the kubeconfigs come from the Secret\n"+
			"        # mcsannotations-peers (see manifests/README.md):\n"+
			"        # peer edge-b /etc/mcs/peers/edge-b.kubeconfig\n",
		"        # One line per hub; the kubeconfigs come from the Secret\n"+
			"        # mcsannotations-hubs. Either hub may fail: the answers are the\n"+
			"        # union of both.\n"+
			"        hub hub-1 /etc/mcs/hubs/hub-1.kubeconfig\n"+
			"        hub hub-2 /etc/mcs/hubs/hub-2.kubeconfig\n",
		"snapshot /var/lib/mcsannotations/table.db\n", "snapshot /var/lib/mcsannotations/table.db\n"+
			"        # Answer only what the annotator of each cluster signed: the\n"+
			"        # public keys <cluster>.pub of ConfigMap mcsannotations-keys.\n"+
			"        # Relayed records count only when their origin signed them.\n"+
			"        verify /etc/mcs/keys\n",
	).Replace(baseCorefile)
	if corefile != wantCorefile {
		t.Errorf("the Corefile differs from the base's by more than cluster, hubs and verify:\n%s\nwant:\n%s", corefile, wantCorefile)
	}
	var dns, ann appsv1.Deployment
	if err := harness.ToTyped(find(t, objs, "Deployment", "coredns"), &dns); err != nil {
		t.Fatal(err)
	}
	if err := harness.ToTyped(find(t, objs, "Deployment", annotatorSA), &ann); err != nil {
		t.Fatal(err)
	}
	nonRootCoreDNS(t, &dns, "snapshot")
	secretsReadable(t, &dns)
	secretsReadable(t, &ann)
	hubsSecret := func(d *appsv1.Deployment) string {
		for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
			for _, v := range d.Spec.Template.Spec.Volumes {
				if m.Name == v.Name && m.MountPath == "/etc/mcs/hubs" && v.Secret != nil {
					return v.Secret.SecretName
				}
			}
		}
		return ""
	}
	if a, c := hubsSecret(&ann), hubsSecret(&dns); a != "mcsannotations-hubs" || c != a {
		t.Errorf("/etc/mcs/hubs: the annotator mounts Secret %q, CoreDNS %q: want mcsannotations-hubs in both", a, c)
	}
	var hubs []string
	has := map[string]bool{}
	for _, a := range ann.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--hub="); ok {
			hubs = append(hubs, v)
		}
		has[strings.SplitN(a, "=", 2)[0]] = true
	}
	for _, h := range []string{"hub-1", "hub-2"} {
		file := "/etc/mcs/hubs/" + h + ".kubeconfig"
		if !slices.Contains(hubs, h+"="+file) || !strings.Contains(corefile, "hub "+h+" "+file+"\n") {
			t.Errorf("hub %s: the controller's --hub %v and the Corefile must both read %s", h, hubs, file)
		}
	}
	for _, f := range []string{"--mcs-controller", "--sign-key", "--sign-endpoints", "--verify"} {
		if !has[f] {
			t.Errorf("annotator flags lack %s", f)
		}
	}
}
