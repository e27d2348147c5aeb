package snapshot

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
)

var (
	ipA = netip.MustParseAddr("10.0.0.1")
	ipB = netip.MustParseAddr("fd00::1")
)

func TestClientCodec(t *testing.T) {
	c := &clients.Client{Namespace: "web", Name: "consumer", Imports: []annotation.Import{
		{Name: "db", Namespace: "data", Cluster: "edge-b", Alias: "db"}, {Name: "cache", Namespace: "web"}}}
	ips := []netip.Addr{ipA, ipB}
	b := EncodeClient(c, ips)
	back, backIPs, err := DecodeClient(b)
	if err != nil || back.Namespace != "web" || back.Name != "consumer" || !slices.Equal(back.Imports, c.Imports) || !slices.Equal(backIPs, ips) {
		t.Fatalf("round trip: %+v %v %v", back, backIPs, err)
	}
	for _, bad := range [][]byte{nil, []byte("x"), b[:len(b)-1], append(b[:len(b):len(b)], 0),
		[]byte("c\x00\x00\x00\x00"), []byte("c\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")} {
		if _, _, err := DecodeClient(bad); err == nil {
			t.Errorf("DecodeClient(%q) accepted", bad)
		}
	}
}

// FuzzDecode: no input panics, and whatever decodes encodes back the same.
func FuzzDecodeClient(f *testing.F) {
	f.Add(EncodeClient(&clients.Client{Namespace: "web", Name: "c", Imports: []annotation.Import{{Name: "db", Namespace: "web", Alias: "d"}}}, []netip.Addr{ipA, ipB}))
	f.Add([]byte("c"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, ips, err := DecodeClient(b)
		if err != nil {
			return
		}
		c2, ips2, err := DecodeClient(EncodeClient(c, ips))
		if err != nil || !slices.Equal(c2.Imports, c.Imports) || !slices.Equal(ips2, ips) || c2.Name != c.Name {
			t.Fatalf("re-encoded record differs: %+v %v, %v", c2, ips2, err)
		}
	})
}
