package harness

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
)

// Program is the T of a program that drives the harness (test/demo,
// test/bench): testing.TB cannot be implemented outside package testing.
//
// Fatalf (and Skip, which a program cannot honour) marks the run failed,
// prints the message and ends the calling function by panicking with a
// sentinel that Run recovers. Cleanups run once, last registered first, when
// the program calls RunCleanups, after the work ended, failed or was
// interrupted. Every process the harness starts for it is recorded, so that
// Leftovers can tell whether the cleanups stopped them all.
type Program struct {
	name string
	note func(msg string) // prints a Logf note

	mu       sync.Mutex
	failed   bool
	step     string     // the current step, for failure messages
	cleanups []func()   // run last first
	dirs     []string   // folders made by TempDir
	procs    []*Process // processes the harness started
	parent   *Program   // of a Scoped program: also records its processes and folders
}

var _ T = (*Program)(nil)

// NewProgram returns the T of the program name; note prints Logf's notes
// (nil: indented under the current step).
func NewProgram(name string, note func(msg string)) *Program {
	if note == nil {
		note = func(msg string) { fmt.Println(Indent(msg, "   ")) }
	}
	return &Program{name: name, note: note}
}

// fatal is the panic value of Fatalf.
type fatal struct{}

func (p *Program) Helper()      {}
func (p *Program) Name() string { return p.name }

func (p *Program) Logf(format string, args ...any) { p.note(fmt.Sprintf(format, args...)) }

// Errorf marks the run failed and carries on.
func (p *Program) Errorf(format string, args ...any) { p.fail("ERROR", format, args...) }

// Fatalf marks the run failed, prints why, and ends the calling function.
func (p *Program) Fatalf(format string, args ...any) {
	p.fail("FAILED", format, args...)
	panic(fatal{})
}

func (p *Program) fail(what, format string, args ...any) {
	p.mu.Lock()
	p.failed = true
	step := p.step
	p.mu.Unlock()
	fmt.Fprintf(os.Stderr, "%s: %s%s: %s\n", p.name, what, step, fmt.Sprintf(format, args...))
}

// Skip is a failure: a program cannot be skipped (a missing tool).
func (p *Program) Skip(args ...any) { p.Fatalf("cannot run: %s", fmt.Sprint(args...)) }

func (p *Program) Failed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

func (p *Program) Cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}

// TempDir makes a new folder under $TMPDIR, removed by a cleanup.
func (p *Program) TempDir() string {
	dir, err := os.MkdirTemp("", p.name+"-*")
	if err != nil {
		p.Fatalf("temp folder: %v", err)
	}
	for q := p; q != nil; q = q.parent {
		q.mu.Lock()
		q.dirs = append(q.dirs, dir)
		q.mu.Unlock()
	}
	p.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			p.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}

// SetStep names the step that failure messages refer to (" at step 3").
func (p *Program) SetStep(s string) {
	p.mu.Lock()
	p.step = s
	p.mu.Unlock()
}

// started records a process the harness started for the program.
func (p *Program) started(proc *Process) {
	for q := p; q != nil; q = q.parent {
		q.mu.Lock()
		q.procs = append(q.procs, proc)
		q.mu.Unlock()
	}
}

// Scoped runs f with a Program of its own, with p's name and notes, and runs
// its cleanups when f ends, so that what f starts does not outlive it (p's
// Leftovers still see it). It reports whether f succeeded; a failure in f
// does not fail p.
func (p *Program) Scoped(f func(t *Program)) bool {
	t := NewProgram(p.name, p.note)
	t.parent = p
	p.Cleanup(t.RunCleanups) // when p is interrupted first; a no-op after the call below
	ok := t.Run(func() { f(t) })
	t.RunCleanups()
	return ok && !t.Failed()
}

// Run runs f and reports whether it returned, false when a Fatalf ended it;
// any other panic goes on.
func (p *Program) Run(f func()) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			if _, isFatal := v.(fatal); !isFatal {
				panic(v)
			}
			ok = false
		}
	}()
	f()
	return true
}

// RunUntilSignal runs f (through Run) until it ends or the program gets
// SIGINT or SIGTERM. It reports whether f returned, and the signal when one
// came first (f may then still be running: run the cleanups and exit).
func (p *Program) RunUntilSignal(f func()) (ok bool, sig os.Signal) {
	done := make(chan bool, 1)
	go func() {
		ok := false
		defer func() { done <- ok }()
		ok = p.Run(f)
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	select {
	case ok := <-done:
		return ok, nil
	case s := <-sigs:
		return false, s
	}
}

// RunCleanups runs the cleanups, last registered first, each once; a
// Fatalf in one does not stop the others.
func (p *Program) RunCleanups() {
	for {
		p.mu.Lock()
		n := len(p.cleanups)
		if n == 0 {
			p.mu.Unlock()
			return
		}
		f := p.cleanups[n-1]
		p.cleanups = p.cleanups[:n-1]
		p.mu.Unlock()
		p.Run(f)
	}
}

// Processes describes every process the harness started ("etcd PID 123").
func (p *Program) Processes() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s []string
	for _, proc := range p.procs {
		s = append(s, fmt.Sprintf("%s PID %d", proc.Name, proc.PID()))
	}
	return s
}

// Leftovers returns the processes still running and the temporary folders
// still present: after RunCleanups, there should be none.
func (p *Program) Leftovers() (procs []string, dirs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, proc := range p.procs {
		if proc.Running() {
			procs = append(procs, fmt.Sprintf("%s PID %d", proc.Name, proc.PID()))
		}
	}
	for _, d := range p.dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			dirs = append(dirs, d)
		}
	}
	return procs, dirs
}

// Indent puts prefix before every line of s.
func Indent(s, prefix string) string {
	s = strings.TrimRight(s, "\n")
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// Main is the whole life of a program that drives the harness: it runs work
// until it ends or SIGINT or SIGTERM comes, then the cleanups, and checks
// that they stopped every process and removed every folder. It returns the
// exit code: 0; 1 when work failed or something was left behind; 130 after
// a signal.
func (p *Program) Main(work func()) int {
	ok, sig := p.RunUntilSignal(work)
	code := 0
	switch {
	case sig != nil:
		fmt.Printf("== interrupted (%v): stop every process by PID, remove the temporary folders\n", sig)
		p.SetStep(" after the interrupt") // work's goroutine may still report what it sees going
		code = 130
	case !ok || p.Failed():
		fmt.Println("== clean up after the failure: stop every process by PID, remove the temporary folders")
		p.SetStep(" at clean-up")
		code = 1
	default:
		fmt.Println("== clean up: stop every process by PID, remove the temporary folders")
		p.SetStep(" at clean-up")
	}
	p.RunCleanups()
	if procs, dirs := p.Leftovers(); len(procs) > 0 || len(dirs) > 0 {
		fmt.Fprintf(os.Stderr, "%s: FAILED (clean-up): still running: %v; still present: %v\n", p.name, procs, dirs)
		return max(code, 1)
	}
	fmt.Printf("   stopped every process (%s) and removed the temporary folders\n", strings.Join(p.Processes(), ", "))
	if code == 0 && p.Failed() {
		code = 1 // a cleanup failed
	}
	return code
}
