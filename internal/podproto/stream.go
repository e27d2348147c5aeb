package podproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
// A protobuf list is read field by field; anything else (JSON) is read whole
// and decoded by d.Fallback. A stream that ends early, a Pod longer than
// MaxField, list metadata, type or encoding longer than MaxListMeta (other
// fields are skipped unread), a list of anything but v1 Pods or a Pod that
// does not decode is
// an error wrapping ErrStream (after the Pods before it were handed to
// each), and so is a stream that ends before the list's bytes start: a cut
// stream is never an empty list. An error of each stops the list and is
// returned as it is.
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

// fallbackList decodes a whole list that is not protobuf with d.Fallback.
func (d *Decoder) fallbackList(r io.Reader, each func(*v1.Pod) error) (metav1.ListMeta, error) {
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
		return nil, fmt.Errorf("a field of %d bytes (the limit is %d)", size, max)
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
