package main

import "testing"

// A report's command line names paths inside the checkout relative to it,
// and leaves every other argument as it was given.
func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "go run ./test/bench"},
		{[]string{"-relay", "-relay-out", "/src/mcs/bench/relay"}, "go run ./test/bench -relay -relay-out bench/relay"},
		{[]string{"-relay-out=/src/mcs/bench/relay", "-relay-runs", "7"}, "go run ./test/bench -relay-out=bench/relay -relay-runs 7"},
		{[]string{"-compare-coredns", "/old/bin/coredns"}, "go run ./test/bench -compare-coredns /old/bin/coredns"},
		{[]string{"/src/mcs-other/x", "/src/mcs"}, "go run ./test/bench /src/mcs-other/x ."},
		{[]string{"relative/path", "-smoke"}, "go run ./test/bench relative/path -smoke"},
	} {
		if got := commandLine("/src/mcs", tc.args); got != tc.want {
			t.Errorf("commandLine(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}
