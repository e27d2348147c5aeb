package main

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// bench implements harness.T for a program (testing.TB cannot be
// implemented outside package testing). Fatalf panics with abort, which the
// stage runner recovers; cleanups run in main, last registered first, on
// success, failure and Ctrl-C alike.
type bench struct {
	mu       sync.Mutex
	failed   bool
	cleanups []func()
	start    time.Time
}

var _ harness.T = (*bench)(nil)

// abort is the panic value of Fatalf.
type abort struct{ msg string }

func (b *bench) Helper()      {}
func (b *bench) Name() string { return "mcs-bench" }

func (b *bench) Logf(format string, args ...any) {
	fmt.Printf("   [%6.1fs] %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

func (b *bench) Errorf(format string, args ...any) {
	b.mu.Lock()
	b.failed = true
	b.mu.Unlock()
	fmt.Fprintf(os.Stderr, "mcs-bench: ERROR: %s\n", fmt.Sprintf(format, args...))
}

func (b *bench) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	b.Errorf("%s", msg)
	panic(abort{msg})
}

func (b *bench) Skip(args ...any) { b.Fatalf("cannot run: %s", fmt.Sprint(args...)) }

func (b *bench) Failed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failed
}

func (b *bench) Cleanup(f func()) {
	b.mu.Lock()
	b.cleanups = append(b.cleanups, f)
	b.mu.Unlock()
}

func (b *bench) TempDir() string {
	dir, err := os.MkdirTemp("", "mcs-bench-*")
	if err != nil {
		b.Fatalf("temp folder: %v", err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// runCleanups runs every cleanup once, last first; a Fatalf in one does not
// stop the others.
func (b *bench) runCleanups() {
	for {
		b.mu.Lock()
		n := len(b.cleanups)
		if n == 0 {
			b.mu.Unlock()
			return
		}
		f := b.cleanups[n-1]
		b.cleanups = b.cleanups[:n-1]
		b.mu.Unlock()
		protect(f)
	}
}

// protect runs f and turns a Fatalf inside it into a false return.
func protect(f func()) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			if _, isAbort := v.(abort); !isAbort {
				panic(v)
			}
			ok = false
		}
	}()
	f()
	return true
}
