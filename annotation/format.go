package annotation

import (
	"encoding/json"
	"fmt"
)

// The JSON shapes as the annotator writes them: cluster is left out when
// empty (the reader defaults it to the cluster it read the Pod from).
type outExport struct {
	Name      string   `json:"name"`
	Namespace string   `json:"namespace"`
	Cluster   string   `json:"cluster,omitempty"`
	Ports     []Port   `json:"ports,omitempty"`
	Allowed   []string `json:"allowedNamespaces,omitempty"`
	Service
}

type outEnvelope struct {
	Services []outExport `json:"services"`
}

// FormatExports writes exports as the value of the export-services
// annotation, in the order given, and checks it the way a reader will (see
// CheckExports). An error says what a reader would reject.
func FormatExports(exports []Export, podNamespace, sourceCluster string) (string, error) {
	raw, err := MarshalExports(exports)
	if err != nil {
		return "", err
	}
	if err := CheckExports(raw, len(exports), podNamespace, sourceCluster); err != nil {
		return "", err
	}
	return raw, nil
}

// MarshalExports writes exports as the value of the export-services
// annotation, in the order given, unchecked.
func MarshalExports(exports []Export) (string, error) {
	env := outEnvelope{Services: make([]outExport, len(exports))}
	for i, e := range exports {
		env.Services[i] = outExport{Name: e.Name, Namespace: e.Namespace, Cluster: e.Cluster, Ports: e.Ports, Allowed: e.Allowed, Service: e.Service}
	}
	b, err := json.Marshal(env)
	return string(b), err
}

// CheckExports checks a value written from n exports the way a reader will:
// it must parse back, entry for entry, for a Pod of podNamespace read from
// sourceCluster (when the exports leave Cluster empty, any valid cluster
// ID). The error is a *FormatError with the reader's first rejection.
func CheckExports(raw string, n int, podNamespace, sourceCluster string) error {
	back, rej := ParseExports(raw, podNamespace, sourceCluster)
	if len(rej) > 0 {
		return &FormatError{rej[0]}
	}
	if len(back) != n {
		return fmt.Errorf("a reader would read %d entries, not %d", len(back), n)
	}
	return nil
}

// FormatError is what FormatExports returns when a reader would reject the
// value: the first rejection a reader would log.
type FormatError struct{ Rejection Rejection }

func (e *FormatError) Error() string { return "a reader would reject " + e.Rejection.String() }
