package snapshot

import (
	"net/netip"
	"testing"

	"github.com/mcsannotations/mcsannotations/internal/table"
)

func csip(ns, name string, ips []string, ports ...table.ImportPort) table.ClusterSetIP {
	ci := table.ClusterSetIP{Namespace: ns, Name: name, Ports: ports}
	for _, ip := range ips {
		ci.IPs = append(ci.IPs, netip.MustParseAddr(ip))
	}
	return ci
}

func TestClusterSetIPCodec(t *testing.T) {
	in := csip("default", "backend", []string{"10.96.0.10", "fd00::10"}, table.ImportPort{Name: "http", Protocol: "TCP", Port: 80}, table.ImportPort{Protocol: "UDP", Port: 53})
	b, err := EncodeClusterSetIP(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeClusterSetIP(b)
	if err != nil {
		t.Fatal(err)
	}
	if out.Namespace != in.Namespace || out.Name != in.Name || len(out.IPs) != 2 || out.IPs[1] != in.IPs[1] || len(out.Ports) != 2 || out.Ports[0] != in.Ports[0] {
		t.Errorf("round trip: %+v, want %+v", out, in)
	}
	for _, bad := range []string{`{`, `{"namespace":"a","name":"b","ips":[]}`, `{"namespace":"a","name":"b","ips":["x"]}`,
		`{"namespace":"a","name":"b","ips":["10.0.0.1"],"ports":[{"protocol":"ICMP","port":1}]}`} {
		if _, err := DecodeClusterSetIP([]byte(bad)); err == nil {
			t.Errorf("%s decoded", bad)
		}
	}
}
