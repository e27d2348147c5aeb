package snapshot

// The pieces of the compact record forms that the Pod and client codecs
// share: strings as a uvarint length and bytes, bounded counts, addresses,
// and a reader whose first error sticks.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// MaxStringLen bounds every string a record may hold.
const MaxStringLen = 1024

// ErrShort: the record ends before its fields do.
var ErrShort = errors.New("record ends early")

// AppendString appends s as a uvarint length and its bytes.
func AppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Reader reads a record. The first error sticks: every later read returns
// zero values, so a decoder checks Err once at the end.
type Reader struct {
	B   []byte // what is left to read
	Err error
}

// Fail records err (the first one wins) and stops reading.
func (r *Reader) Fail(err error) {
	if r.Err == nil {
		r.Err = err
	}
	r.B = nil
}

// Uvarint reads a uvarint of at most max.
func (r *Reader) Uvarint(max uint64) uint64 {
	if r.Err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.B)
	if n <= 0 {
		r.Fail(ErrShort)
		return 0
	}
	if v > max {
		r.Fail(fmt.Errorf("value %d over the limit %d", v, max))
		return 0
	}
	r.B = r.B[n:]
	return v
}

// Bytes returns the next n bytes (aliasing the record).
func (r *Reader) Bytes(n int) []byte {
	if r.Err != nil {
		return nil
	}
	if len(r.B) < n {
		r.Fail(ErrShort)
		return nil
	}
	v := r.B[:n]
	r.B = r.B[n:]
	return v
}

// StringBytes returns the bytes of the next string (aliasing the record).
func (r *Reader) StringBytes() []byte { return r.Bytes(int(r.Uvarint(MaxStringLen))) }

// String returns a copy of the next string.
func (r *Reader) String() string { return string(r.StringBytes()) }

// AppendAddrs appends a count and each address as its length (4 or 16) and
// bytes.
func AppendAddrs(b []byte, ips []netip.Addr) []byte {
	b = binary.AppendUvarint(b, uint64(len(ips)))
	for _, ip := range ips {
		raw := ip.AsSlice()
		b = append(b, byte(len(raw)))
		b = append(b, raw...)
	}
	return b
}

// Addrs reads what AppendAddrs wrote, at most max addresses.
func (r *Reader) Addrs(max uint64) []netip.Addr {
	n := r.Uvarint(max)
	if n == 0 {
		return nil
	}
	return r.AddrsInto(make([]netip.Addr, 0, n), int(n))
}

// AddrsInto reads n addresses, the rest of what AppendAddrs wrote after its
// count, into dst (which has room for them) and returns it, or nil on an
// error.
func (r *Reader) AddrsInto(dst []netip.Addr, n int) []netip.Addr {
	for range n {
		l := r.Bytes(1)
		if l == nil {
			return nil
		}
		ip, ok := netip.AddrFromSlice(r.Bytes(int(l[0])))
		if !ok {
			r.Fail(errors.New("bad IP address"))
			return nil
		}
		dst = append(dst, ip)
	}
	return dst
}
