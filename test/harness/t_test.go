package harness

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// What the tests pass to the harness must keep compiling.
var (
	_ T = (*testing.T)(nil)
	_ T = (*testing.B)(nil)
	_ T = testing.TB(nil)
)

// fatalRecorder is a T whose Fatalf records its message and ends the
// goroutine, as testing.T's does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fatalOf runs f in its own goroutine and returns what it failed with ("":
// it did not).
func fatalOf(f func(T)) string {
	r := &fatalRecorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.msg
}

func TestConsistently(t *testing.T) {
	calls := 0
	msg := fatalOf(func(ft T) {
		Consistently(ft, 50*time.Millisecond, 10*time.Millisecond, func() error { calls++; return nil })
	})
	if msg != "" {
		t.Fatalf("Consistently failed with every call passing: %s", msg)
	}
	if calls < 2 {
		t.Fatalf("Consistently called f %d times within 50ms at a 10ms interval", calls)
	}

	calls = 0
	msg = fatalOf(func(ft T) {
		Consistently(ft, time.Hour, time.Millisecond, func() error {
			calls++
			if calls == 3 {
				return errors.New("the third call fails")
			}
			return nil
		})
	})
	if !strings.Contains(msg, "the third call fails") || calls != 3 {
		t.Fatalf("Consistently: failed with %q after %d calls, want the third call's error after 3", msg, calls)
	}
}
