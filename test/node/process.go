package node

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// proc is one component of a node (etcd, kube-apiserver, kubelet, containerd,
// ...), started inside the node's network namespace by nsenter (which execs
// it: the PID we hold is the component's) and stopped by that PID.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
	// how it was started, for restart
	netns, mountNS, bin string
	args                []string
}

var (
	spawnOnce sync.Once
	spawnCh   chan func()
)

// onSpawnThread runs f on one locked OS thread: Pdeathsig belongs to the
// thread that forked, so the thread must outlive the children.
func onSpawnThread(f func()) {
	spawnOnce.Do(func() {
		spawnCh = make(chan func())
		go func() {
			runtime.LockOSThread()
			for g := range spawnCh {
				g()
			}
		}()
	})
	done := make(chan struct{})
	spawnCh <- func() { f(); close(done) }
	<-done
}

// startProc runs bin with args in the network namespace netns (a name under
// /run/netns; "" for the test's own) and, when mountNS is not "", in that
// mount namespace (a /proc/PID/ns/mnt path); output appended to logPath.
func startProc(name, logPath, netns, mountNS, bin string, args ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	argv := append([]string{bin}, args...)
	if mountNS != "" {
		argv = append([]string{"--mount=" + mountNS, "--"}, argv...)
	} else {
		argv = append([]string{"--"}, argv...)
	}
	if netns != "" {
		argv = append([]string{"nsenter", "--net=/run/netns/" + netns}, argv...)
	} else if mountNS != "" {
		argv = append([]string{"nsenter"}, argv...)
	} else {
		argv = argv[1:]
	}
	fmt.Fprintf(f, "=== node: %s start %s: %s\n", time.Now().Format(time.RFC3339Nano), name, strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	onSpawnThread(func() { err = cmd.Start() })
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{}),
		netns: netns, mountNS: mountNS, bin: bin, args: args}
	go func() {
		p.err = cmd.Wait()
		fmt.Fprintf(f, "=== node: %s %s exited: %v\n", time.Now().Format(time.RFC3339Nano), name, p.err)
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// restart starts the process again, as it was started (it must have exited).
func (p *proc) restart() (*proc, error) {
	if p.running() {
		return nil, fmt.Errorf("%s: still running as PID %d", p.name, p.pid())
	}
	return startProc(p.name, p.logPath, p.netns, p.mountNS, p.bin, p.args...)
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, then SIGKILL after grace; it returns once the process
// has exited (bounded: 5 s more after SIGKILL).
func (p *proc) stop(grace time.Duration) error {
	if !p.running() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("%s: PID %d still running 5 s after SIGKILL", p.name, p.pid())
	}
}

// tail is the last n lines of the process's log.
func (p *proc) tail(n int) string { return harness.Tail(p.logPath, n) }

// run runs a short command (in netns when not ""), bounded by timeout, and
// returns its combined output.
func run(timeout time.Duration, netns string, argv ...string) (string, error) {
	if netns != "" {
		argv = append([]string{"ip", "netns", "exec", netns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return out.String(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(out.String()))
		}
		return out.String(), nil
	case <-time.After(timeout):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return out.String(), fmt.Errorf("%s: no end after %s", strings.Join(argv, " "), timeout)
	}
}
