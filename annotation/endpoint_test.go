package annotation

import (
	"crypto/ed25519"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  string
		want Endpoint
		ips  []netip.Addr
		err  string // a part of the refusal; "" accepts
	}{
		{name: "seq only", raw: `{"seq":1}`, want: Endpoint{Seq: 1}, ips: []netip.Addr{}},
		{name: "everything", raw: `{"ips":["10.0.0.1","fd00::1"],"hostname":"web-0","ready":true,"seq":1790000000000}`,
			want: Endpoint{IPs: []string{"10.0.0.1", "fd00::1"}, Hostname: "web-0", Ready: true, Seq: 1790000000000},
			ips:  []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}},
		{name: "IPv4-mapped comes back as IPv4", raw: `{"ips":["::ffff:10.0.0.1"],"seq":2}`,
			want: Endpoint{IPs: []string{"::ffff:10.0.0.1"}, Seq: 2}, ips: []netip.Addr{netip.MustParseAddr("10.0.0.1")}},
		{name: "largest seq", raw: `{"seq":18446744073709551615}`, want: Endpoint{Seq: 1<<64 - 1}, ips: []netip.Addr{}},

		{name: "too large", raw: `{"seq":1,"hostname":"` + strings.Repeat("a", MaxEndpointBytes) + `"}`, err: "bytes, over"},
		{name: "unknown field", raw: `{"seq":1,"port":80}`, err: `unknown field "port"`},
		{name: "long unknown field is clipped", raw: `{"seq":1,"` + strings.Repeat("x", 500) + `":1}`, err: "..."},
		{name: "no seq", raw: `{"ips":["10.0.0.1"],"ready":true}`, err: "without seq"},
		{name: "seq 0", raw: `{"seq":0}`, err: "without seq"},
		{name: "negative seq", raw: `{"seq":-1}`, err: "cannot unmarshal"},
		{name: "seq past 64 bits", raw: `{"seq":18446744073709551616}`, err: "cannot unmarshal"},
		{name: "three addresses", raw: `{"ips":["10.0.0.1","10.0.0.2","fd00::1"],"seq":1}`, err: "3 addresses, over 2"},
		{name: "zone", raw: `{"ips":["fe80::1%eth0"],"seq":1}`, err: "is not an address"},
		{name: "not an address", raw: `{"ips":["10.0.0.256"],"seq":1}`, err: "is not an address"},
		{name: "a name for an address", raw: `{"ips":["web"],"seq":1}`, err: "is not an address"},
		{name: "duplicate", raw: `{"ips":["10.0.0.1","10.0.0.1"],"seq":1}`, err: "10.0.0.1 twice"},
		{name: "duplicate IPv4-mapped", raw: `{"ips":["10.0.0.1","::ffff:10.0.0.1"],"seq":1}`, err: "10.0.0.1 twice"},
		{name: "duplicate IPv6 spelled twice", raw: `{"ips":["fd00::1","fd00:0::1"],"seq":1}`, err: "fd00::1 twice"},
		{name: "hostname with a dot", raw: `{"hostname":"web.0","seq":1}`, err: "is not a DNS label"},
		{name: "hostname upper case", raw: `{"hostname":"Web","seq":1}`, err: "is not a DNS label"},
		{name: "hostname too long", raw: `{"hostname":"` + strings.Repeat("a", 64) + `","seq":1}`, err: "is not a DNS label"},
		{name: "not JSON", raw: `seq=1`, err: "invalid character"},
		{name: "empty", raw: ``, err: "EOF"},
		{name: "an array", raw: `[{"seq":1}]`, err: "cannot unmarshal"},
		{name: "a second value", raw: `{"seq":1}{"seq":2}`, err: "data after the value"},
		{name: "a closing brace after", raw: `{"seq":1}}`, err: "data after the value"},
		{name: "ready not a bool", raw: `{"ready":"true","seq":1}`, err: "cannot unmarshal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, ips, err := ParseEndpoint(tc.raw)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || len(err.Error()) > 300 {
					t.Fatalf("ParseEndpoint = %+v, %v, %v; want a short refusal containing %q", e, ips, err, tc.err)
				}
				if !reflect.DeepEqual(e, Endpoint{}) || ips != nil {
					t.Errorf("refused, yet returned %+v, %v", e, ips)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(e, tc.want) || !reflect.DeepEqual(ips, tc.ips) {
				t.Errorf("ParseEndpoint = %+v, %v, %v; want %+v, %v", e, ips, err, tc.want, tc.ips)
			}
		})
	}
}

// What FormatEndpoint writes, ParseEndpoint reads back as it was; an unset
// hostname and a false ready are left out.
func TestFormatEndpoint(t *testing.T) {
	for _, e := range []Endpoint{
		{Seq: 1},
		{IPs: []string{"10.0.0.1"}, Ready: true, Seq: 7},
		{IPs: []string{"10.0.0.1", "fd00::1"}, Hostname: "db-0", Ready: true, Seq: 1 << 62},
	} {
		raw := FormatEndpoint(e)
		got, _, err := ParseEndpoint(raw)
		if err != nil || !reflect.DeepEqual(got, e) {
			t.Errorf("%s read back as %+v, %v; want %+v", raw, got, err, e)
		}
	}
	if got := FormatEndpoint(Endpoint{Seq: 3}); got != `{"seq":3}` {
		t.Errorf("FormatEndpoint(seq 3) = %s", got)
	}
}

func TestSignVerifyEndpoint(t *testing.T) {
	pub, priv := newKey(t)
	otherPub, _ := newKey(t)
	const export = `{"services":[{"name":"backend"}]}`
	const stmt = `{"ips":["10.0.0.1"],"ready":true,"seq":5}`
	sig := SignEndpoint(priv, "edge-a", "ns", "p", "uid-1", export, stmt)
	if !strings.HasPrefix(sig, SignaturePrefix) {
		t.Fatalf("signature %q lacks its prefix", sig)
	}
	if r, ok := VerifyEndpoint(pub, sig, "edge-a", "ns", "p", "uid-1", export, stmt); !ok {
		t.Fatalf("own signature refused: %v", r)
	}
	// An export signature over the same bytes is no endpoint signature (the
	// contexts differ), and the reverse.
	if _, ok := VerifyEndpoint(pub, Sign(priv, "edge-a", "ns", "p", "uid-1", export+stmt), "edge-a", "ns", "p", "uid-1", export, stmt); ok {
		t.Error("an export signature verified as an endpoint signature")
	}
	if _, ok := Verify(pub, sig, "edge-a", "ns", "p", "uid-1", export); ok {
		t.Error("an endpoint signature verified as an export signature")
	}
	type args struct{ cluster, ns, pod, uid, export, endpoint string }
	base := args{"edge-a", "ns", "p", "uid-1", export, stmt}
	with := func(f func(*args)) args { a := base; f(&a); return a }
	for _, tc := range []struct {
		name   string
		key    ed25519.PublicKey
		sig    string
		a      args
		reason Reason
	}{
		{"another cluster", pub, sig, with(func(a *args) { a.cluster = "edge-b" }), ReasonBadSignature},
		{"another namespace", pub, sig, with(func(a *args) { a.ns = "ns2" }), ReasonBadSignature},
		{"another Pod", pub, sig, with(func(a *args) { a.pod = "q" }), ReasonBadSignature},
		{"the Pod recreated", pub, sig, with(func(a *args) { a.uid = "uid-2" }), ReasonBadSignature},
		{"another export", pub, sig, with(func(a *args) { a.export = `{"services":[{"name":"db"}]}` }), ReasonBadSignature},
		{"not ready", pub, sig, with(func(a *args) { a.endpoint = `{"ips":["10.0.0.1"],"seq":5}` }), ReasonBadSignature},
		{"another address", pub, sig, with(func(a *args) { a.endpoint = `{"ips":["10.0.0.2"],"ready":true,"seq":5}` }), ReasonBadSignature},
		{"an older seq", pub, sig, with(func(a *args) { a.endpoint = `{"ips":["10.0.0.1"],"ready":true,"seq":4}` }), ReasonBadSignature},
		{"bytes moved from export to endpoint", pub, sig, with(func(a *args) { a.export, a.endpoint = export[:len(export)-1], "}"+stmt }), ReasonBadSignature},
		{"another key", otherPub, sig, base, ReasonBadSignature},
		{"unsigned", pub, "", base, ReasonUnsigned},
		{"no prefix", pub, strings.TrimPrefix(sig, SignaturePrefix), base, ReasonBadSignature},
		{"another prefix", pub, "rsa:" + strings.TrimPrefix(sig, SignaturePrefix), base, ReasonBadSignature},
		{"not base64", pub, SignaturePrefix + "!!!", base, ReasonBadSignature},
		{"too short", pub, SignaturePrefix + "AAAA", base, ReasonBadSignature},
		{"hostile length", pub, SignaturePrefix + strings.Repeat("A", 1<<16), base, ReasonBadSignature},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.a
			r, ok := VerifyEndpoint(tc.key, tc.sig, a.cluster, a.ns, a.pod, a.uid, a.export, a.endpoint)
			if ok || r.Reason != tc.reason || r.Index != -1 || r.Detail == "" || len(r.String()) > 300 {
				t.Errorf("VerifyEndpoint = %v, %v; want a short refusal with reason %s", r, ok, tc.reason)
			}
		})
	}
}

// FuzzParseEndpoint checks that no input panics, that what is accepted obeys
// every rule, and that an accepted statement formats and reads back the same.
func FuzzParseEndpoint(f *testing.F) {
	for _, s := range []string{
		`{"ips":["10.0.0.1","fd00::1"],"hostname":"web-0","ready":true,"seq":1790000000000}`,
		`{"ips":["::ffff:10.0.0.1","10.0.0.1"],"seq":1}`,
		`{"ips":["fe80::1%eth0"],"seq":1}`,
		`{"seq":0}`,
		`{"seq":1}{"seq":2}`,
		`{"SEQ":1,"Ips":[]}`,
		`null`,
		``,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		e, ips, err := ParseEndpoint(raw)
		if err != nil {
			if len(err.Error()) > 300 {
				t.Fatalf("refusal of %d bytes", len(err.Error()))
			}
			return
		}
		if len(raw) > MaxEndpointBytes || e.Seq == 0 || len(ips) > 2 || len(ips) != len(e.IPs) {
			t.Fatalf("accepted %q as %+v, %v", raw, e, ips)
		}
		if e.Hostname != "" && len(validation.IsDNS1123Label(e.Hostname)) > 0 {
			t.Fatalf("accepted hostname %q", e.Hostname)
		}
		for i, a := range ips {
			if !a.IsValid() || a.Zone() != "" || a.Is4In6() || (i == 1 && a == ips[0]) {
				t.Fatalf("accepted addresses %v", ips)
			}
		}
		again, ips2, err := ParseEndpoint(FormatEndpoint(e))
		if err != nil || FormatEndpoint(again) != FormatEndpoint(e) || !slices.Equal(ips2, ips) {
			t.Fatalf("%+v formats to what reads back as %+v, %v, %v", e, again, ips2, err)
		}
	})
}
