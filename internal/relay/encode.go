package relay

import (
	"cmp"
	"slices"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Encode is the Slice of the records behind one EndpointSlice (one cluster,
// one namespace): each record's name, UID, export annotation (the distinct
// ones listed once, in the order they first appear), endpoint statement and
// signature, from its store.Proof, the Pods sorted by name so that the same
// records give the same bytes. A record whose origin states no endpoint gets
// one from the record: its addresses (at most two), hostname and readiness,
// Seq 1, unsigned. A record without a Proof (its source keeps none) or named
// twice is left out; skipped counts those. Each record's path is the one it
// came with (see EncodeVia).
func Encode(pods []*store.Pod) (s Slice, skipped int) { return EncodeVia(pods, "") }

// EncodeVia is Encode by hub (a cluster ID; "" writes no path): each
// record's path is the one it came with (its Proof.Path, empty when read
// from its origin) and hub, and a record whose path names MaxPath hubs
// already is left out too (counted in skipped): the hub does not relay it
// further.
func EncodeVia(pods []*store.Pod, hub string) (s Slice, skipped int) {
	pods = slices.Clone(pods)
	slices.SortFunc(pods, func(a, b *store.Pod) int { return cmp.Compare(a.Name, b.Name) })
	index := map[string]int{}
	s.Exports, s.Pods = []string{}, make([]Pod, 0, len(pods))
	var paths []string // each Pod's path, joined
	for i, p := range pods {
		if p.Proof == nil || i > 0 && pods[i-1].Name == p.Name {
			skipped++
			continue
		}
		path := p.Proof.Path
		if hub != "" {
			if len(SplitPath(path)) >= MaxPath {
				skipped++
				continue
			}
			path = JoinPath(append(SplitPath(path), hub))
		}
		x, ok := index[p.Proof.Export]
		if !ok {
			x = len(s.Exports)
			index[p.Proof.Export] = x
			s.Exports = append(s.Exports, p.Proof.Export)
		}
		stmt, sig := Statement(p)
		s.Pods = append(s.Pods, Pod{Name: p.Name, UID: p.Proof.UID, Export: x, Endpoint: stmt, Signature: sig})
		paths = append(paths, path)
	}
	if slices.ContainsFunc(paths, func(p string) bool { return p != "" }) {
		pindex := map[string]int{}
		for i, path := range paths {
			x, ok := pindex[path]
			if !ok {
				x = len(s.Paths)
				pindex[path] = x
				s.Paths = append(s.Paths, append([]string{}, SplitPath(path)...))
			}
			s.Pods[i].Path = x
		}
	}
	return s, skipped
}

// Statement is the endpoint statement and signature a hub relays for a
// record with a Proof: the origin's, else one stated from the record (Seq 1,
// no signature), which a reader with verify refuses.
func Statement(p *store.Pod) (endpoint, signature string) {
	if p.Proof != nil && p.Proof.Endpoint != "" {
		return p.Proof.Endpoint, p.Proof.EndpointSignature
	}
	e := annotation.Endpoint{Hostname: p.Hostname, Ready: p.Ready, Seq: 1}
	for _, a := range p.IPs[:min(len(p.IPs), 2)] {
		e.IPs = append(e.IPs, a.String())
	}
	return annotation.FormatEndpoint(e), ""
}

// Annotation is SliceAnnotation's value for the records (Format(Encode)),
// and whether it is within MaxSliceBytes: a hub that gets false splits the
// records over more slices. One record always fits: its export annotation
// is at most annotation.MaxBytes, its statement annotation.MaxEndpointBytes
// and its signature a few hundred bytes (the source keeps none larger), and
// JSON escaping at most doubles them.
func Annotation(pods []*store.Pod) (value string, fits bool, skipped int) {
	return AnnotationVia(pods, "")
}

// AnnotationVia is Annotation by hub (see EncodeVia).
func AnnotationVia(pods []*store.Pod, hub string) (value string, fits bool, skipped int) {
	s, skipped := EncodeVia(pods, hub)
	value = Format(s)
	return value, len(value) <= MaxSliceBytes, skipped
}
