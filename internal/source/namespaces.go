package source

import (
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
)

// The list of exporting namespaces a cluster publishes for its peers (its
// annotator keeps it; see annotator/grants.go): a ConfigMap whose key
// ExportingNamespacesKey holds the names of the namespaces with at least one
// exported Service, one a line, sorted. A peer's credential may read this
// ConfigMap and, in each namespace listed, Pods.
const (
	ExportingNamespacesNamespace = "kube-system"
	ExportingNamespacesName      = "mcsannotations-exporting-namespaces"
	ExportingNamespacesKey       = "namespaces"
)

// FormatNamespaces is the value of ExportingNamespacesKey for namespaces:
// sorted, one a line.
func FormatNamespaces(namespaces []string) string {
	ns := slices.Sorted(slices.Values(namespaces))
	ns = slices.Compact(ns)
	if len(ns) == 0 {
		return ""
	}
	return strings.Join(ns, "\n") + "\n"
}

// maxIgnored bounds the lines ParseNamespaces returns as ignored.
const maxIgnored = 10

// ParseNamespaces reads the value of ExportingNamespacesKey: the namespace
// names, sorted and without repeats, and the lines that are no namespace
// name (each clipped; the first maxIgnored).
func ParseNamespaces(v string) (namespaces, ignored []string) {
	for line := range strings.Lines(v) {
		line = strings.TrimSpace(line)
		switch {
		case line == "":
		case len(validation.IsDNS1123Label(line)) > 0:
			if len(ignored) < maxIgnored {
				ignored = append(ignored, annotation.Clip(line))
			}
		default:
			namespaces = append(namespaces, line)
		}
	}
	slices.Sort(namespaces)
	return slices.Compact(namespaces), ignored
}

// nsList is what the store of the list keeps of its ConfigMap.
type nsList struct {
	ingest.Meta
	namespaces, ignored []string
}

// GetObjectKind and DeepCopyObject make nsList a runtime.Object.
func (l *nsList) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (l *nsList) DeepCopyObject() runtime.Object {
	c := *l
	return &c // the slices are never changed
}

// transformList is the list reflector's transform.
func transformList(cm *v1.ConfigMap) (runtime.Object, error) {
	l := &nsList{Meta: ingest.MetaOf(cm)}
	l.namespaces, l.ignored = ParseNamespaces(cm.Data[ExportingNamespacesKey])
	return l, nil
}

// scope is the Scope that l asks for: its namespaces, or cluster-wide when
// there are more than max.
func (l *nsList) scope(max int) Scope {
	if len(l.namespaces) > max {
		return Scope{ClusterWide: true, Why: WhyTooMany, Ignored: l.ignored}
	}
	return Scope{Namespaces: l.namespaces, Ignored: l.ignored}
}
