// Package podproto decodes Pods from the API server's protobuf keeping only
// the fields the plugin reads, and builds a client that uses it; the plugin
// meets it only behind ingest.Pods, its ListerWatcher of Pods.
//
// A Pod as the API server sends it is mostly managed fields, containers and
// their statuses; client-go's decoder builds all of it only for the
// transform to drop it at once, and decoding is most of a relist's cost.
// This decoder reads the same bytes and fills in only:
//
//   - metadata: name, namespace, uid, resourceVersion, deletionTimestamp, and
//     the labels and annotations whose keys it was given (plus
//     k8s.io/initial-events-end, which ends a streamed list);
//   - spec: hostname, hostNetwork;
//   - status: phase, the type and status of each condition, podIP, podIPs.
//
// Everything else is skipped without being built. Pods and PodLists in
// protobuf go through it; anything else (JSON, other kinds, a Status) goes
// to client-go's own decoder. Bytes that are not a well-formed Pod are an
// error, as they are to client-go. BenchmarkDecode compares the two.
//
// The client's ListPods also reads a list of Pods as it streams in
// (Decoder.List), one Pod at a time, where client-go reads a response whole
// before decoding it: a relist never holds the whole list's bytes.
//
// What keeping it current costs: the decoder hard-codes the protobuf field
// numbers of the fields above (k8s.io/api/core/v1/generated.proto and
// apimachinery's ObjectMeta). Protobuf's compatibility rules keep those
// numbers fixed, so a k8s.io/api upgrade needs no change, only the tests
// run again: FuzzDecode and the comparison tests decode the same bytes with
// client-go and require the same fields. A field the plugin starts to read
// must be added here (a case in the message's switch) and to Plugin's Keep
// or the comparison's projection; the sources' and clients' tests decode
// their Pods through Trim, so a transform that reads a dropped field fails
// there.
package podproto

import (
	"bytes"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// prefix starts every protobuf object of the API server (a runtime.Unknown
// envelope follows it).
var prefix = []byte{'k', '8', 's', 0}

// Keep names the labels and annotations a decoded Pod keeps; others are
// dropped.
type Keep struct {
	Labels      []string
	Annotations []string
}

func (k Keep) label(key []byte) bool { return in(k.Labels, key) }

func (k Keep) annotation(key []byte) bool {
	return string(key) == metav1.InitialEventsAnnotationKey || in(k.Annotations, key)
}

func in(keys []string, key []byte) bool {
	for _, k := range keys {
		if k == string(key) {
			return true
		}
	}
	return false
}

// Decoder decodes protobuf Pods and PodLists itself and hands everything
// else to Fallback.
type Decoder struct {
	Keep     Keep
	Fallback runtime.Decoder
}

// Decode implements runtime.Decoder. Like client-go's decoder for typed
// clients, it leaves the object's TypeMeta empty.
func (d *Decoder) Decode(data []byte, gvk *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if !bytes.HasPrefix(data, prefix) {
		return d.Fallback.Decode(data, gvk, into)
	}
	env, err := decodeEnvelope(data[len(prefix):])
	if err != nil || env.apiVersion != "v1" || env.encoding != "" {
		return d.Fallback.Decode(data, gvk, into)
	}
	var obj runtime.Object
	ok := false
	switch env.kind {
	case "Pod":
		obj, ok, err = fill[v1.Pod](into, env.raw, d.pod)
	case "PodList":
		obj, ok, err = fill[v1.PodList](into, env.raw, d.podList)
	}
	if !ok {
		return d.Fallback.Decode(data, gvk, into)
	}
	kind := v1.SchemeGroupVersion.WithKind(env.kind)
	if err != nil {
		return nil, &kind, fmt.Errorf("decoding %s: %w", env.kind, err)
	}
	return obj, &kind, nil
}

// fill decodes raw with decode into into, emptied first, or into a new T
// when into is nil; ok is false when into is something else.
func fill[T any, PT interface {
	*T
	runtime.Object
}](into runtime.Object, raw []byte, decode func([]byte, PT) error) (obj runtime.Object, ok bool, err error) {
	t, ok := into.(PT)
	if into != nil && !ok {
		return nil, false, nil
	}
	if t == nil {
		t = new(T)
	} else {
		var zero T
		*t = zero
	}
	return t, true, decode(raw, t)
}

type envelope struct {
	apiVersion, kind, encoding string
	raw                        []byte
}

// decodeEnvelope reads a runtime.Unknown: typeMeta 1 (apiVersion 1, kind 2),
// raw 2, contentEncoding 3, contentType 4. raw aliases b.
func decodeEnvelope(b []byte) (envelope, error) {
	var e envelope
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case 1:
			var err error
			e.apiVersion, e.kind, err = typeMeta(r.bytes())
			r.check(err)
		case 2:
			e.raw = r.bytes()
		case 3:
			e.encoding = r.string()
		}
	}
	return e, r.err
}

// typeMeta reads a TypeMeta: apiVersion 1, kind 2.
func typeMeta(b []byte) (apiVersion, kind string, err error) {
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case 1:
			apiVersion = r.string()
		case 2:
			kind = r.string()
		}
	}
	return apiVersion, kind, r.err
}

// reader walks the fields of one protobuf message: for r.next() { switch
// r.num { ... } }, then r.err.
type reader struct {
	b   []byte
	num protowire.Number
	typ protowire.Type
	val []byte // a length-delimited field's content (aliases b)
	u   uint64 // a varint field's value
	err error
}

// next moves to the next field: false at the end, or on an error.
func (r *reader) next() bool {
	if r.err != nil || len(r.b) == 0 {
		return false
	}
	num, typ, n := protowire.ConsumeTag(r.b)
	if n < 0 {
		r.err = protowire.ParseError(n)
		return false
	}
	r.b = r.b[n:]
	r.num, r.typ, r.val, r.u = num, typ, nil, 0
	switch typ {
	case protowire.BytesType:
		r.val, n = protowire.ConsumeBytes(r.b)
	case protowire.VarintType:
		r.u, n = protowire.ConsumeVarint(r.b)
	default:
		n = protowire.ConsumeFieldValue(num, typ, r.b)
	}
	if n < 0 {
		r.err = fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		return false
	}
	r.b = r.b[n:]
	return true
}

// bytes returns the content of the current field, which must be
// length-delimited.
func (r *reader) bytes() []byte {
	if r.typ != protowire.BytesType {
		r.wrongType()
	}
	return r.val
}

func (r *reader) string() string { return string(r.bytes()) }

// known are the values of phase and of a condition's type and status that
// recur in every Pod: reading one returns the string here, with no copy.
var known = [...]string{
	"Running", "Pending", "Succeeded", "Failed", "Unknown",
	"PodScheduled", "Initialized", "ContainersReady", "Ready", "PodReadyToStartContainers",
	"True", "False",
}

// value is string, without the copy for a known value.
func (r *reader) value() string {
	b := r.bytes()
	for _, s := range known {
		if s == string(b) {
			return s
		}
	}
	return string(b)
}

// varint returns the value of the current field, which must be a varint.
func (r *reader) varint() uint64 {
	if r.typ != protowire.VarintType {
		r.wrongType()
	}
	return r.u
}

var errWireType = errors.New("wrong wire type")

func (r *reader) wrongType() { r.check(fmt.Errorf("field %d: %w %d", r.num, errWireType, r.typ)) }

// check records err (the first one wins); next then stops.
func (r *reader) check(err error) {
	if err != nil && r.err == nil {
		r.err = err
	}
}

// pod reads a Pod: metadata 1, spec 2, status 3.
func (d *Decoder) pod(b []byte, p *v1.Pod) error {
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case 1:
			r.check(d.meta(r.bytes(), &p.ObjectMeta))
		case 2:
			r.check(spec(r.bytes(), &p.Spec))
		case 3:
			r.check(status(r.bytes(), &p.Status))
		}
	}
	return r.err
}

// meta reads an ObjectMeta: name 1, namespace 3, uid 5, resourceVersion 6,
// deletionTimestamp 9, labels 11, annotations 12.
func (d *Decoder) meta(b []byte, m *metav1.ObjectMeta) error {
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case 1:
			m.Name = r.string()
		case 3:
			m.Namespace = r.string()
		case 5:
			m.UID = types.UID(r.string())
		case 6:
			m.ResourceVersion = r.string()
		case 9:
			t, err := timestamp(r.bytes())
			r.check(err)
			m.DeletionTimestamp = &t
		case 11:
			r.check(entry(r.bytes(), &m.Labels, d.Keep.label))
		case 12:
			r.check(entry(r.bytes(), &m.Annotations, d.Keep.annotation))
		}
	}
	return r.err
}

// timestamp reads a Time: seconds 1, nanos 2.
func timestamp(b []byte) (metav1.Time, error) {
	var sec, nsec int64
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case 1:
			sec = int64(r.varint())
		case 2:
			nsec = int64(int32(r.varint()))
		}
	}
	return metav1.Unix(sec, nsec), r.err
}

// entry reads one entry of a map<string, string> (key 1, value 2) into *m
// when keep says so.
func entry(b []byte, m *map[string]string, keep func([]byte) bool) error {
	var k, v []byte
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case 1:
			k = r.bytes()
		case 2:
			v = r.bytes()
		}
	}
	if r.err != nil || !keep(k) {
		return r.err
	}
	if *m == nil {
		*m = map[string]string{}
	}
	(*m)[string(k)] = string(v)
	return nil
}

// spec reads a PodSpec: hostNetwork 11, hostname 16.
func spec(b []byte, s *v1.PodSpec) error {
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case 11:
			s.HostNetwork = r.varint() != 0
		case 16:
			s.Hostname = r.string()
		}
	}
	return r.err
}

// status reads a PodStatus: phase 1, conditions 2 (type 1, status 2),
// podIP 6, podIPs 12 (ip 1).
func status(b []byte, s *v1.PodStatus) error {
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case 1:
			s.Phase = v1.PodPhase(r.value())
		case 2:
			var c v1.PodCondition
			t := reader{b: r.bytes()}
			for t.next() {
				switch t.num {
				case 1:
					c.Type = v1.PodConditionType(t.value())
				case 2:
					c.Status = v1.ConditionStatus(t.value())
				}
			}
			r.check(t.err)
			s.Conditions = append(s.Conditions, c)
		case 6:
			s.PodIP = r.string()
		case 12:
			var ip v1.PodIP
			t := reader{b: r.bytes()}
			for t.next() {
				if t.num == 1 {
					ip.IP = t.string()
				}
			}
			r.check(t.err)
			s.PodIPs = append(s.PodIPs, ip)
		}
	}
	return r.err
}

// podList reads a PodList: metadata 1, items 2.
func (d *Decoder) podList(b []byte, l *v1.PodList) error {
	items := 0
	r := reader{b: b}
	for r.next() {
		if r.num == 2 {
			items++
		}
	}
	if r.err != nil {
		return r.err
	}
	if items > 0 {
		l.Items = make([]v1.Pod, 0, items)
	}
	r = reader{b: b}
	for r.next() {
		switch r.num {
		case 1:
			r.check(listMeta(r.bytes(), &l.ListMeta))
		case 2:
			l.Items = append(l.Items, v1.Pod{})
			r.check(d.pod(r.bytes(), &l.Items[len(l.Items)-1]))
		}
	}
	return r.err
}

// listMeta reads a ListMeta: resourceVersion 2, continue 3,
// remainingItemCount 4.
func listMeta(b []byte, m *metav1.ListMeta) error {
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case 2:
			m.ResourceVersion = r.string()
		case 3:
			m.Continue = r.string()
		case 4:
			n := int64(r.varint())
			m.RemainingItemCount = &n
		}
	}
	return r.err
}
