// Package harness runs the pieces of an end-to-end test of mcsannotations on
// one machine, without Docker: real etcd and kube-apiserver processes (one pair
// per simulated cluster), the test acting as the kubelet, a TCP proxy that can
// cut or blackhole a link to an API server, and the real bin/coredns.
//
// Everything listens on 127.0.0.1 on ports the harness picks; every process is
// started with its output in the test's temporary folder, stopped by PID in
// t.Cleanup (SIGTERM, then SIGKILL), and the tail of its log is printed when
// the test fails. Every wait is bounded.
//
// Functions take a T (the subset of testing.TB the harness uses), so that a
// program such as test/demo or test/bench can drive the harness as well
// as a test (see Program).
//
// Binaries come from the environment (see Tools): MCS_E2E_ETCD,
// MCS_E2E_APISERVER and MCS_E2E_COREDNS, defaulting to what `make tools` and
// `make build` produce. A test whose binaries are missing is skipped, unless
// CI=true, where it fails.
package harness
