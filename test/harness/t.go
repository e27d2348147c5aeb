package harness

// T is what the harness needs from its caller: *testing.T, *testing.B and
// testing.TB satisfy it, and so does Program, for a program that is not a
// test (test/demo, test/bench), which testing.TB forbids with its
// private method.
//
// The harness relies on these semantics, which a program's implementation
// must keep: Fatalf and Skip do not return (testing runs runtime.Goexit; a
// program may exit after running its cleanups); Cleanup functions run last
// registered first, once, also after a failure; TempDir returns a new folder
// that is removed after the cleanups registered before it was made; Failed
// reports whether Errorf or Fatalf was called.
type T interface {
	Helper()
	Name() string
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skip(args ...any)
	Failed() bool
	Cleanup(f func())
	TempDir() string
}
