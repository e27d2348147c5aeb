package harness

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Query is one DNS question and how to send it.
type Query struct {
	Name string // made fully qualified when it is not
	Type uint16
	TCP  bool
	// UDPSize, when not zero, adds an EDNS0 OPT record advertising this
	// buffer size (and reads UDP answers that large). Zero: plain DNS, 512 bytes.
	UDPSize uint16
	// Source is the local IP to send from (any of 127.0.0.0/8, to look like
	// a given client); empty for the default.
	Source  string
	Timeout time.Duration // default 2 s
}

// Exchange sends one query to server (host:port) and returns the answer. A
// truncated UDP answer is returned as it is (TC set), not retried over TCP.
func Exchange(server string, q Query) (*dns.Msg, error) {
	m, _, err := ExchangeWire(server, q)
	return m, err
}

// ExchangeWire is Exchange that also returns the answer as it came on the
// wire (its length is the real message size, compression included).
func ExchangeWire(server string, q Query) (*dns.Msg, []byte, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(q.Name), q.Type)
	if q.UDPSize > 0 {
		m.SetEdns0(q.UDPSize, false)
	}
	timeout := q.Timeout
	if timeout == 0 {
		timeout = 2 * time.Second
	}
	c, err := q.client(timeout)
	if err != nil {
		return nil, nil, err
	}
	wire, err := exchange(c, m, server, timeout)
	if err != nil {
		proto := "udp"
		if q.TCP {
			proto = "tcp"
		}
		return nil, nil, fmt.Errorf("%s %s over %s to %s: %w", q.Name, dns.TypeToString[q.Type], proto, server, err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(wire); err != nil {
		return nil, wire, fmt.Errorf("%s %s: unpack %d-byte answer: %w", q.Name, dns.TypeToString[q.Type], len(wire), err)
	}
	return r, wire, nil
}

// exchange sends m and reads one answer with m's ID, as raw bytes.
func exchange(c *dns.Client, m *dns.Msg, server string, timeout time.Duration) ([]byte, error) {
	co, err := c.Dial(server)
	if err != nil {
		return nil, err
	}
	defer co.Close()
	// Read whatever comes, whatever size was advertised: an answer larger
	// than the query allowed must show as such, not be cut at the buffer.
	co.UDPSize = dns.MaxMsgSize
	_ = co.SetDeadline(time.Now().Add(timeout))
	if err := co.WriteMsg(m); err != nil {
		return nil, err
	}
	for {
		var h dns.Header
		wire, err := co.ReadMsgHeader(&h)
		if err != nil {
			return nil, err
		}
		if h.Id == m.Id {
			return wire, nil
		}
		// A late answer to an earlier query on a reused port: skip it.
	}
}

func (q Query) client(timeout time.Duration) (*dns.Client, error) {
	c := &dns.Client{Net: "udp", Timeout: timeout}
	if q.TCP {
		c.Net = "tcp"
	}
	if q.Source != "" {
		ip := net.ParseIP(q.Source)
		if ip == nil {
			return nil, fmt.Errorf("bad source address %q", q.Source)
		}
		d := &net.Dialer{Timeout: timeout}
		if q.TCP {
			d.LocalAddr = &net.TCPAddr{IP: ip}
		} else {
			d.LocalAddr = &net.UDPAddr{IP: ip}
		}
		c.Dialer = d
	}
	return c, nil
}

// Addrs returns the A and AAAA addresses of the answer section, sorted.
func Addrs(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch r := rr.(type) {
		case *dns.A:
			out = append(out, r.A.String())
		case *dns.AAAA:
			out = append(out, r.AAAA.String())
		}
	}
	sort.Strings(out)
	return out
}

// ExtraAddrs returns "name ip" for each A and AAAA record of the additional
// section, sorted.
func ExtraAddrs(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Extra {
		switch r := rr.(type) {
		case *dns.A:
			out = append(out, strings.ToLower(r.Hdr.Name)+" "+r.A.String())
		case *dns.AAAA:
			out = append(out, strings.ToLower(r.Hdr.Name)+" "+r.AAAA.String())
		}
	}
	sort.Strings(out)
	return out
}

// SRVs returns "port target" for each SRV record of the answer section, sorted,
// targets in lower case.
func SRVs(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		if r, ok := rr.(*dns.SRV); ok {
			out = append(out, strconv.Itoa(int(r.Port))+" "+strings.ToLower(r.Target))
		}
	}
	sort.Strings(out)
	return out
}

// TXTs returns the strings of the TXT records of the answer section, joined per record.
func TXTs(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		if r, ok := rr.(*dns.TXT); ok {
			out = append(out, strings.Join(r.Txt, ""))
		}
	}
	return out
}

// HasSOA tells whether the authority section holds an SOA record.
func HasSOA(m *dns.Msg) bool {
	for _, rr := range m.Ns {
		if _, ok := rr.(*dns.SOA); ok {
			return true
		}
	}
	return false
}

// Rcode is the answer's RCODE as text (NOERROR, NXDOMAIN, ...).
func Rcode(m *dns.Msg) string { return dns.RcodeToString[m.Rcode] }

// Eventually calls f every 100 ms until it returns nil, and fails the test
// with f's last error when that does not happen within timeout. It returns
// how long it took.
func Eventually(t T, timeout time.Duration, f func() error) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		err := f()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("not true after %s: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Consistently fails t at the first error f returns within dur, calling
// it every interval (and at least once).
func Consistently(t T, dur, interval time.Duration, f func() error) {
	t.Helper()
	for end := time.Now().Add(dur); ; time.Sleep(interval) {
		if err := f(); err != nil {
			t.Fatalf("not true throughout %s: %v", dur, err)
		}
		if !time.Now().Before(end) {
			return
		}
	}
}
