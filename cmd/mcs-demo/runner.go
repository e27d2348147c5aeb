package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// runner drives the harness from a program: it implements harness.T, which
// *testing.T implements in the tests.
//
// Fatalf (and Skip, which a program cannot honour) marks the run failed,
// prints the message and ends the calling goroutine by panicking with a
// sentinel that the demo's goroutine and the cleanup loop recover. Cleanups
// run once, last registered first, in main, after the demo ends, fails or is
// interrupted (see main).
type runner struct {
	mu       sync.Mutex
	failed   bool
	step     string   // the current step, for failure messages
	cleanups []func() // run last first
	dirs     []string // temp folders made by TempDir
	pids     []int    // processes started, to check they are gone at the end
}

var _ harness.T = (*runner)(nil)

// fatal is the panic value of Fatalf.
type fatal struct{}

func (r *runner) Helper()      {}
func (r *runner) Name() string { return "mcs-demo" }

// Logf prints the harness's notes (cluster ready, PIDs, log tails) indented
// under the current step.
func (r *runner) Logf(format string, args ...any) {
	fmt.Println(indent(fmt.Sprintf(format, args...), "   "))
}

// Errorf marks the run failed and carries on.
func (r *runner) Errorf(format string, args ...any) {
	r.mu.Lock()
	r.failed = true
	step := r.step
	r.mu.Unlock()
	fmt.Fprintf(os.Stderr, "mcs-demo: ERROR%s: %s\n", step, fmt.Sprintf(format, args...))
}

// Fatalf marks the run failed, prints why, and ends the calling goroutine.
func (r *runner) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.failed = true
	step := r.step
	r.mu.Unlock()
	fmt.Fprintf(os.Stderr, "mcs-demo: FAILED%s: %s\n", step, fmt.Sprintf(format, args...))
	panic(fatal{})
}

// Skip is a failure here: the demo cannot be skipped (a missing tool).
func (r *runner) Skip(args ...any) {
	r.Fatalf("cannot run: %s", fmt.Sprint(args...))
}

func (r *runner) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *runner) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// TempDir makes a new folder under $TMPDIR, removed by a cleanup.
func (r *runner) TempDir() string {
	dir, err := os.MkdirTemp("", "mcs-demo-*")
	if err != nil {
		r.Fatalf("temp folder: %v", err)
	}
	r.mu.Lock()
	r.dirs = append(r.dirs, dir)
	r.mu.Unlock()
	r.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			r.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}

// setStep names the step that failure messages refer to.
func (r *runner) setStep(s string) {
	r.mu.Lock()
	r.step = s
	r.mu.Unlock()
}

// started records a process's PID for the final check.
func (r *runner) started(pids ...int) {
	r.mu.Lock()
	r.pids = append(r.pids, pids...)
	r.mu.Unlock()
}

// guard runs f and turns a Fatalf inside it into a return; any other panic
// goes on.
func guard(f func()) (failed bool) {
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(fatal); !ok {
				panic(v)
			}
			failed = true
		}
	}()
	f()
	return false
}

// runCleanups runs the cleanups, last registered first, each once; a
// Fatalf in one does not stop the others.
func (r *runner) runCleanups() {
	for {
		r.mu.Lock()
		n := len(r.cleanups)
		if n == 0 {
			r.mu.Unlock()
			return
		}
		f := r.cleanups[n-1]
		r.cleanups = r.cleanups[:n-1]
		r.mu.Unlock()
		guard(f)
	}
}

// leftovers returns the recorded processes still alive and the temp folders
// still present, after the cleanups.
func (r *runner) leftovers() (pids []int, dirs []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pid := range r.pids {
		if err := syscall.Kill(pid, 0); err == nil || !errors.Is(err, syscall.ESRCH) {
			pids = append(pids, pid)
		}
	}
	for _, d := range r.dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			dirs = append(dirs, d)
		}
	}
	return pids, dirs
}

func indent(s, prefix string) string {
	s = strings.TrimRight(s, "\n")
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}
