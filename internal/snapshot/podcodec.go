package snapshot

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"unsafe"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// A persisted record starts with a version byte: a codec change gets a new
// one, and records with an unknown one are skipped rather than misread.
const (
	recordJSON    = 'j' // JSON of Pod; still read, no longer written
	recordBinary  = 'b' // the compact form below; about ten times faster to read
	recordAllowed = 'c' // the compact form with each export's allowed namespaces
	recordService = 'd' // 'c' with each port's appProtocol and each export's Service fields
	recordStale   = 'e' // 'd' with each export's stale policy
)

var protocols = [...]string{annotation.TCP, annotation.UDP, annotation.SCTP}

// EncodePod is the persisted form of a record:
//
//	'b' cluster namespace name uid hostname ready(1 byte)
//
// (uid is written empty and skipped when read: records have no UID now.)
//
//	n-ips { len(1 byte: 4 or 16) bytes }
//	n-exports { name namespace cluster n-ports { name port targetPort protocol(1 byte) } }
//
// Strings are a uvarint length and bytes; counts and ports are uvarints.
// A record with allowed namespaces is 'c' and has, after each export's
// ports, n-allowed { namespace }: records without any stay 'b', readable by
// older versions. A record with any of the Service fields of an export
// (annotation.Service) or a port's appProtocol is 'd': 'c' with each port's
// appProtocol after its protocol, and after each export's allowed namespaces
//
//	type exportedAt sessionAffinity timeout internalTrafficPolicy
//	trafficDistribution n-labels { key value } n-annotations { key value }
//
// (annotation values may be up to annotation.MaxBytes long). A record with
// the stale policy of an export (annotation.Service.StaleEndpoints) is 'e':
// 'd' with, after each export's Service fields,
//
//	staleEndpoints staleGraceSeconds
//
// Each record is written in the oldest form that holds it, so that a record
// without the newer fields stays readable by the versions before them (which
// skip a record of a form they do not know: the plugin lists it again).
func EncodePod(p *store.Pod) ([]byte, error) {
	b := make([]byte, 0, 128)
	version := byte(recordBinary)
	for _, e := range p.Exports {
		if len(e.Allowed) > 0 {
			version = max(version, recordAllowed)
		}
		if e.StaleEndpoints != "" || e.StaleGraceSeconds != 0 {
			version = max(version, recordStale)
		} else if hasServiceFields(&e) {
			version = max(version, recordService)
		}
	}
	b = append(b, version)
	for _, s := range []string{p.Cluster, p.Namespace, p.Name, "", p.Hostname} {
		b = appendString(b, s)
	}
	ready := byte(0)
	if p.Ready {
		ready = 1
	}
	b = append(b, ready)
	b = appendAddrs(b, p.IPs)
	b = binary.AppendUvarint(b, uint64(len(p.Exports)))
	for _, e := range p.Exports {
		b = appendString(b, e.Name)
		b = appendString(b, e.Namespace)
		b = appendString(b, e.Cluster)
		b = binary.AppendUvarint(b, uint64(len(e.Ports)))
		for _, pt := range e.Ports {
			proto := -1
			for i, name := range protocols {
				if pt.Protocol == name {
					proto = i
				}
			}
			if proto < 0 {
				return nil, fmt.Errorf("port %d: unknown protocol %q", pt.Port, pt.Protocol)
			}
			b = appendString(b, pt.Name)
			b = binary.AppendUvarint(b, uint64(pt.Port))
			b = binary.AppendUvarint(b, uint64(pt.TargetPort))
			b = append(b, byte(proto))
			if version >= recordService {
				b = appendString(b, pt.AppProtocol)
			}
		}
		if version >= recordAllowed {
			b = binary.AppendUvarint(b, uint64(len(e.Allowed)))
			for _, ns := range e.Allowed {
				b = appendString(b, ns)
			}
		}
		if version >= recordService {
			b = appendService(b, &e.Service)
		}
		if version == recordStale {
			b = appendString(b, e.StaleEndpoints)
			b = binary.AppendUvarint(b, uint64(e.StaleGraceSeconds))
		}
	}
	return b, nil
}

// hasServiceFields reports whether e needs a 'd' record.
func hasServiceFields(e *annotation.Export) bool {
	var none annotation.Service
	if !e.Service.Equal(&none) {
		return true
	}
	for _, pt := range e.Ports {
		if pt.AppProtocol != "" {
			return true
		}
	}
	return false
}

func appendService(b []byte, s *annotation.Service) []byte {
	for _, v := range []string{s.Type, s.ExportedAt, s.SessionAffinity} {
		b = appendString(b, v)
	}
	b = binary.AppendUvarint(b, uint64(s.SessionAffinityTimeoutSeconds))
	b = appendString(b, s.InternalTrafficPolicy)
	b = appendString(b, s.TrafficDistribution)
	for _, m := range []map[string]string{s.Labels, s.Annotations} {
		b = binary.AppendUvarint(b, uint64(len(m)))
		for _, k := range slices.Sorted(maps.Keys(m)) {
			b = appendString(b, k)
			b = appendString(b, m[k])
		}
	}
	return b
}

// DecodePod reads a persisted record. It checks the shape, not the content:
// callers check the record against the source it was stored under.
func DecodePod(b []byte) (*store.Pod, error) { return (*PodDecoder)(nil).Decode(b) }

// PodDecoder reads many records and shares what they have in common: a
// service's Pods carry the same cluster, namespace and exports, so a table
// loaded through one PodDecoder holds one Common for them all. Records are
// immutable, so sharing is safe. A PodDecoder is for one goroutine; drop it
// when the load is done. The nil PodDecoder shares nothing.
//
// A PodDecoder also cuts records, names and addresses from chunks (about
// chunkRecords records' worth at a time) instead of allocating each: a cold
// start decodes 100,000 records, and three allocations a record were 300,000.
// A chunk lives while any record cut from it does, or any Common holding an
// export name cut from it, so after churn a few
// surviving records may keep a chunk alive: never more memory than the load
// allocated, and records decoded on their own (DecodePod, the informers')
// are unaffected.
type PodDecoder struct {
	strings map[string]string
	commons map[string][]*store.Common // by the encoded exports; one per cluster and namespace

	pods  []store.Pod  // unused records of the current chunk
	addrs []netip.Addr // unused addresses
	text  []byte       // names: appended to, never changed once cut
	chunk int          // records a chunk holds: chunkRecords, or fewer (NewPodDecoderFor)
}

// chunkRecords is how many records a PodDecoder's chunk holds (18 KB), with
// room for as many single addresses (6 KB) and names of 24 bytes.
const chunkRecords = 256

// NewPodDecoder returns a PodDecoder that shares equal values across records.
func NewPodDecoder() *PodDecoder { return NewPodDecoderFor(chunkRecords) }

// NewPodDecoderFor is NewPodDecoder for about n records: its chunks hold at
// most n, so that decoding a small cluster (an edge's snapshot holds a
// thousand origins of a few dozen records each) neither allocates nor keeps
// a whole chunk per cluster.
func NewPodDecoderFor(n int) *PodDecoder {
	return &PodDecoder{strings: map[string]string{}, commons: map[string][]*store.Common{}, chunk: min(max(n, 1), chunkRecords)}
}

// PodDecoders share at most this many distinct values of each kind; past it,
// values are copied (a hostile or huge file cannot grow the maps without
// bound).
const maxShared = 1 << 16

func (s *PodDecoder) str(b []byte) string {
	if s == nil {
		return string(b)
	}
	if v, ok := s.strings[string(b)]; ok { // no allocation for the lookup
		return v
	}
	v := string(b)
	if len(s.strings) < maxShared {
		s.strings[v] = v
	}
	return v
}

// newPod returns a zero record, cut from the current chunk.
func (s *PodDecoder) newPod() *store.Pod {
	if s == nil {
		return new(store.Pod)
	}
	if len(s.pods) == 0 {
		s.pods = make([]store.Pod, s.chunk)
	}
	p := &s.pods[0]
	s.pods = s.pods[1:]
	return p
}

// name returns a string of b's bytes, copied into the current chunk of
// names (read-only from then on).
func (s *PodDecoder) name(b []byte) string {
	if s == nil || len(b) == 0 {
		return string(b)
	}
	if cap(s.text)-len(s.text) < len(b) {
		s.text = make([]byte, 0, max(len(b), 24*s.chunk))
	}
	n := len(s.text)
	s.text = append(s.text, b...)
	return unsafe.String(&s.text[n], len(b))
}

// addrsFor returns room for n addresses, cut from the current chunk (its
// capacity ends at n, so nothing can append into the next record's). A
// record with more than a quarter chunk's worth gets its own, rather than
// leaving most of a chunk unused.
func (s *PodDecoder) addrsFor(n int) []netip.Addr {
	if s == nil || n > chunkRecords/4 {
		return make([]netip.Addr, 0, n)
	}
	if len(s.addrs) < n {
		s.addrs = make([]netip.Addr, max(n, s.chunk))
	}
	a := s.addrs[:0:n]
	s.addrs = s.addrs[n:]
	return a
}

// Decode is DecodePod, sharing values with the records decoded before.
func (s *PodDecoder) Decode(b []byte) (*store.Pod, error) {
	if len(b) == 0 {
		return nil, errors.New("empty record")
	}
	var p *store.Pod
	switch b[0] {
	case recordBinary, recordAllowed, recordService, recordStale:
		d := podReader{reader: reader{b: b[1:]}, shared: s, allowed: b[0] >= recordAllowed, service: b[0] >= recordService, stale: b[0] == recordStale}
		p = d.pod()
		if d.err != nil {
			return nil, d.err
		}
		if len(d.b) != 0 {
			return nil, errors.New("data after the record")
		}
	case recordJSON:
		p = new(store.Pod)
		if err := json.Unmarshal(b[1:], p); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown record version %q", b[0])
	}
	if p.Common == nil || p.Cluster == "" || p.Namespace == "" || p.Name == "" {
		return nil, errors.New("record without cluster, namespace or name")
	}
	return p, nil
}

// podReader reads the binary form; the first error sticks and every later
// read returns zero values.
type podReader struct {
	reader
	shared  *PodDecoder
	allowed bool // each export has its allowed namespaces
	service bool // each port its appProtocol, each export its Service fields
	stale   bool // each export its stale policy
}

// sharedString reads a string that many records repeat (cluster, namespace).
func (d *podReader) sharedString() string { return d.shared.str(d.stringBytes()) }

func (d *podReader) pod() *store.Pod {
	cluster, namespace := d.sharedString(), d.sharedString()
	p := d.shared.newPod()
	p.Name = d.shared.name(d.stringBytes())
	d.stringBytes() // the uid of older records
	p.Hostname = d.shared.name(d.stringBytes())
	if r := d.bytes(1); r != nil {
		p.Ready = r[0] == 1
	}
	if n := int(d.uvarint(maxItems)); n > 0 {
		p.IPs = d.addrsInto(d.shared.addrsFor(n), n)
	}
	start := d.b
	if d.shared == nil {
		p.Common = &store.Common{Cluster: cluster, Namespace: namespace, Exports: d.exports()}
		return p
	}
	// The exports run to the end of a well-formed record: records with the
	// same bytes there, cluster and namespace share one Common.
	for _, c := range d.shared.commons[string(start)] {
		if c.Cluster == cluster && c.Namespace == namespace {
			p.Common = c
			d.b = nil
			return p
		}
	}
	p.Common = &store.Common{Cluster: cluster, Namespace: namespace, Exports: d.exports()}
	if d.err == nil && len(d.b) == 0 && len(d.shared.commons) < maxShared {
		k := string(start)
		if cs := d.shared.commons[k]; len(cs) < maxItems {
			d.shared.commons[k] = append(cs, p.Common)
		}
	}
	return p
}

// service1 reads an export's Service fields ('d' records).
func (d *podReader) service1(s *annotation.Service) {
	s.Type, s.ExportedAt, s.SessionAffinity = d.sharedString(), d.sharedString(), d.sharedString()
	s.SessionAffinityTimeoutSeconds = int32(d.uvarint(annotation.MaxAffinityTimeout))
	s.InternalTrafficPolicy, s.TrafficDistribution = d.sharedString(), d.sharedString()
	for _, m := range []*map[string]string{&s.Labels, &s.Annotations} {
		n := d.uvarint(annotation.MaxBytes)
		for range n {
			k := d.string()
			v := string(d.bytes(int(d.uvarint(annotation.MaxBytes))))
			if d.err != nil {
				return
			}
			if *m == nil {
				*m = make(map[string]string, min(n, 16))
			}
			(*m)[k] = v
		}
	}
}

// exports reads the count and the exports (nil when none).
func (d *podReader) exports() []annotation.Export {
	n := d.uvarint(maxItems)
	if n == 0 || d.err != nil {
		return nil
	}
	out := make([]annotation.Export, 0, n)
	for range n {
		e := annotation.Export{Name: d.shared.name(d.stringBytes()), Namespace: d.sharedString(), Cluster: d.sharedString()}
		if m := d.uvarint(maxItems); m > 0 {
			e.Ports = make([]annotation.Port, 0, m)
			for range m {
				pt := annotation.Port{Name: d.sharedString(), Port: int32(d.uvarint(65535)), TargetPort: int32(d.uvarint(65535))}
				if proto := d.bytes(1); proto != nil {
					if int(proto[0]) >= len(protocols) {
						d.fail(errors.New("bad protocol"))
						break
					}
					pt.Protocol = protocols[proto[0]]
				}
				if d.service {
					pt.AppProtocol = d.sharedString()
				}
				e.Ports = append(e.Ports, pt)
			}
		}
		if d.allowed {
			if m := d.uvarint(annotation.MaxAllowed); m > 0 {
				e.Allowed = make([]string, 0, m)
				for range m {
					e.Allowed = append(e.Allowed, d.sharedString())
				}
			}
		}
		if d.service {
			d.service1(&e.Service)
		}
		if d.stale {
			e.StaleEndpoints = d.sharedString()
			e.StaleGraceSeconds = int32(d.uvarint(annotation.MaxStaleGrace))
			if err := e.Service.CheckStale(); err != nil && d.err == nil {
				d.fail(err) // a damaged record: never a policy the parser would refuse
			}
		}
		if d.err != nil {
			break
		}
		out = append(out, e)
	}
	return out
}
