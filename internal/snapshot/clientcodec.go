package snapshot

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
)

// The persisted form of a client, so that alias names and imports enforce
// work after a restart while the API server is unreachable:
//
//	'c' namespace name n-ips { len(1 byte: 4 or 16) bytes }
//	    n-imports { name namespace cluster alias }
//
// Strings are a uvarint length and bytes; counts are uvarints. The UID is
// not kept (nothing answers by it).
const recordClient = 'c'

// maxItems bounds every count in a decoded record: a damaged file must not
// make the decoder allocate without bound.
const maxItems = 256

// EncodeClient returns the persisted form of a Pod's client record and IPs.
func EncodeClient(c *clients.Client, ips []netip.Addr) []byte {
	b := make([]byte, 0, 64)
	b = append(b, recordClient)
	b = appendString(b, c.Namespace)
	b = appendString(b, c.Name)
	b = appendAddrs(b, ips)
	b = binary.AppendUvarint(b, uint64(len(c.Imports)))
	for _, i := range c.Imports {
		for _, s := range []string{i.Name, i.Namespace, i.Cluster, i.Alias} {
			b = appendString(b, s)
		}
	}
	return b
}

// DecodeClient reads what EncodeClient wrote. It checks the shape; the
// caller checks that the record is stored under its own namespace/name.
func DecodeClient(b []byte) (*clients.Client, []netip.Addr, error) {
	if len(b) == 0 || b[0] != recordClient {
		return nil, nil, errors.New("not a client record")
	}
	d := reader{b: b[1:]}
	c := &clients.Client{Namespace: d.string(), Name: d.string()}
	ips := d.addrs(maxItems)
	for i, ip := range ips {
		ips[i] = ip.Unmap()
	}
	if n := d.uvarint(maxItems); n > 0 {
		c.Imports = make([]annotation.Import, 0, n)
		for range n {
			c.Imports = append(c.Imports, annotation.Import{Name: d.string(), Namespace: d.string(), Cluster: d.string(), Alias: d.string()})
		}
	}
	switch {
	case d.err != nil:
		return nil, nil, d.err
	case len(d.b) != 0:
		return nil, nil, errors.New("data after the record")
	case c.Namespace == "" || c.Name == "":
		return nil, nil, errors.New("record without namespace or name")
	}
	return c, ips, nil
}
