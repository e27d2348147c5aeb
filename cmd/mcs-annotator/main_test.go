package main

import (
	"strings"
	"testing"
)

// The local client's rate limit: kube-controller-manager's flag names,
// defaults high enough for the controller's first sync, and nothing that is
// not positive.
func TestKubeAPIRateFlags(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.kubeAPIQPS != 200 || o.kubeAPIBurst != 400 {
		t.Errorf("defaults: qps %v, burst %d; want 200, 400", o.kubeAPIQPS, o.kubeAPIBurst)
	}
	o, err = parseFlags([]string{"--kube-api-qps", "12.5", "--kube-api-burst", "30"})
	if err != nil || o.kubeAPIQPS != 12.5 || o.kubeAPIBurst != 30 {
		t.Errorf("set: qps %v, burst %d, %v", o.kubeAPIQPS, o.kubeAPIBurst, err)
	}
	for _, args := range [][]string{
		{"--kube-api-qps", "0"},
		{"--kube-api-qps", "-1"},
		{"--kube-api-qps", "NaN"},
		{"--kube-api-qps", "+Inf"},
		{"--kube-api-burst", "0"},
		{"--kube-api-qps", "fast"},
	} {
		if _, err := parseFlags(args); err == nil || !strings.Contains(err.Error(), "kube-api") {
			t.Errorf("%q: error %v, want one naming the flag", args, err)
		}
	}
}

// --sign-endpoints needs the signing key (and so --cluster): without it the
// annotator does not start, with a message naming both flags.
func TestSignEndpointsFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--sign-endpoints"}, "--sign-endpoints needs --sign-key"},
		{[]string{"--sign-endpoints", "--cluster", "edge-a"}, "--sign-endpoints needs --sign-key"},
		{[]string{"--sign-endpoints", "--sign-key", "key.pem"}, "--sign-key needs --cluster"},
		{[]string{"--sign-endpoints", "--sign-key", "key.pem", "--cluster", "edge-a"}, ""},
	} {
		o, err := parseFlags(tc.args)
		if tc.err == "" {
			if err != nil || !o.signEndpoints {
				t.Errorf("%q: %v, sign endpoints %v; want accepted", tc.args, err, o.signEndpoints)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: error %v, want one containing %q", tc.args, err, tc.err)
		}
	}
}

// --hub names relay hubs as --peer names peers: NAME=KUBECONFIG, each name
// once, only for the MCS controller.
func TestHubFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--hub", "hub-1=/k"}, "-hub needs -mcs-controller"},
		{[]string{"--mcs-controller", "--cluster", "edge", "--hub", "hub-1"}, "want NAME=KUBECONFIG"},
		{[]string{"--mcs-controller", "--cluster", "edge", "--hub", "Hub_1=/k"}, "hub \"Hub_1\": must be an RFC 1123 subdomain"},
		{[]string{"--mcs-controller", "--cluster", "edge", "--hub", "hub-1=/k", "--hub", "hub-1=/j"}, "hub \"hub-1\" named twice"},
		{[]string{"--mcs-controller", "--cluster", "edge", "--hub", "hub-1=/k", "--hub", "hub-2=/j", "--peer", "hub-1=/k"}, ""},
	} {
		o, err := parseFlags(tc.args)
		if tc.err == "" {
			if err != nil || len(o.hubs) != 2 || o.hubs[1] != (peer{"hub-2", "/j"}) || len(o.peers) != 1 {
				t.Errorf("%q: %v, hubs %v; want accepted", tc.args, err, o.hubs)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: error %v, want one containing %q", tc.args, err, tc.err)
		}
	}
}

// --hub-require-pod-lists needs hubs, and verify to check the lists;
// --hub-require-pod-uid-lists implies it.
func TestHubRequirePodListsFlag(t *testing.T) {
	keys := t.TempDir()
	writePub(t, keys, "edge")
	for _, tc := range []struct {
		args []string
		err  string
		uids bool
	}{
		{args: []string{"--mcs-controller", "--cluster", "edge", "--hub-require-pod-lists"}, err: "-hub-require-pod-lists needs -hub"},
		{args: []string{"--mcs-controller", "--cluster", "edge", "--hub", "hub-1=/k", "--hub-require-pod-lists"}, err: "-hub-require-pod-lists needs -verify"},
		{args: []string{"--mcs-controller", "--cluster", "edge", "--hub", "hub-1=/k", "--hub-require-pod-uid-lists"}, err: "-hub-require-pod-lists needs -verify"},
		{args: []string{"--mcs-controller", "--cluster", "edge", "--hub", "hub-1=/k", "--verify", keys, "--hub-require-pod-lists"}},
		{args: []string{"--mcs-controller", "--cluster", "edge", "--hub", "hub-1=/k", "--verify", keys, "--hub-require-pod-uid-lists"}, uids: true},
	} {
		o, err := parseFlags(tc.args)
		if tc.err == "" {
			if err != nil || !o.hubLists || o.hubUIDLists != tc.uids {
				t.Errorf("%q: %v, require %v, by UID %v; want accepted, on, by UID %v", tc.args, err, o.hubLists, o.hubUIDLists, tc.uids)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: error %v, want one containing %q", tc.args, err, tc.err)
		}
	}
}

// --snapshot-dir is the MCS controller's: without --mcs-controller the
// annotator does not start.
func TestSnapshotDirFlag(t *testing.T) {
	if _, err := parseFlags([]string{"--snapshot-dir", "/var/lib/x"}); err == nil || !strings.Contains(err.Error(), "-snapshot-dir needs -mcs-controller") {
		t.Errorf("without --mcs-controller: %v", err)
	}
	o, err := parseFlags([]string{"--snapshot-dir", "/var/lib/x", "--mcs-controller", "--cluster", "edge-a"})
	if err != nil || o.snapshotDir != "/var/lib/x" {
		t.Errorf("with --mcs-controller: %q, %v", o.snapshotDir, err)
	}
}
