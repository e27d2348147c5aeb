package harness

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// How long a process gets to exit after SIGTERM before SIGKILL, and after SIGKILL.
const (
	termGrace = 10 * time.Second
	killGrace = 5 * time.Second
)

// Process is a child process started by the harness. Its stdout and stderr go
// to LogPath (appended across restarts).
type Process struct {
	Name    string
	LogPath string

	bin  string
	args []string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current run has exited
	waitErr error
	log     *os.File
}

// newProcess describes a process; start runs it.
func newProcess(name, logPath, bin string, args ...string) *Process {
	return &Process{Name: name, LogPath: logPath, bin: bin, args: args}
}

// start runs the process (again, when it has exited).
func (p *Process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !closed(p.done) {
		return fmt.Errorf("%s: already running as PID %d", p.Name, p.cmd.Process.Pid)
	}
	f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "=== harness: %s start %s: %s %s\n", time.Now().Format(time.RFC3339Nano), p.Name, p.bin, strings.Join(p.args, " "))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true, // not killed by a terminal's Ctrl-C aimed at go test; we stop it
		// If the test binary dies without running its cleanups (a panic, a
		// -timeout), the kernel kills the child instead of leaving it behind.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := spawn(cmd); err != nil {
		f.Close()
		return fmt.Errorf("%s: start %s: %w", p.Name, p.bin, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.waitErr, p.log = cmd, done, nil, f
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		fmt.Fprintf(f, "=== harness: %s %s exited: %v\n", time.Now().Format(time.RFC3339Nano), p.Name, err)
		f.Close()
		close(done)
	}()
	return nil
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// PID is the process ID of the current (or last) run, 0 before the first start.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running tells whether the process has been started and has not exited.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !closed(p.done)
}

// Exited returns a channel closed when the current run exits, and the error
// from Wait once it has.
func (p *Process) Exited() (<-chan struct{}, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		ch := make(chan struct{})
		close(ch)
		return ch, errors.New("never started")
	}
	return p.done, p.waitErr
}

// Signal sends sig to the process by PID.
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || closed(p.done) {
		return fmt.Errorf("%s: not running", p.Name)
	}
	return syscall.Kill(p.cmd.Process.Pid, sig)
}

// Wait waits up to d for the process to exit.
func (p *Process) Wait(d time.Duration) error {
	done, _ := p.Exited()
	select {
	case <-done:
		return nil
	case <-time.After(d):
		return fmt.Errorf("%s: PID %d still running after %s", p.Name, p.PID(), d)
	}
}

// Stop ends the process by PID: SIGTERM (and SIGCONT, in case it was stopped
// with SIGSTOP), then SIGKILL after grace. It returns once the process has
// exited, or an error when even SIGKILL did not end it in time.
func (p *Process) Stop(grace time.Duration) error {
	if !p.Running() {
		return nil
	}
	_ = p.Signal(syscall.SIGTERM)
	_ = p.Signal(syscall.SIGCONT)
	if p.Wait(grace) == nil {
		return nil
	}
	_ = p.Signal(syscall.SIGKILL)
	return p.Wait(killGrace)
}

// Kill sends sig (SIGTERM, SIGKILL, ...) and waits up to d for the exit.
func (p *Process) Kill(sig syscall.Signal, d time.Duration) error {
	if err := p.Signal(sig); err != nil {
		return err
	}
	if sig == syscall.SIGTERM {
		_ = p.Signal(syscall.SIGCONT)
	}
	return p.Wait(d)
}

// Pdeathsig fires when the OS thread that forked the child exits, not the
// process; Go may end threads (a goroutine that exits while locked to one). So
// every child is forked from one goroutine locked to a thread that never exits.
var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

type spawnReq struct {
	cmd  *exec.Cmd
	errc chan error
}

func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: this thread lives as long as the test binary
			for r := range spawnCh {
				r.errc <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	spawnCh <- spawnReq{cmd, errc}
	return <-errc
}

// startProcess starts a process and registers its cleanup: stop it by PID and,
// when the test failed, log the last tailLines lines of its output.
func startProcess(t T, p *Process, tailLines int) {
	t.Helper()
	if err := p.start(); err != nil {
		t.Fatalf("harness: %v", err)
	}
	if prog, ok := t.(*Program); ok {
		prog.started(p)
	}
	// Cleanups run last-registered first: the log tail is taken before the
	// stop, so that it shows the process at the failure, not its shutdown.
	t.Cleanup(func() {
		if err := p.Stop(termGrace); err != nil {
			t.Errorf("harness: %v", err)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			state := "running"
			if !p.Running() {
				_, err := p.Exited()
				state = fmt.Sprintf("exited: %v", err)
			}
			t.Logf("harness: last %d lines of %s (PID %d, %s; %s):\n%s", tailLines, p.Name, p.PID(), state, p.LogPath, Tail(p.LogPath, tailLines))
		}
	})
}

// Tail returns the last n lines of a file (at most the last 256 KiB of it).
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	const max = 256 << 10
	if st, err := f.Stat(); err == nil && st.Size() > max {
		_, _ = f.Seek(st.Size()-max, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	b = bytes.TrimRight(b, "\n")
	lines := bytes.Split(b, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// CPUTime is the CPU time (user + system, every thread) the current run has
// used, from /proc/PID/stat, whose unit is Linux's USER_HZ: 10 ms on every
// architecture Go supports.
func (p *Process) CPUTime() (time.Duration, error) {
	f, err := procStat(fmt.Sprintf("/proc/%d/stat", p.PID()))
	if err != nil {
		return 0, err
	}
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: /proc/%d/stat: %d fields", p.Name, p.PID(), len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14 of stat(5)
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%s: /proc/%d/stat: utime %q, stime %q", p.Name, p.PID(), f[11], f[12])
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// procStat reads a /proc stat file and returns its fields from the state
// on (field 3 of stat(5)): the command name before it, in parentheses, may
// hold spaces.
func procStat(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:]), nil
}

// StatusBytes reads a size (VmRSS, VmHWM, RssAnon) of the current run from
// /proc/PID/status, in bytes.
func (p *Process) StatusBytes(key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID()))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == key+":" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("%s: no %s in /proc/%d/status", p.Name, key, p.PID())
}

// ResetPeakRSS sets the process's VmHWM (its peak RSS) back to its RSS now,
// so that a later VmHWM is the peak since this call (Linux: clear_refs, 5).
func (p *Process) ResetPeakRSS() error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.PID()), []byte("5"), 0)
}
