package harness

import (
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

// self is this test binary as a Process, to read its own /proc figures.
func self(t *testing.T) *Process {
	proc, err := os.FindProcess(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return &Process{Name: "self", cmd: &exec.Cmd{Process: proc}}
}

// CPUTime reads this process's own CPU time, which grows as it spins, and
// fails on a process that does not exist.
func TestCPUTime(t *testing.T) {
	gone := &Process{Name: "gone", cmd: &exec.Cmd{Process: &os.Process{Pid: 1 << 30}}}
	if _, err := gone.CPUTime(); err == nil {
		t.Error("no error for a PID that does not exist")
	}
	p := self(t)
	before, err := p.CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		after, err := p.CPUTime()
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			return
		}
		for i := 0; i < 1e7; i++ { // spin
			_ = i * i
		}
	}
	t.Error("CPU time did not grow in 5 s of spinning")
}

// The peak RSS of this process, once reset, falls back to its RSS (after a
// large buffer was freed) and grows again with what it touches after.
func TestPeakRSS(t *testing.T) {
	p := self(t)
	peak := func() int64 {
		t.Helper()
		n, err := p.StatusBytes("VmHWM")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	touch := func() []byte {
		b := make([]byte, 64<<20)
		for i := range b {
			b[i] = 1
		}
		return b
	}
	b := touch()
	high := peak()
	b = nil
	runtime.GC()
	debug.FreeOSMemory()
	if err := p.ResetPeakRSS(); err != nil {
		t.Fatal(err)
	}
	// A peak never falls unless reset; how far it falls depends on what the
	// runtime (and the race detector's shadow memory) gave back.
	low := peak()
	if low > high-8<<20 {
		t.Fatalf("peak %d after the reset, %d before it with 64 MB more in use", low, high)
	}
	b = touch()
	if again := peak(); again < low+32<<20 {
		t.Errorf("peak %d after touching 64 MB, %d before", again, low)
	}
	if _, err := p.StatusBytes("NoSuchField"); err == nil {
		t.Error("a missing field gave no error")
	}
	runtime.KeepAlive(b)
}
