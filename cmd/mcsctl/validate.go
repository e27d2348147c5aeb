package main

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// runValidate checks an annotation value, or the Pods of a manifest, with
// the parser the plugin and the annotator use, and prints every entry kept
// and every rejection with its reason (the metric label value); of the
// manifest's Services and ServiceExports, the stale-endpoints annotation as
// the annotator reads it. The exit status is 1 when anything was rejected.
func runValidate(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flags("validate", stderr)
	file := fs.String("f", "", "a manifest of Pods, Services, ServiceExports (YAML or JSON, several documents allowed; - for stdin)")
	imports := fs.Bool("import", false, "VALUE is an import-services value (default: export-services)")
	namespace := fs.String("namespace", "", "the Pod's namespace for VALUE, or for manifests without one (default \"default\")")
	cluster := fs.String("cluster", "", "the cluster the Pod is read from (needed for export annotations)")
	verify := fs.String("verify", "", "a verify folder (<cluster>.pub files): also check the export signature, as the plugin's verify does")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if (*file == "") == (len(pos) != 1) || (*file != "" && len(pos) > 0) {
		fmt.Fprintln(stderr, "usage: mcsctl validate [--import] [--namespace NS] [--cluster ID] VALUE\n       mcsctl validate [--cluster ID] [--verify DIR] -f pod.yaml")
		return errUsage
	}
	if *cluster != "" && !annotation.ValidClusterID(*cluster) {
		return fmt.Errorf("--cluster %q: must be an RFC 1123 subdomain of at most %d characters", *cluster, annotation.MaxClusterIDLen)
	}
	var keys map[string]ed25519.PublicKey
	if *verify != "" {
		if keys, err = annotation.ReadPublicKeys(*verify); err != nil {
			return fmt.Errorf("verify %s: %w", *verify, err)
		}
	}
	ns := *namespace
	if ns == "" {
		ns = "default"
	}
	bad := false
	if *file == "" {
		if *imports {
			imps, rej := annotation.ParseImports(pos[0], ns)
			printEntries(stdout, "import", len(imps), imps, rej)
			bad = len(rej) > 0
		} else {
			if *cluster == "" {
				return errors.New("an export value is checked against the cluster it is read from: give --cluster ID")
			}
			exps, rej := annotation.ParseExports(pos[0], ns, *cluster)
			printEntries(stdout, "export", len(exps), exps, rej)
			bad = len(rej) > 0
		}
	} else {
		pods, exports, err := readManifest(*file, stdin)
		if err != nil {
			return err
		}
		for _, o := range exports {
			if o.Meta.Namespace == "" {
				o.Meta.Namespace = ns
			}
			if validateExport(stdout, o) {
				bad = true
			}
		}
		for _, pod := range pods {
			if pod.Namespace == "" {
				pod.Namespace = ns
			}
			if validatePod(stdout, pod, *cluster, keys) {
				bad = true
			}
		}
	}
	if bad {
		return errFound
	}
	return nil
}

// validatePod prints what the plugin and the clients watcher make of pod and
// reports whether anything was rejected.
func validatePod(w io.Writer, pod *v1.Pod, cluster string, keys map[string]ed25519.PublicKey) (bad bool) {
	fmt.Fprintf(w, "Pod %s/%s:\n", pod.Namespace, pod.Name)
	_, exports := pod.Annotations[annotation.ExportAnnotation]
	rawImp, imports := pod.Annotations[annotation.ImportAnnotation]
	if !exports && !imports {
		fmt.Fprintf(w, "  no %s or %s annotation: nothing to check\n", annotation.ExportAnnotation, annotation.ImportAnnotation)
		return false
	}
	if exports {
		if pod.Labels[annotation.ExporterLabel] != annotation.LabelValue {
			fmt.Fprintf(w, "  warning: no label %s=%s: the plugin watches only Pods with it, so it never sees this one (the annotator sets both)\n",
				annotation.ExporterLabel, annotation.LabelValue)
			bad = true
		}
		switch {
		case cluster == "":
			fmt.Fprintln(w, "  export annotation: not checked: give --cluster ID (the cluster this Pod runs in)")
			bad = true
		default:
			var key ed25519.PublicKey
			if keys != nil {
				if key = keys[cluster]; key == nil {
					fmt.Fprintf(w, "  export annotation: refused: the verify folder has no %s%s (the plugin refuses to start without it)\n", cluster, annotation.KeySuffix)
					bad = true
					break
				}
			}
			rec, rej := source.Record(cluster, key, pod)
			printEntries(w, "export", len(rec.Exports), rec.Exports, rej)
			if len(rec.IPs) == 0 || !rec.Ready {
				fmt.Fprintf(w, "  note: ready=%t, IPs %v: a Pod answers only when ready and with an IP\n", rec.Ready, rec.IPs)
			}
			bad = bad || len(rej) > 0
		}
	}
	if imports {
		imps, rej := annotation.ParseImports(rawImp, pod.Namespace)
		printEntries(w, "import", len(imps), imps, rej)
		bad = bad || len(rej) > 0
	}
	return bad
}

// exportObject is a Service or a ServiceExport of a manifest: what the
// annotator reads of its annotations.
type exportObject struct {
	Kind string            `json:"kind"`
	Meta metav1.ObjectMeta `json:"metadata"`
}

// validateExport prints what the annotator makes of the stale-endpoints
// annotation of a Service or ServiceExport, and reports whether it refuses
// it.
func validateExport(w io.Writer, o exportObject) (bad bool) {
	raw, ok := o.Meta.Annotations[annotation.StaleEndpointsAnnotation]
	if !ok {
		return false
	}
	fmt.Fprintf(w, "%s %s/%s:\n", o.Kind, o.Meta.Namespace, o.Meta.Name)
	policy, grace, err := annotation.ParseStaleEndpoints(raw)
	if err != nil {
		fmt.Fprintf(w, "  %s: rejected (stale_endpoints): %v\n", annotation.StaleEndpointsAnnotation, err)
		fmt.Fprintln(w, "    the annotator exports the service without a stale policy (consumers serve its endpoints of an unreachable cluster, the default)")
		return true
	}
	fmt.Fprintf(w, "  %s: ok: %s\n", annotation.StaleEndpointsAnnotation, stalePolicyText(policy, grace))
	return false
}

// stalePolicyText says what consumers do with an entry's endpoints of a
// cluster they cannot reach.
func stalePolicyText(policy string, grace int32) string {
	v := annotation.FormatStaleEndpoints(policy, grace)
	switch policy {
	case annotation.StaleDrop:
		return v + " (consumers drop the endpoints of a cluster out of contact for longer)"
	case annotation.StaleDropIfLocal:
		return v + " (consumers with ready endpoints of their own drop those of a cluster out of contact for longer)"
	}
	return v + " (consumers serve the endpoints of an unreachable cluster as last seen)"
}

// printEntries prints the entries kept and the rejections.
func printEntries[T any](w io.Writer, kind string, n int, kept []T, rej []annotation.Rejection) {
	fmt.Fprintf(w, "  %s annotation: %d entries kept, %d rejected\n", kind, n, len(rej))
	for _, e := range kept {
		fmt.Fprintf(w, "    ok: %s\n", describe(e))
	}
	for _, r := range rej {
		fmt.Fprintf(w, "    rejected (%s): %s\n", r.Reason, r)
	}
}

func describe(e any) string {
	switch e := e.(type) {
	case annotation.Export:
		var ports []string
		for _, p := range e.Ports {
			s := fmt.Sprintf("%d/%s->%d", p.Port, p.Protocol, p.TargetPort)
			if p.Name != "" {
				s = p.Name + ":" + s
			}
			ports = append(ports, s)
		}
		s := fmt.Sprintf("service %s/%s cluster %s ports [%s]", e.Namespace, e.Name, e.Cluster, strings.Join(ports, " "))
		if e.StaleEndpoints != "" {
			s += " stale-endpoints " + annotation.FormatStaleEndpoints(e.StaleEndpoints, e.StaleGraceSeconds)
		}
		return s
	case annotation.Import:
		s := fmt.Sprintf("service %s/%s", e.Namespace, e.Name)
		if e.Cluster != "" {
			s += " from cluster " + e.Cluster
		}
		if e.Alias != "" {
			s += " as alias " + e.Alias
		}
		return s
	}
	return fmt.Sprint(e)
}

// maxManifest bounds what validate reads from a manifest.
const maxManifest = 16 << 20

// readManifest reads the Pods of a manifest, and the Services and
// ServiceExports (for their export annotations): YAML or JSON documents,
// each one of them or a List of them; other kinds are skipped.
func readManifest(file string, stdin io.Reader) ([]*v1.Pod, []exportObject, error) {
	var r io.Reader = stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, nil, err
		}
		defer f.Close()
		r = f
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(io.LimitReader(r, maxManifest), 4096)
	var pods []*v1.Pod
	var exports []exportObject
	add := func(kind string, raw json.RawMessage) error {
		switch kind {
		case "Pod":
			p := new(v1.Pod)
			if err := json.Unmarshal(raw, p); err != nil {
				return err
			}
			pods = append(pods, p)
		case "Service", "ServiceExport":
			var o exportObject
			if err := json.Unmarshal(raw, &o); err != nil {
				return err
			}
			exports = append(exports, o)
		}
		return nil
	}
	for {
		var doc struct {
			Kind  string            `json:"kind"`
			Items []json.RawMessage `json:"items"`
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", file, err)
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", file, err)
		}
		items := []json.RawMessage{raw}
		if strings.HasSuffix(doc.Kind, "List") {
			items = doc.Items
		}
		for _, it := range items {
			var k struct {
				Kind string `json:"kind"`
			}
			if err := json.Unmarshal(it, &k); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", file, err)
			}
			if doc.Kind == "PodList" && k.Kind == "" {
				k.Kind = "Pod" // a typed list's items may leave their kind out
			}
			if err := add(k.Kind, it); err != nil {
				return nil, nil, fmt.Errorf("%s: %s: %w", file, k.Kind, err)
			}
		}
	}
	if len(pods) == 0 && len(exports) == 0 {
		return nil, nil, fmt.Errorf("%s: no Pod, Service or ServiceExport in it", file)
	}
	return pods, exports, nil
}
