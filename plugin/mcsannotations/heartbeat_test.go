package mcsannotations

import (
	"crypto/ed25519"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/relay"
)

// hub_heartbeat sets, under verify, how old an origin's heartbeat may be
// for a hub's word that the origin is connected to count, and
// hub_require_pod_lists makes that word need the origin's Pod list from the
// start (its list by UID with uids).
func TestParseHubHeartbeat(t *testing.T) {
	keys := t.TempDir()
	writeKey(t, keys, "edge-a")
	writeKey(t, keys, "origin-1")
	for _, tc := range []struct {
		input string
		err   string // substring of the error; "" for success
		want  time.Duration
		lists bool
		uids  bool
	}{
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n}", want: 0},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_heartbeat 90s\n}", want: 90 * time.Second},
		{input: "mcsannotations {\n hub_heartbeat 10m\n cluster edge-a\n verify " + keys + "\n hub hub-1 /h1.yaml\n}", want: 10 * time.Minute},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_heartbeat\n}", err: "hub_heartbeat takes exactly one argument, got 0"},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_heartbeat 1m 2m\n}", err: "hub_heartbeat takes exactly one argument, got 2"},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_heartbeat 300\n}", err: `:5 - Error during parsing: hub_heartbeat "300": must be a positive duration such as 5m`},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_heartbeat -5m\n}", err: `hub_heartbeat "-5m": must be a positive duration`},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_heartbeat 0s\n}", err: `hub_heartbeat "0s": must be a positive duration`},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_heartbeat 5m\n hub_heartbeat 6m\n}", err: ":6 - Error during parsing: hub_heartbeat is given twice"},
		{input: "mcsannotations {\n cluster edge-a\n verify " + keys + "\n hub_heartbeat 5m\n}", err: "hub_heartbeat without a hub"},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n hub_heartbeat 5m\n}", err: "hub_heartbeat without verify: only a reader that verifies checks the origins' heartbeats"},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_require_pod_lists\n}", lists: true},
		{input: "mcsannotations {\n hub_require_pod_lists\n cluster edge-a\n verify " + keys + "\n hub hub-1 /h1.yaml\n}", lists: true},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_require_pod_lists uids\n}", lists: true, uids: true},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_require_pod_lists yes\n}", err: `:5 - Error during parsing: hub_require_pod_lists takes no argument or uids, got "yes"`},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_require_pod_lists uids uids\n}", err: `hub_require_pod_lists takes no argument or uids, got "uids uids"`},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_require_pod_lists\n hub_require_pod_lists uids\n}", err: ":6 - Error during parsing: hub_require_pod_lists is given twice"},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n hub_require_pod_lists uids\n}", err: "hub_require_pod_lists without verify"},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n verify " + keys + "\n hub_require_pod_lists\n hub_require_pod_lists\n}", err: ":6 - Error during parsing: hub_require_pod_lists is given twice"},
		{input: "mcsannotations {\n cluster edge-a\n verify " + keys + "\n hub_require_pod_lists\n}", err: "hub_require_pod_lists without a hub"},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n hub_require_pod_lists\n}", err: "hub_require_pod_lists without verify: only a reader that verifies checks the origins' Pod lists"},
	} {
		t.Run(tc.input, func(t *testing.T) {
			cfg, ok := parseCase(t, tc.input, tc.err)
			if ok && (cfg.hubBeat != tc.want || cfg.hubLists != tc.lists || cfg.hubUIDLists != tc.uids) {
				t.Errorf("hub_heartbeat %v, hub_require_pod_lists %v (uids %v); want %v, %v (%v)", cfg.hubBeat, cfg.hubLists, cfg.hubUIDLists, tc.want, tc.lists, tc.uids)
			}
		})
	}
}

// withBeat returns l, a hub's Lease of its origin, carrying the origin's
// heartbeat of at signed with key, as the hub copies it.
func withBeat(l *coordinationv1.Lease, key ed25519.PrivateKey, at time.Time) *coordinationv1.Lease {
	origin := l.Labels[relay.OriginLabel]
	hb := annotation.FormatHeartbeat(annotation.Heartbeat{Cluster: origin, Time: at.UnixMilli()})
	l.Annotations[relay.HeartbeatAnnotation] = hb
	l.Annotations[relay.HeartbeatSignatureAnnotation] = annotation.SignHeartbeat(key, origin, hb)
	return l
}
