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

// maxStringLen bounds every string a record may hold.
const maxStringLen = 1024

// errShort: the record ends before its fields do.
var errShort = errors.New("record ends early")

// appendString appends s as a uvarint length and its bytes.
func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// reader reads a record. The first error sticks: every later read returns
// zero values, so a decoder checks err once at the end.
type reader struct {
	b   []byte // what is left to read
	err error
}

// fail records err (the first one wins) and stops reading.
func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.b = nil
}

// uvarint reads a uvarint of at most max.
func (r *reader) uvarint(max uint64) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(errShort)
		return 0
	}
	if v > max {
		r.fail(fmt.Errorf("value %d over the limit %d", v, max))
		return 0
	}
	r.b = r.b[n:]
	return v
}

// bytes returns the next n bytes (aliasing the record).
func (r *reader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.fail(errShort)
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// stringBytes returns the bytes of the next string (aliasing the record).
func (r *reader) stringBytes() []byte { return r.bytes(int(r.uvarint(maxStringLen))) }

// string returns a copy of the next string.
func (r *reader) string() string { return string(r.stringBytes()) }

// appendAddrs appends a count and each address as its length (4 or 16) and
// bytes.
func appendAddrs(b []byte, ips []netip.Addr) []byte {
	b = binary.AppendUvarint(b, uint64(len(ips)))
	for _, ip := range ips {
		raw := ip.AsSlice()
		b = append(b, byte(len(raw)))
		b = append(b, raw...)
	}
	return b
}

// Addrs reads what appendAddrs wrote, at most max addresses.
func (r *reader) addrs(max uint64) []netip.Addr {
	n := r.uvarint(max)
	if n == 0 {
		return nil
	}
	return r.addrsInto(make([]netip.Addr, 0, n), int(n))
}

// addrsInto reads n addresses, the rest of what appendAddrs wrote after its
// count, into dst (which has room for them) and returns it, or nil on an
// error.
func (r *reader) addrsInto(dst []netip.Addr, n int) []netip.Addr {
	for range n {
		l := r.bytes(1)
		if l == nil {
			return nil
		}
		ip, ok := netip.AddrFromSlice(r.bytes(int(l[0])))
		if !ok {
			r.fail(errors.New("bad IP address"))
			return nil
		}
		dst = append(dst, ip)
	}
	return dst
}
