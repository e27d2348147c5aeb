package annotation

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The JSON shapes as they arrive. Numbers decode into int64 so that values
// out of the int32 range are seen and rejected rather than wrapped.
type envelope struct {
	Services []json.RawMessage `json:"services"`
}

type rawPort struct {
	Name       string `json:"name"`
	Port       int64  `json:"port"`
	TargetPort int64  `json:"targetPort"`
	Protocol   string `json:"protocol"`
	// AppProtocol is checked as the Service API does (a qualified name).
	AppProtocol string `json:"appProtocol"`
}

type rawExport struct {
	Name      string    `json:"name"`
	Namespace string    `json:"namespace"`
	Cluster   string    `json:"cluster"`
	Ports     []rawPort `json:"ports"`
	Allowed   []string  `json:"allowedNamespaces"`
	Service
}

type rawImport struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Cluster   string `json:"cluster"`
	Alias     string `json:"alias"`
}

// ParseExports parses the export-services annotation of a Pod in namespace
// podNamespace, read from the cluster sourceCluster. Entries default their
// namespace to podNamespace and their cluster to sourceCluster; an entry that
// names another namespace or cluster is rejected (a Pod may only back
// services of its own namespace, in the cluster it runs in).
func ParseExports(raw, podNamespace, sourceCluster string) ([]Export, []Rejection) {
	entries, rej := split(raw)
	if entries == nil {
		return nil, rej
	}
	out := make([]Export, 0, len(entries))
	seen := make(map[string]struct{}, len(entries))
	for i, msg := range entries {
		var e rawExport
		if err := decodeStrict(msg, &e); err != nil {
			rej = append(rej, Rejection{i, ReasonJSON, err.Error()})
			continue
		}
		if e.Namespace == "" {
			e.Namespace = podNamespace
		}
		if e.Cluster == "" {
			e.Cluster = sourceCluster
		}
		if r, bad := checkService(e.Name, e.Namespace, e.Cluster); bad {
			r.Index = i
			rej = append(rej, r)
			continue
		}
		if e.Namespace != podNamespace {
			rej = append(rej, Rejection{i, ReasonNamespaceOutside,
				fmt.Sprintf("service %s/%s: a Pod in namespace %q may only export services of its own namespace", e.Namespace, e.Name, podNamespace)})
			continue
		}
		if e.Cluster != sourceCluster {
			rej = append(rej, Rejection{i, ReasonClusterOutside,
				fmt.Sprintf("service %s/%s claims cluster %q but was read from cluster %q", e.Namespace, e.Name, e.Cluster, sourceCluster)})
			continue
		}
		ports, dropped, r, bad := checkPorts(e.Ports)
		if bad {
			r.Index = i
			r.Detail = "service " + e.Namespace + "/" + e.Name + ": " + r.Detail
			rej = append(rej, r)
			continue
		}
		for _, d := range dropped {
			d.Index = i
			d.Detail = "service " + e.Namespace + "/" + e.Name + ": " + d.Detail
			rej = append(rej, d)
		}
		if r, bad := checkServiceFields(&e.Service); bad {
			r.Index = i
			r.Detail = "service " + e.Namespace + "/" + e.Name + ": " + r.Detail
			rej = append(rej, r)
			continue
		}
		allowed, err := CheckAllowed(e.Allowed)
		if err != nil {
			rej = append(rej, Rejection{i, ReasonNamespace, "service " + e.Namespace + "/" + e.Name + ": " + err.Error()})
			continue
		}
		key := e.Namespace + "/" + e.Name
		if _, dup := seen[key]; dup {
			rej = append(rej, Rejection{i, ReasonDuplicate, "service " + key + " is listed more than once"})
			continue
		}
		seen[key] = struct{}{}
		out = append(out, Export{Name: e.Name, Namespace: e.Namespace, Cluster: e.Cluster, Ports: ports, Allowed: allowed, Service: e.Service})
	}
	return out, rej
}

// ParseImports parses the import-services annotation of a Pod in namespace
// podNamespace. Namespace defaults to podNamespace; an empty cluster means any
// cluster. A consumer may import services of other namespaces: an import only
// shapes what that Pod itself resolves.
func ParseImports(raw, podNamespace string) ([]Import, []Rejection) {
	entries, rej := split(raw)
	if entries == nil {
		return nil, rej
	}
	out := make([]Import, 0, len(entries))
	seen := make(map[string]struct{}, len(entries))
	aliases := make(map[string]struct{}, len(entries))
	for i, msg := range entries {
		var e rawImport
		if err := decodeStrict(msg, &e); err != nil {
			rej = append(rej, Rejection{i, ReasonJSON, err.Error()})
			continue
		}
		if e.Namespace == "" {
			e.Namespace = podNamespace
		}
		cluster := e.Cluster
		if cluster == "" {
			cluster = "x" // "any cluster" is valid; check the rest
		}
		if r, bad := checkService(e.Name, e.Namespace, cluster); bad {
			r.Index = i
			rej = append(rej, r)
			continue
		}
		if e.Alias != "" {
			if errs := validation.IsDNS1123Label(e.Alias); len(errs) > 0 {
				rej = append(rej, Rejection{i, ReasonName, fmt.Sprintf("alias %q: %s", Clip(e.Alias), strings.Join(errs, "; "))})
				continue
			}
			if _, dup := aliases[e.Alias]; dup {
				rej = append(rej, Rejection{i, ReasonDuplicate, "alias " + e.Alias + " is listed more than once"})
				continue
			}
		}
		key := e.Namespace + "/" + e.Name + "/" + e.Cluster + "/" + e.Alias
		if _, dup := seen[key]; dup {
			rej = append(rej, Rejection{i, ReasonDuplicate, "import " + e.Namespace + "/" + e.Name + " is listed more than once"})
			continue
		}
		seen[key] = struct{}{}
		if e.Alias != "" {
			aliases[e.Alias] = struct{}{}
		}
		out = append(out, Import{Name: e.Name, Namespace: e.Namespace, Cluster: e.Cluster, Alias: e.Alias})
	}
	return out, rej
}

// CheckAllowed checks a list of allowed namespaces (namespace names, or "*")
// and returns it in its normal form: sorted, without duplicates, just "*"
// when it holds "*", nil when empty.
func CheckAllowed(in []string) ([]string, error) {
	if len(in) == 0 {
		return nil, nil
	}
	if len(in) > MaxAllowed {
		return nil, fmt.Errorf("%d allowed namespaces is more than the limit of %d", len(in), MaxAllowed)
	}
	out := make([]string, 0, len(in))
	for _, ns := range in {
		if ns == AllNamespaces {
			return []string{AllNamespaces}, nil
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("allowed namespace %q: %s", Clip(ns), strings.Join(errs, "; "))
		}
		out = append(out, ns)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// split checks the size and the envelope and returns the raw entries. A nil
// slice with a rejection means the annotation is unusable as a whole.
func split(raw string) ([]json.RawMessage, []Rejection) {
	if len(raw) > MaxBytes {
		return nil, []Rejection{{-1, ReasonSize, fmt.Sprintf("%d bytes is more than the limit of %d", len(raw), MaxBytes)}}
	}
	var env envelope
	if err := decodeStrict([]byte(raw), &env); err != nil {
		return nil, []Rejection{{-1, ReasonJSON, err.Error()}}
	}
	if len(env.Services) > MaxServices {
		return nil, []Rejection{{-1, ReasonTooMany, fmt.Sprintf("%d entries is more than the limit of %d", len(env.Services), MaxServices)}}
	}
	if env.Services == nil {
		env.Services = []json.RawMessage{}
	}
	return env.Services, nil
}

// decodeStrict decodes one JSON value and refuses trailing data. Unknown
// fields are allowed, so that newer writers can add fields.
func decodeStrict(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("invalid JSON: %s", Clip(err.Error()))
	}
	// One value only: More reports false before a stray '}' or ']', so ask
	// for the next token, which must be the end of the input.
	if _, err := d.Token(); err != io.EOF {
		return fmt.Errorf("invalid JSON: data after the value")
	}
	return nil
}

func checkService(name, namespace, cluster string) (Rejection, bool) {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return Rejection{Reason: ReasonName, Detail: fmt.Sprintf("service name %q: %s", Clip(name), strings.Join(errs, "; "))}, true
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return Rejection{Reason: ReasonNamespace, Detail: fmt.Sprintf("namespace %q: %s", Clip(namespace), strings.Join(errs, "; "))}, true
	}
	if !ValidClusterID(cluster) {
		return Rejection{Reason: ReasonCluster, Detail: fmt.Sprintf("cluster %q: must be an RFC 1123 subdomain of at most %d characters", Clip(cluster), MaxClusterIDLen)}, true
	}
	return Rejection{}, false
}

// ValidClusterID reports whether id is usable as a cluster ID: an RFC 1123
// subdomain of fewer than 128 characters (KEP-2149).
func ValidClusterID(id string) bool {
	return len(id) <= MaxClusterIDLen && len(validation.IsDNS1123Subdomain(id)) == 0
}

// checkPorts validates ports and applies the defaults: protocol TCP,
// targetPort = port. Port names, when given, follow the IANA service-name rule
// Kubernetes applies to container ports (at most 15 characters, lower case
// letters, digits and single inner dashes, at least one letter: they become
// the _<port> label of SRV names, RFC 6335) and are unique; (port, protocol)
// pairs are unique. A name that breaks the IANA rule is dropped, not the
// entry: older annotators wrote any DNS label, and rejecting the entry would
// make such a service vanish after an upgrade. The port stays, unnamed (its
// addresses still answer; no SRV name), and dropped lists one
// ReasonPortName rejection per name.
func checkPorts(in []rawPort) (ports []Port, dropped []Rejection, r Rejection, bad bool) {
	if len(in) > MaxPortsPerExport {
		return nil, nil, Rejection{Reason: ReasonTooMany, Detail: fmt.Sprintf("%d ports is more than the limit of %d", len(in), MaxPortsPerExport)}, true
	}
	if len(in) == 0 {
		return nil, nil, Rejection{}, false
	}
	out := make([]Port, 0, len(in))
	for j, p := range in {
		if p.Protocol == "" {
			p.Protocol = TCP
		}
		if p.TargetPort == 0 {
			p.TargetPort = p.Port
		}
		switch {
		case p.Port < 1 || p.Port > 65535:
			return nil, nil, Rejection{Reason: ReasonPort, Detail: fmt.Sprintf("port %d: must be 1-65535", p.Port)}, true
		case p.TargetPort < 1 || p.TargetPort > 65535:
			return nil, nil, Rejection{Reason: ReasonPort, Detail: fmt.Sprintf("targetPort %d: must be 1-65535", p.TargetPort)}, true
		case p.Protocol != TCP && p.Protocol != UDP && p.Protocol != SCTP:
			return nil, nil, Rejection{Reason: ReasonProtocol, Detail: fmt.Sprintf("protocol %q: must be TCP, UDP or SCTP", Clip(p.Protocol))}, true
		}
		if p.Name != "" {
			if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
				dropped = append(dropped, Rejection{Reason: ReasonPortName, Detail: fmt.Sprintf("port %d/%s: name %q dropped (no SRV name): %s", p.Port, p.Protocol, Clip(p.Name), strings.Join(errs, "; "))})
				p.Name = ""
			}
		}
		if p.AppProtocol != "" {
			if errs := validation.IsQualifiedName(p.AppProtocol); len(errs) > 0 {
				return nil, nil, Rejection{Reason: ReasonPort, Detail: fmt.Sprintf("appProtocol %q: %s", Clip(p.AppProtocol), strings.Join(errs, "; "))}, true
			}
		}
		for _, q := range out[:j] {
			if (p.Name != "" && q.Name == p.Name) || (q.Port == int32(p.Port) && q.Protocol == p.Protocol) {
				return nil, nil, Rejection{Reason: ReasonDuplicate, Detail: fmt.Sprintf("port %d/%s (%q) is listed more than once", p.Port, p.Protocol, p.Name)}, true
			}
		}
		out = append(out, Port{Name: p.Name, Port: int32(p.Port), TargetPort: int32(p.TargetPort), Protocol: p.Protocol, AppProtocol: p.AppProtocol})
	}
	return out, dropped, Rejection{}, false
}

// Clip shortens a hostile value before it reaches a log line.
func Clip(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
