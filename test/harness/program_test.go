package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// A Fatalf ends only the function Run runs; cleanups run last first, each
// once, also after one of them fails; TempDir's folders are gone after them.
func TestProgramRunAndCleanups(t *testing.T) {
	p := NewProgram("test-program", func(string) {})
	var order []int
	var dir string
	ok := p.Run(func() {
		dir = p.TempDir()
		p.Cleanup(func() { order = append(order, 1) })
		p.Cleanup(func() { order = append(order, 2); p.Fatalf("cleanup fails") })
		p.Cleanup(func() { order = append(order, 3) })
		p.Fatalf("stop here")
		t.Error("Fatalf returned")
	})
	if ok || !p.Failed() {
		t.Errorf("Run %v, Failed %v after a Fatalf", ok, p.Failed())
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("TempDir's folder is gone before the cleanups: %v", err)
	}
	p.RunCleanups()
	p.RunCleanups() // each once
	if !slices.Equal(order, []int{3, 2, 1}) {
		t.Errorf("cleanups ran in the order %v, want [3 2 1]", order)
	}
	if procs, dirs := p.Leftovers(); len(procs) > 0 || len(dirs) > 0 {
		t.Errorf("leftovers %v %v", procs, dirs)
	}

	q := NewProgram("test-program", func(string) {})
	if !q.Run(func() { q.Errorf("carry on") }) || !q.Failed() {
		t.Error("Errorf ended Run or did not mark the program failed")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a panic that is not a Fatalf was swallowed")
			}
		}()
		q.Run(func() { panic("bug") })
	}()
}

// Every process the harness starts for a program is recorded: running
// until the cleanups stop it, then gone.
func TestProgramRecordsProcesses(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	p := NewProgram("test-program", func(string) {})
	dir := t.TempDir()
	proc := newProcess("sleeper", filepath.Join(dir, "sleep.log"), sleep, "60")
	if !p.Run(func() { startProcess(p, proc, 5) }) {
		t.Fatal("startProcess failed")
	}
	if procs, _ := p.Leftovers(); len(procs) != 1 {
		t.Fatalf("running processes %v, want the sleeper", procs)
	}
	p.RunCleanups()
	if procs, _ := p.Leftovers(); len(procs) > 0 {
		t.Errorf("still running after the cleanups: %v", procs)
	}
	if got := p.Processes(); len(got) != 1 {
		t.Errorf("processes %v, want one", got)
	}
}

// Main stops what work started and says how work ended in its exit code.
func TestProgramMain(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	for _, fail := range []bool{false, true} {
		p := NewProgram("test-program", func(string) {})
		var proc *Process
		code := p.Main(func() {
			proc = newProcess("sleeper", filepath.Join(p.TempDir(), "sleep.log"), sleep, "60")
			startProcess(p, proc, 5)
			if fail {
				p.Fatalf("work fails")
			}
		})
		if want := map[bool]int{false: 0, true: 1}[fail]; code != want {
			t.Errorf("failing work %v: exit code %d, want %d", fail, code, want)
		}
		if proc == nil || proc.Running() {
			t.Errorf("failing work %v: the process work started still runs after Main", fail)
		}
	}
}

// A Scoped program's cleanups run when its function ends; its failure is
// its own, and its parent still sees what it started.
func TestProgramScoped(t *testing.T) {
	p := NewProgram("test-program", func(string) {})
	var dir string
	cleaned := false
	ok := p.Scoped(func(s *Program) {
		dir = s.TempDir()
		s.Cleanup(func() { cleaned = true })
		s.Fatalf("fails")
	})
	if ok || p.Failed() || !cleaned {
		t.Errorf("Scoped %v, parent failed %v, cleanups ran %v; want false, false, true", ok, p.Failed(), cleaned)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the scoped folder is still there: %v", err)
	}
	if _, dirs := p.Leftovers(); len(dirs) != 0 {
		t.Errorf("parent's leftovers %v", dirs)
	}
	if !p.Scoped(func(*Program) {}) {
		t.Error("Scoped of a function that succeeds is false")
	}
}
