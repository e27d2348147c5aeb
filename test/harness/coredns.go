package harness

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// coreDNSReadyTimeout bounds the wait for a started CoreDNS to answer.
const coreDNSReadyTimeout = 30 * time.Second

// CoreDNS is bin/coredns running as a child process with a Corefile, on a
// port of 127.0.0.1 (UDP and TCP) chosen by the harness.
type CoreDNS struct {
	Port         int
	Dir          string // CoreDNS's own temporary folder (Corefile, log; a place for snapshots)
	Corefile     string // the rendered Corefile
	CorefilePath string

	proc *Process
}

var (
	placeholder  = regexp.MustCompile(`\{[A-Z][A-Z0-9_]*\}`)
	bindLoopback = regexp.MustCompile(`(?m)^\s*bind\s+127\.0\.0\.1\s*$`)
)

// StartCoreDNS renders the Corefile template and runs CoreDNS with it, waits
// until it answers over UDP and TCP, and stops it by PID in t.Cleanup (also
// when the test fails, when the tail of its log is printed too).
//
// The template's placeholders are {PORT} (the chosen port), {DIR} (the
// folder of this CoreDNS) and {KEY} for each key of vars, for example
// {KUBECONFIG}. A placeholder left unreplaced fails the test. CoreDNS's own
// {$ENV} syntax is left alone. The Corefile must say `bind 127.0.0.1`.
func StartCoreDNS(t T, tmpl string, vars map[string]string) *CoreDNS {
	t.Helper()
	return StartCoreDNSWith(t, "", tmpl, vars)
}

// StartCoreDNSWith is StartCoreDNS with another coredns binary, or a script
// that execs one (under a profiler, pinned to a CPU); "" for bin/coredns.
func StartCoreDNSWith(t T, bin, tmpl string, vars map[string]string) *CoreDNS {
	t.Helper()
	if bin == "" {
		bin = RequireTools(t, ToolCoreDNS).CoreDNS
	}
	d := &CoreDNS{Port: FreePort(t), Dir: TempDir(t)}
	pairs := []string{"{PORT}", strconv.Itoa(d.Port), "{DIR}", d.Dir}
	for k, v := range vars {
		pairs = append(pairs, "{"+k+"}", v)
	}
	d.Corefile = strings.NewReplacer(pairs...).Replace(tmpl)
	if left := placeholder.FindAllString(d.Corefile, -1); len(left) > 0 {
		t.Fatalf("harness: Corefile placeholders with no value: %v\n%s", left, d.Corefile)
	}
	if !bindLoopback.MatchString(d.Corefile) {
		t.Fatalf("harness: the Corefile must keep CoreDNS on the loopback (`bind 127.0.0.1` in each server block):\n%s", d.Corefile)
	}
	d.CorefilePath = filepath.Join(d.Dir, "Corefile")
	if err := os.WriteFile(d.CorefilePath, []byte(d.Corefile), 0o644); err != nil {
		t.Fatalf("harness: %v", err)
	}
	d.proc = newProcess("coredns", filepath.Join(d.Dir, "coredns.log"), bin, "-conf", d.CorefilePath)
	if err := PortFree(d.Port); err != nil {
		t.Fatalf("harness: refusing to start CoreDNS: %v (a server already there would share the traffic through SO_REUSEPORT)", err)
	}
	startProcess(t, d.proc, 80)
	d.waitAnswer(t)
	t.Logf("harness: CoreDNS PID %d answers on %s (log %s)", d.proc.PID(), d.Addr(), d.proc.LogPath)
	return d
}

// Addr is CoreDNS's host:port (UDP and TCP).
func (d *CoreDNS) Addr() string { return net.JoinHostPort(Loopback, strconv.Itoa(d.Port)) }

// Process is the CoreDNS process.
func (d *CoreDNS) Process() *Process { return d.proc }

// Running tells whether CoreDNS is running (it has not crashed or been stopped).
func (d *CoreDNS) Running() bool { return d.proc.Running() }

// LogTail returns the last n lines of CoreDNS's output.
func (d *CoreDNS) LogTail(n int) string { return Tail(d.proc.LogPath, n) }

// LogPath is the file that holds CoreDNS's output.
func (d *CoreDNS) LogPath() string { return d.proc.LogPath }

// Log returns CoreDNS's whole output so far.
func (d *CoreDNS) Log() string {
	b, _ := os.ReadFile(d.proc.LogPath)
	return string(b)
}

// Stop stops CoreDNS by PID: SIGTERM, then SIGKILL.
func (d *CoreDNS) Stop(t T) {
	t.Helper()
	if err := d.proc.Stop(termGrace); err != nil {
		t.Fatalf("harness: %v", err)
	}
}

// Kill sends sig (SIGKILL for a crash) and waits until CoreDNS has exited.
func (d *CoreDNS) Kill(t T, sig syscall.Signal) {
	t.Helper()
	if err := d.proc.Kill(sig, termGrace); err != nil {
		t.Fatalf("harness: %v", err)
	}
}

// Start starts CoreDNS again after Stop or Kill, with the same Corefile on the
// same port, and waits until it answers.
func (d *CoreDNS) Start(t T) {
	t.Helper()
	if err := PortFree(d.Port); err != nil {
		t.Fatalf("harness: refusing to start CoreDNS: %v", err)
	}
	if err := d.proc.start(); err != nil {
		t.Fatalf("harness: %v", err)
	}
	d.waitAnswer(t)
}

// Restart stops CoreDNS (SIGTERM, then SIGKILL) and starts it again with the
// same Corefile on the same port.
func (d *CoreDNS) Restart(t T) {
	t.Helper()
	d.Stop(t)
	d.Start(t)
}

// waitAnswer waits until CoreDNS answers a query over UDP and over TCP. Any
// answer counts, REFUSED included: this checks the server listens, not what
// the plugin knows.
func (d *CoreDNS) waitAnswer(t T) {
	t.Helper()
	deadline := time.Now().Add(coreDNSReadyTimeout)
	var last error
	for time.Now().Before(deadline) {
		if !d.proc.Running() {
			_, err := d.proc.Exited()
			t.Fatalf("harness: CoreDNS exited at start (%v); its log:\n%s", err, d.LogTail(40))
		}
		_, err := d.Exchange(Query{Name: "harness-probe.", Type: dns.TypeSOA, Timeout: 500 * time.Millisecond})
		if err == nil {
			_, err = d.Exchange(Query{Name: "harness-probe.", Type: dns.TypeSOA, TCP: true, Timeout: 500 * time.Millisecond})
			if err == nil {
				return
			}
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("harness: CoreDNS does not answer on %s after %s: %v", d.Addr(), coreDNSReadyTimeout, last)
}

// Exchange sends one query to this CoreDNS.
func (d *CoreDNS) Exchange(q Query) (*dns.Msg, error) {
	return Exchange(d.Addr(), q)
}

// Query sends one query over UDP (TCP when tcp is true) and fails the test
// when no answer comes back.
func (d *CoreDNS) Query(t T, name string, qtype uint16, tcp bool) *dns.Msg {
	t.Helper()
	m, err := d.Exchange(Query{Name: name, Type: qtype, TCP: tcp})
	if err != nil {
		t.Fatalf("harness: query %s %s: %v", name, dns.TypeToString[qtype], err)
	}
	return m
}

// String describes the server for messages.
func (d *CoreDNS) String() string {
	return fmt.Sprintf("CoreDNS on %s (PID %d)", d.Addr(), d.proc.PID())
}
