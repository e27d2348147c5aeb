package harness

import "testing"

// What the tests pass to the harness must keep compiling.
var (
	_ T = (*testing.T)(nil)
	_ T = (*testing.B)(nil)
	_ T = testing.TB(nil)
)
