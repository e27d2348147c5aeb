package main

import (
	"strings"
	"testing"
)

// --relay needs the MCS controller, and its Leases go where the election's
// Lease goes (--lease-namespace, else $POD_NAMESPACE).
func TestRelayFlag(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "mcs-system")
	for _, tc := range []struct {
		args      []string
		relay     bool
		namespace string
		err       string
	}{
		{args: []string{"--cluster", "hub", "--mcs-controller", "--relay"}, relay: true, namespace: "mcs-system"},
		{args: []string{"--cluster", "hub", "--mcs-controller", "--relay", "--lease-namespace", "hub-ns"}, relay: true, namespace: "hub-ns"},
		{args: []string{"--cluster", "hub", "--mcs-controller"}, namespace: "mcs-system"},
		{args: []string{"--cluster", "hub", "--relay"}, err: "-relay needs -mcs-controller"},
	} {
		o, err := parseFlags(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || o.relay != tc.relay || o.leaseNamespace != tc.namespace {
			t.Errorf("%v: relay %v in %q (%v), want %v in %q", tc.args, o.relay, o.leaseNamespace, err, tc.relay, tc.namespace)
		}
	}
}
