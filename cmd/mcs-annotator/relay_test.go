package main

import (
	"strings"
	"testing"
	"time"
)

// --relay needs the MCS controller, and its Leases go where the election's
// Lease goes (--lease-namespace, else $POD_NAMESPACE); those of clusters no
// longer read go after --relay-lease-grace, a positive duration.
func TestRelayFlag(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "mcs-system")
	for _, tc := range []struct {
		args      []string
		relay     bool
		namespace string
		grace     time.Duration
		err       string
	}{
		{args: []string{"--cluster", "hub", "--mcs-controller", "--relay"}, relay: true, namespace: "mcs-system", grace: time.Minute},
		{args: []string{"--cluster", "hub", "--mcs-controller", "--relay", "--lease-namespace", "hub-ns"}, relay: true, namespace: "hub-ns", grace: time.Minute},
		{args: []string{"--cluster", "hub", "--mcs-controller"}, namespace: "mcs-system", grace: time.Minute},
		{args: []string{"--cluster", "hub", "--mcs-controller", "--relay", "--relay-lease-grace", "10s"}, relay: true, namespace: "mcs-system", grace: 10 * time.Second},
		{args: []string{"--cluster", "hub", "--relay"}, err: "-relay needs -mcs-controller"},
		{args: []string{"--cluster", "hub", "--mcs-controller", "--relay", "--relay-lease-grace", "0s"}, err: "--relay-lease-grace 0s: must be positive"},
	} {
		o, err := parseFlags(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || o.relay != tc.relay || o.leaseNamespace != tc.namespace || o.relayLeaseGrace != tc.grace {
			t.Errorf("%v: relay %v in %q, grace %v (%v), want %v in %q, grace %v", tc.args, o.relay, o.leaseNamespace, o.relayLeaseGrace, err, tc.relay, tc.namespace, tc.grace)
		}
	}
}
