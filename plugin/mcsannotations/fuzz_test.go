package mcsannotations

import (
	"context"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
)

// FuzzServeDNS: any message the server can unpack, against a populated table
// with aliases and imports enforce, is answered without a panic by a reply
// that packs (or passed on).
func FuzzServeDNS(f *testing.F) {
	for _, q := range []struct {
		name  string
		qtype uint16
	}{
		{"backend.default.svc.clusterset.local.", dns.TypeA},
		{"_http._tcp.backend.default.svc.clusterset.local.", dns.TypeSRV},
		{"be.web.svc.cluster.local.", dns.TypeA},
		{"default.svc.clusterset.local.", dns.TypeA},
		{"clusterset.local.", dns.TypeSOA},
		{"10-0-0-1.edge-a.backend.default.svc.clusterset.local.", dns.TypeAAAA},
	} {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.qtype)
		m.SetEdns0(1232, true)
		b, _ := m.Pack()
		f.Add(b, false)
		f.Add(b, true)
	}
	plain := importsMCS(false)
	enforced := importsMCS(true)
	f.Fuzz(func(t *testing.T, b []byte, enforce bool) {
		req := new(dns.Msg)
		if err := req.Unpack(b); err != nil || len(req.Question) == 0 {
			return // the server answers these itself, before any plugin
		}
		m := plain
		if enforce {
			m = enforced
		}
		for _, from := range []string{consumerIP, "10.9.9.9"} {
			rec := dnstest.NewRecorder(&test.ResponseWriter{RemoteIP: from})
			if _, err := m.ServeDNS(context.Background(), rec, req); err != nil {
				t.Fatal(err)
			}
			if rec.Msg != nil {
				if _, err := rec.Msg.Pack(); err != nil {
					t.Fatalf("%v: the reply does not pack: %v", req.Question[0], err)
				}
			}
		}
	})
}
