package main

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	v1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// runValidate checks an annotation value, or the Pods of a manifest, with
// the parser the plugin and the annotator use, and prints every entry kept
// and every rejection with its reason (the metric label value). The exit
// status is 1 when anything was rejected.
func runValidate(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flags("validate", stderr)
	file := fs.String("f", "", "a Pod manifest (YAML or JSON, several documents allowed; - for stdin)")
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
		pods, err := readPods(*file, stdin)
		if err != nil {
			return err
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
		return fmt.Sprintf("service %s/%s cluster %s ports [%s]", e.Namespace, e.Name, e.Cluster, strings.Join(ports, " "))
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

// readPods reads the Pods of a manifest: YAML or JSON documents, each a Pod
// or a List of them; other kinds are skipped.
func readPods(file string, stdin io.Reader) ([]*v1.Pod, error) {
	var r io.Reader = stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(io.LimitReader(r, maxManifest), 4096)
	var pods []*v1.Pod
	for {
		var doc struct {
			Kind  string   `json:"kind"`
			Items []v1.Pod `json:"items"`
			v1.Pod
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		switch doc.Kind {
		case "Pod":
			p := doc.Pod
			pods = append(pods, &p)
		case "List", "PodList":
			for i := range doc.Items {
				pods = append(pods, &doc.Items[i])
			}
		}
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("%s: no Pod in it", file)
	}
	return pods, nil
}
