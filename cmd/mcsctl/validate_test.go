package main

import (
	"bytes"
	"strings"
	"testing"
)

// validate -f checks the stale-endpoints annotation of a manifest's Services
// and ServiceExports as the annotator reads it (an unknown value is a
// rejection: exit status 1, the reason the annotator counts, what it does
// instead), and shows an export entry's policy.
func TestValidateStaleEndpoints(t *testing.T) {
	const svc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: shop\n  annotations:\n    multicluster.kubernetes.io/stale-endpoints: %s\n"
	const se = "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceExport\nmetadata:\n  name: db\n  annotations:\n    multicluster.kubernetes.io/stale-endpoints: %s\n"
	sub := func(f, v string) string { return strings.Replace(f, "%s", v, 1) }
	for _, c := range []struct {
		name     string
		manifest string
		rc       int
		want     []string
		not      []string
	}{
		{"a Service's drop-after", sub(svc, "drop-after=30s"), 0,
			[]string{"Service shop/web:", "stale-endpoints: ok: drop-after=30s (consumers drop"}, []string{"rejected"}},
		{"a Service's serve", sub(svc, "serve"), 0, []string{"ok: serve (consumers serve"}, nil},
		{"a ServiceExport's drop-if-local-after, in the default namespace", sub(se, "drop-if-local-after=2m"), 0,
			[]string{"ServiceExport default/db:", "ok: drop-if-local-after=2m0s (consumers with ready endpoints of their own drop"}, nil},
		{"a Service's unknown word", sub(svc, "keep"), 1,
			[]string{"rejected (stale_endpoints)", `"keep": want serve, drop-after=DURATION or drop-if-local-after=DURATION`, "without a stale policy"}, []string{"ok:"}},
		{"a ServiceExport's duration without a unit", sub(se, `"drop-after=30"`), 1,
			[]string{"ServiceExport default/db:", "rejected (stale_endpoints)", "drop-after takes a duration"}, nil},
		{"a grace past the bound, in a List", "kind: List\nitems:\n- " + strings.ReplaceAll(sub(svc, "drop-after=8d"), "\n", "\n  "), 1,
			[]string{"Service shop/web:", "rejected (stale_endpoints)"}, nil},
		{"a Service without the annotation", "apiVersion: v1\nkind: Service\nmetadata:\n  name: quiet\n", 0, nil, []string{"quiet"}},
		{"an export entry's policy", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"shop","labels":{"multicluster.kubernetes.io/exporter":"true"},` +
			`"annotations":{"multicluster.kubernetes.io/export-services":"{\"services\":[{\"name\":\"web\",\"staleEndpoints\":\"DropIfLocal\",\"staleGraceSeconds\":45}]}"}},` +
			`"status":{"podIP":"10.0.0.1","conditions":[{"type":"Ready","status":"True"}]}}`, 0,
			[]string{"ok: service shop/web cluster edge-a ports [] stale-endpoints drop-if-local-after=45s"}, nil},
		{"an export entry's unknown policy", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"multicluster.kubernetes.io/exporter":"true"},` +
			`"annotations":{"multicluster.kubernetes.io/export-services":"{\"services\":[{\"name\":\"web\",\"staleEndpoints\":\"Later\"}]}"}}}`, 1,
			[]string{`rejected (invalid_service)`, `staleEndpoints "Later": must be Serve, Drop or DropIfLocal`}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			rc := run([]string{"mcsctl", "validate", "--cluster", "edge-a", "-f", "-"}, strings.NewReader(c.manifest), &out, &errb)
			if rc != c.rc {
				t.Errorf("exit %d, want %d\n%s%s", rc, c.rc, out.String(), errb.String())
			}
			for _, w := range c.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range c.not {
				if strings.Contains(out.String(), w) {
					t.Errorf("output has %q:\n%s", w, out.String())
				}
			}
		})
	}
}
