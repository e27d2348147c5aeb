package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"testing"
	"time"
)

// The snapshot's share of a cold start is the median of each cold start less
// the empty start timed just before it, not the difference of the medians:
// a slow moment slows both starts of a pair.
func TestSnapshotShare(t *testing.T) {
	ms := func(xs ...int) []time.Duration {
		var ds []time.Duration
		for _, x := range xs {
			ds = append(ds, time.Duration(x)*time.Millisecond)
		}
		return ds
	}
	c := coldResult{Runs: ms(300, 250, 400), EmptyRuns: ms(100, 60, 190)}
	// Pairs differ by 200, 190, 210: median 200.
	if d, ok := c.snapshotShare(); !ok || d != 200*time.Millisecond {
		t.Errorf("share %v, %v; want 200ms", d, ok)
	}
	c = coldResult{Runs: ms(300, 260, 400), EmptyRuns: ms(150, 60, 200)}
	// Pairs: 150, 200, 200 -> 200; medians: 300 - 150 = 150.
	if d, ok := c.snapshotShare(); !ok || d != 200*time.Millisecond {
		t.Errorf("share %v, %v; want 200ms (the median of the pairs)", d, ok)
	}
	for _, c := range []coldResult{{}, {Runs: ms(300, 250), EmptyRuns: ms(100)}} {
		if d, ok := c.snapshotShare(); ok {
			t.Errorf("%+v: share %v from unpaired runs", c, d)
		}
	}
}

// procCPU reads this process's own CPU time, which grows as it spins, and
// fails on a process that does not exist.
func TestProcCPU(t *testing.T) {
	if _, err := procCPU(1 << 30); err == nil {
		t.Error("no error for a PID that does not exist")
	}
	pid := os.Getpid()
	before, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		after, err := procCPU(pid)
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
	pid := os.Getpid()
	peak := func() int64 {
		t.Helper()
		n, err := procStatusBytes(pid, "VmHWM")
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
	if err := resetPeakRSS(pid); err != nil {
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
	if _, err := procStatusBytes(pid, "NoSuchField"); err == nil {
		t.Error("a missing field gave no error")
	}
	runtime.KeepAlive(b)
}

// The relist check reads the data cluster's "listed N Pods again" lines of
// CoreDNS's log, not the other sources' (their lists go through the same
// proxy: bytes alone cannot tell).
func TestListedPods(t *testing.T) {
	log := `[INFO] plugin/mcsannotations: serviceimports: listed 60 ServiceImports again in 16ms
[INFO] plugin/mcsannotations: clients: listed 0 Pods again in 11ms
[INFO] plugin/mcsannotations: cluster/bench-b: listed 7 Pods again in 3ms
[INFO] plugin/mcsannotations: cluster/bench-a: listed 123 Pods again in 15ms
[INFO] plugin/mcsannotations: cluster/bench-a: listed 124 Pods again in 1.2s
`
	if got := listedPods(log); !slices.Equal(got, []int{123, 124}) {
		t.Errorf("listedPods: %v, want [123 124]", got)
	}
	if got := listedPods("[INFO] plugin/mcsannotations: clients: listed 0 Pods again in 11ms\n"); len(got) != 0 {
		t.Errorf("listedPods of the clients' list: %v", got)
	}
}
