package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// TestKeys: the pair signs with what mcs-annotator --sign-key reads and
// verifies with what the plugin's verify folder reads.
func TestKeys(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	var out, errb bytes.Buffer
	if rc := run([]string{"mcsctl", "keys", "--cluster", "edge-a", "--out", dir}, nil, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	priv, err := annotation.ReadPrivateKey(filepath.Join(dir, "edge-a.key"))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "edge-a.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("private key mode %v, %v; want 0600", fi.Mode(), err)
	}
	keys, err := annotation.ReadPublicKeys(dir)
	if err != nil || keys["edge-a"] == nil || len(keys) != 1 {
		t.Fatalf("verify folder reads %v, %v", keys, err)
	}
	val := `{"services":[{"name":"web"}]}`
	sig := annotation.Sign(priv, "edge-a", "default", "web-0", "uid-1", val)
	if r, ok := annotation.Verify(keys["edge-a"], sig, "edge-a", "default", "web-0", "uid-1", val); !ok {
		t.Errorf("signature does not verify: %v", r)
	}

	// validate -f with --verify reads the same folder: a Pod signed with the
	// new key passes, and one whose annotation changed is refused.
	pod := func(value string) string {
		return `apiVersion: v1
kind: Pod
metadata:
  name: web-0
  namespace: default
  uid: uid-1
  labels: {multicluster.kubernetes.io/exporter: "true"}
  annotations:
    multicluster.kubernetes.io/export-services: '` + value + `'
    multicluster.kubernetes.io/export-signature: '` + sig + `'
status:
  podIP: 10.0.0.1
  conditions: [{type: Ready, status: "True"}]
`
	}
	out.Reset()
	if rc := run([]string{"mcsctl", "validate", "--cluster", "edge-a", "--verify", dir, "-f", "-"}, strings.NewReader(pod(val)), &out, &errb); rc != 0 {
		t.Errorf("signed Pod: exit %d\n%s", rc, out.String())
	}
	out.Reset()
	if rc := run([]string{"mcsctl", "validate", "--cluster", "edge-a", "--verify", dir, "-f", "-"}, strings.NewReader(pod(`{"services":[{"name":"other"}]}`)), &out, &errb); rc != 1 ||
		!strings.Contains(out.String(), "rejected (bad_signature)") {
		t.Errorf("tampered Pod: exit %d\n%s", rc, out.String())
	}

	// Never overwrites.
	errb.Reset()
	if rc := run([]string{"mcsctl", "keys", "--cluster", "edge-a", "--out", dir}, nil, &out, &errb); rc != 1 || !strings.Contains(errb.String(), "not overwriting") {
		t.Errorf("second run: exit %d, %s", rc, errb.String())
	}
	if again, _ := annotation.ReadPrivateKey(filepath.Join(dir, "edge-a.key")); !again.Equal(priv) {
		t.Error("the private key was overwritten")
	}
	if rc := run([]string{"mcsctl", "keys", "--cluster", "Bad_ID", "--out", dir}, nil, &out, &errb); rc != 1 {
		t.Errorf("bad cluster ID: exit %d", rc)
	}
	if rc := run([]string{"mcsctl", "keys"}, nil, &out, &errb); rc != 2 {
		t.Errorf("no --cluster: exit %d", rc)
	}
}

func TestValidateValue(t *testing.T) {
	tests := []struct {
		name string
		args []string
		rc   int
		want []string
	}{
		{"good export", []string{"--cluster", "edge-a", `{"services":[{"name":"web","ports":[{"name":"http","port":80}]}]}`}, 0,
			[]string{"1 entries kept, 0 rejected", "ok: service default/web cluster edge-a ports [http:80/TCP->80]"}},
		{"bad entries, with the plugin's reasons", []string{"--cluster", "edge-a", "--namespace", "shop",
			`{"services":[{"name":"Web"},{"name":"db","namespace":"other"},{"name":"x","cluster":"edge-b"},{"name":"ok"}]}`}, 1,
			[]string{"1 entries kept, 3 rejected", "rejected (invalid_name)", "rejected (namespace_mismatch)", "rejected (cluster_mismatch)", "ok: service shop/ok"}},
		{"not JSON", []string{"--cluster", "edge-a", `services: web`}, 1, []string{"rejected (json)"}},
		{"export without --cluster", []string{`{"services":[{"name":"web"}]}`}, 1, nil},
		{"import", []string{"--import", `{"services":[{"name":"web","namespace":"shop","alias":"shop-web"},{"name":"db","alias":"Bad"}]}`}, 1,
			[]string{"ok: service shop/web as alias shop-web", "rejected (invalid_name)"}},
		{"no value", nil, 2, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			rc := run(append([]string{"mcsctl", "validate"}, tc.args...), nil, &out, &errb)
			if rc != tc.rc {
				t.Fatalf("exit %d, want %d\n%s%s", rc, tc.rc, out.String(), errb.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}

func TestValidateManifest(t *testing.T) {
	manifest := `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata:
    name: backend-0
    labels: {multicluster.kubernetes.io/exporter: "true"}
    annotations:
      multicluster.kubernetes.io/export-services: '{"services":[{"name":"backend"},{"name":"backend"}]}'
  status: {podIP: 10.0.0.2}
---
apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: shop
  annotations:
    multicluster.kubernetes.io/import-services: '{"services":[{"name":"backend","namespace":"default","alias":"be"}]}'
---
apiVersion: v1
kind: Service
metadata: {name: ignored}
`
	var out, errb bytes.Buffer
	rc := run([]string{"mcsctl", "validate", "--cluster", "edge-a", "-f", "-"}, strings.NewReader(manifest), &out, &errb)
	if rc != 1 {
		t.Fatalf("exit %d\n%s%s", rc, out.String(), errb.String())
	}
	for _, w := range []string{
		"Pod default/backend-0:", "rejected (duplicate)", "note: ready=false",
		"Pod shop/client:", "ok: service default/backend as alias be",
	} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
	// The exporter label is what the plugin's watch selects on.
	noLabel := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","annotations":{"` + annotation.ExportAnnotation + `":"{\"services\":[{\"name\":\"web\"}]}"}}}`
	out.Reset()
	if rc := run([]string{"mcsctl", "validate", "--cluster", "edge-a", "-f", "-"}, strings.NewReader(noLabel), &out, &errb); rc != 1 ||
		!strings.Contains(out.String(), "no label "+annotation.ExporterLabel) {
		t.Errorf("unlabelled Pod: exit %d\n%s", rc, out.String())
	}
	if _, _, err := readManifest("-", strings.NewReader("kind: ConfigMap\n")); err == nil {
		t.Error("a manifest without Pods, Services or ServiceExports was accepted")
	}
}
