package podproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// MaxField is the largest Pod a streamed list may buffer. The API server
// refuses objects over a few megabytes (etcd's request limit is 1.5 MiB),
// so a longer length is a broken stream, refused before anything is
// allocated for it.
const MaxField = 16 << 20

// MaxListMeta is the largest field of a streamed list but a Pod: the list's
// metadata (resource version, continue token, remaining count), its type
// or its encoding. An API server's are a few hundred bytes; a continue
// token longer than this is a broken list, refused before anything is
// allocated for it. ingest holds JSON lists to it too.
const MaxListMeta = 64 << 10

// streamBuffer is what List reads its stream through.
const streamBuffer = 64 << 10

// ErrStream is wrapped by every error of a streamed list but those of each:
// the stream broke off (a read failed, or it ended early) or its bytes are
// not a list of Pods (malformed, oversized, another kind).
var ErrStream = errors.New("podproto: bad PodList stream")

// List reads a PodList from r, as the API server sends a list of Pods, and
// calls each with every Pod in turn, as soon as its bytes are in: only one
// Pod's bytes are held at a time, never the whole list. It returns the list's
// metadata. Each Pod is new and each may keep it.
//
// A protobuf list is read field by field, a JSON one item by item
// (EachJSONItem); anything else is read whole and decoded by d.Fallback. A
// stream that ends early, a Pod longer than MaxField, the list's metadata,
// type or encoding longer than MaxListMeta (unknown protobuf fields are
// skipped unread; unknown JSON fields are held to MaxListMeta too), a list
// of anything but v1 Pods or a Pod that does not decode is an error
// wrapping ErrStream (after the Pods before it were handed to each), and so
// is a stream that ends before the list's bytes start: a cut stream is
// never an empty list. An error of each stops the list and is returned as
// it is.
func (d *Decoder) List(r io.Reader, each func(*v1.Pod) error) (metav1.ListMeta, error) {
	br := bufio.NewReaderSize(r, streamBuffer)
	head, err := br.Peek(len(prefix))
	if err != nil && err != io.EOF {
		return metav1.ListMeta{}, fmt.Errorf("%w: %w", ErrStream, err)
	}
	if !bytes.Equal(head, prefix) {
		return d.fallbackList(br, each)
	}
	s := &stream{r: br}
	if err := s.discard(int64(len(prefix))); err != nil {
		return metav1.ListMeta{}, s.fail(err)
	}
	var (
		meta                       metav1.ListMeta
		apiVersion, kind, encoding string
		listed                     bool
	)
	for {
		num, typ, err := s.tag()
		if err == io.EOF {
			break
		}
		if err != nil {
			return meta, s.fail(err)
		}
		switch {
		case num == 1 && typ == protowire.BytesType:
			b, err := s.field(MaxListMeta)
			if err != nil {
				return meta, s.fail(err)
			}
			if apiVersion, kind, err = typeMeta(b); err != nil {
				return meta, s.fail(err)
			}
		case num == 2 && typ == protowire.BytesType:
			// The type comes first (field order), so the list is known to be
			// Pods before the first one is read.
			if apiVersion != "v1" || kind != "PodList" {
				return meta, s.fail(fmt.Errorf("a list of %s %q, not v1 PodList", apiVersion, kind))
			}
			if listed {
				return meta, s.fail(errors.New("a second list"))
			}
			listed = true
			if err := d.streamList(s, &meta, each); err != nil {
				return meta, err
			}
		case num == 3 && typ == protowire.BytesType:
			b, err := s.field(MaxListMeta)
			if err != nil {
				return meta, s.fail(err)
			}
			encoding = string(b)
		default:
			if err := s.skip(typ, -1); err != nil {
				return meta, s.fail(err)
			}
		}
	}
	switch {
	case kind != "PodList" || apiVersion != "v1":
		return meta, s.fail(fmt.Errorf("a list of %s %q, not v1 PodList", apiVersion, kind))
	case !listed:
		// A PodList always has its metadata field, so its bytes are never
		// empty: a stream that ends before them was cut, and is not a list
		// with no Pods (which would empty the store).
		return meta, s.fail(errors.New("no list after the type"))
	case encoding != "":
		// Never sent by an API server; the Pods read were plain protobuf.
		return meta, s.fail(fmt.Errorf("content encoding %q", encoding))
	}
	return meta, nil
}

// streamList reads a PodList's bytes (the envelope's raw field, whose length
// is next): metadata 1, items 2.
func (d *Decoder) streamList(s *stream, meta *metav1.ListMeta, each func(*v1.Pod) error) error {
	size, err := s.uvarint()
	if err != nil {
		return s.fail(err)
	}
	if size > 1<<62 {
		return s.fail(fmt.Errorf("a list of %d bytes", size))
	}
	end := s.n + int64(size)
	for s.n < end {
		num, typ, err := s.tag()
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return s.fail(err)
		}
		switch {
		case num == 1 && typ == protowire.BytesType:
			b, err := s.fieldWithin(end, MaxListMeta)
			if err != nil {
				return s.fail(fmt.Errorf("the list's metadata: %w", err))
			}
			if err := listMeta(b, meta); err != nil {
				return s.fail(err)
			}
		case num == 2 && typ == protowire.BytesType:
			b, err := s.fieldWithin(end, MaxField)
			if err != nil {
				return s.fail(err)
			}
			p := &v1.Pod{}
			if err := d.pod(b, p); err != nil {
				return s.fail(fmt.Errorf("a Pod: %w", err))
			}
			if err := each(p); err != nil {
				return err
			}
		default:
			if err := s.skip(typ, end); err != nil {
				return s.fail(err)
			}
		}
	}
	if s.n != end {
		return s.fail(fmt.Errorf("a field overran the list's end by %d bytes", s.n-end))
	}
	return nil
}

// fallbackList reads a list that is not protobuf: one in JSON one Pod at a
// time (jsonList), anything else whole, decoded by d.Fallback.
func (d *Decoder) fallbackList(r *bufio.Reader, each func(*v1.Pod) error) (metav1.ListMeta, error) {
	if startsJSON(r) {
		return d.jsonList(r, each)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return metav1.ListMeta{}, fmt.Errorf("%w: %w", ErrStream, err)
	}
	list := &v1.PodList{}
	if err := runtime.DecodeInto(d.Fallback, data, list); err != nil {
		return metav1.ListMeta{}, fmt.Errorf("%w: %w", ErrStream, err)
	}
	for i := range list.Items {
		p := list.Items[i]
		list.Items[i] = v1.Pod{}
		if err := each(&p); err != nil {
			return list.ListMeta, err
		}
	}
	return list.ListMeta, nil
}

// startsJSON reports whether what r holds starts, after white space, with
// a JSON object.
func startsJSON(r *bufio.Reader) bool {
	b, _ := r.Peek(512)
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c == '{'
	}
	return false
}

// ErrTooLarge is wrapped by the error of a streamed list's part over its
// bound: a Pod over MaxField, the list's metadata over MaxListMeta, in
// protobuf or JSON.
var ErrTooLarge = errors.New("over its size bound")

// jsonList reads a PodList in JSON with EachJSONItem: each Pod is at most
// MaxField bytes, the list's metadata at most MaxListMeta, and the list is
// never held whole. Every error but each's wraps ErrStream.
func (d *Decoder) jsonList(r io.Reader, each func(*v1.Pod) error) (metav1.ListMeta, error) {
	var tm metav1.TypeMeta
	var eachErr error
	meta, err := EachJSONItem(r, MaxField, ErrTooLarge, &tm, func(raw []byte) error {
		if tm.APIVersion != "v1" || tm.Kind != "PodList" {
			return fmt.Errorf("a list of %s %q, not v1 PodList", tm.APIVersion, tm.Kind)
		}
		p := &v1.Pod{}
		if err := utiljson.Unmarshal(raw, p); err != nil {
			return fmt.Errorf("a Pod: %w", err)
		}
		eachErr = each(p)
		return eachErr
	})
	switch {
	case eachErr != nil:
		return meta, eachErr
	case err == nil && (tm.APIVersion != "v1" || tm.Kind != "PodList"):
		err = fmt.Errorf("a list of %s %q, not v1 PodList", tm.APIVersion, tm.Kind)
	}
	if err != nil {
		return meta, fmt.Errorf("%w: %w", ErrStream, err)
	}
	return meta, nil
}

// stream reads protobuf fields from a byte stream and counts the bytes read.
type stream struct {
	r   *bufio.Reader
	n   int64
	buf []byte // the last buffered field; reused
}

func (s *stream) ReadByte() (byte, error) {
	b, err := s.r.ReadByte()
	if err == nil {
		s.n++
	}
	return b, err
}

// uvarint reads a varint that must be there: a stream that ends before it
// is cut short (as one that ends inside it is, by binary.ReadUvarint).
func (s *stream) uvarint() (uint64, error) {
	v, err := binary.ReadUvarint(s)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return v, err
}

// tag reads a field's tag; io.EOF when the stream ends cleanly before it
// (binary.ReadUvarint gives io.ErrUnexpectedEOF for an end inside it).
func (s *stream) tag() (protowire.Number, protowire.Type, error) {
	v, err := binary.ReadUvarint(s)
	if err != nil {
		return 0, 0, err
	}
	num, typ := protowire.DecodeTag(v)
	if num < protowire.MinValidNumber {
		return 0, 0, fmt.Errorf("field number %d", num)
	}
	return num, typ, nil
}

// field reads a length-delimited field of at most max bytes into s.buf.
func (s *stream) field(max uint64) ([]byte, error) { return s.fieldWithin(-1, max) }

// fieldWithin is field for a field that must end by end (-1: anywhere).
func (s *stream) fieldWithin(end int64, max uint64) ([]byte, error) {
	size, err := s.uvarint()
	if err != nil {
		return nil, err
	}
	if size > max {
		return nil, fmt.Errorf("a field of %d bytes (the limit is %d): %w", size, max, ErrTooLarge)
	}
	if end >= 0 && s.n+int64(size) > end {
		return nil, fmt.Errorf("a field of %d bytes overruns its message by %d", size, s.n+int64(size)-end)
	}
	if cap(s.buf) < int(size) {
		s.buf = make([]byte, size)
	}
	s.buf = s.buf[:size]
	n, err := io.ReadFull(s.r, s.buf)
	s.n += int64(n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return s.buf, err
}

// skip passes over a field of type typ that must end by end (-1: anywhere).
// Groups, which no Kubernetes type uses, are refused.
func (s *stream) skip(typ protowire.Type, end int64) error {
	var size uint64
	switch typ {
	case protowire.VarintType:
		_, err := s.uvarint()
		return err
	case protowire.Fixed32Type:
		size = 4
	case protowire.Fixed64Type:
		size = 8
	case protowire.BytesType:
		var err error
		if size, err = s.uvarint(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w %d", errWireType, typ)
	}
	if size > 1<<62 || end >= 0 && s.n+int64(size) > end {
		return fmt.Errorf("a field of %d bytes overruns its message", size)
	}
	return s.discard(int64(size))
}

func (s *stream) discard(n int64) error {
	for n > 0 {
		step := int(min(n, 1<<30))
		m, err := s.r.Discard(step)
		s.n += int64(m)
		n -= int64(m)
		if err == io.EOF {
			return io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// fail wraps err, a fault of the stream, with where it happened.
func (s *stream) fail(err error) error {
	if errors.Is(err, ErrStream) {
		return err
	}
	return fmt.Errorf("%w at byte %d: %w", ErrStream, s.n, err)
}

// EachJSONItem reads a list as the API server sends it in JSON
// ({"kind":…,"apiVersion":…,"metadata":{…},"items":[…]}) from r and calls
// each with the bytes of every item in turn, as soon as they are in: the
// list is never held whole. The list's kind and apiVersion are in tm as
// soon as they come (before the items, from an API server). An item over
// max bytes is refused, and so is anything else over MaxListMeta bytes: the
// list's metadata (an over-long continue token), its kind or apiVersion,
// or a field an API server never sends (read to skip it, never held beyond
// the bound); both errors wrap tooLarge. A reply with no "items" (a Status,
// say) is no list: an error, never an empty list, and a list cut off is
// io.ErrUnexpectedEOF. each's error is returned as it is.
func EachJSONItem(r io.Reader, max int64, tooLarge error, tm *metav1.TypeMeta, each func([]byte) error) (metav1.ListMeta, error) {
	br := &boundedDecoding{r: r, item: max, tooLarge: tooLarge}
	dec := json.NewDecoder(br)
	br.dec = dec
	meta, err := decodeList(dec, br, tm, each)
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF // a list cut off is never a complete one
	}
	return meta, err
}

func decodeList(dec *json.Decoder, br *boundedDecoding, tm *metav1.TypeMeta, each func([]byte) error) (metav1.ListMeta, error) {
	var meta metav1.ListMeta
	items := false
	if err := delim(dec, '{'); err != nil {
		return meta, err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return meta, err
		}
		switch tok {
		case "metadata":
			err = dec.Decode(&meta)
		case "kind":
			err = dec.Decode(&tm.Kind)
		case "apiVersion":
			err = dec.Decode(&tm.APIVersion)
		case "items":
			items = true
			err = decodeItems(dec, br, each)
		default:
			var skip json.RawMessage
			err = dec.Decode(&skip)
		}
		if err != nil {
			return meta, err
		}
	}
	if err := delim(dec, '}'); err != nil {
		return meta, err
	}
	if !items {
		return meta, errors.New("the reply has no items: not a list")
	}
	return meta, nil
}

// decodeItems reads the items array (or null) and calls each with every
// item, each read under br's item bound.
func decodeItems(dec *json.Decoder, br *boundedDecoding, each func([]byte) error) error {
	tok, err := dec.Token()
	if err != nil || tok == nil { // "items": null is an empty list
		return err
	}
	if tok != json.Delim('[') {
		return fmt.Errorf("items is %v, not a list", tok)
	}
	for dec.More() {
		var raw json.RawMessage
		br.inItem = true
		err := dec.Decode(&raw)
		br.inItem = false
		if err != nil {
			return err
		}
		if err := each(raw); err != nil {
			return err
		}
	}
	return delim(dec, ']')
}

// delim reads the next token, which must be want.
func delim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != want {
		return fmt.Errorf("%v where %v was expected", tok, want)
	}
	return nil
}

// boundedDecoding is what a JSON decoder reads a list through. The decoder
// reads more only when the value it decodes is not complete in what it
// holds: a read while it holds more than the bound of one value fails with
// b.tooLarge (it holds at most the bound and one read more). The bound is
// item while an item is decoded (inItem), MaxListMeta otherwise.
type boundedDecoding struct {
	r        io.Reader
	dec      *json.Decoder
	item     int64
	inItem   bool
	tooLarge error
	read     int64
	err      error
}

func (b *boundedDecoding) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	held := b.read - b.dec.InputOffset()
	switch {
	case b.inItem && held > b.item:
		b.err = fmt.Errorf("%w: a list item over %d bytes", b.tooLarge, b.item)
	case !b.inItem && held > MaxListMeta:
		b.err = fmt.Errorf("%w: the list's metadata, kind, apiVersion or another field but its items over %d bytes", b.tooLarge, MaxListMeta)
	}
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.r.Read(p)
	b.read += int64(n)
	return n, err
}
