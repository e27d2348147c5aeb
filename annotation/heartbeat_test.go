package annotation

import (
	"crypto/ed25519"
	"strings"
	"testing"
)

func TestParseHeartbeat(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  string
		want Heartbeat
		err  string // a part of the refusal; "" accepts
	}{
		{name: "plain", raw: `{"cluster":"east","time":1790000000000}`, want: Heartbeat{Cluster: "east", Time: 1790000000000}},
		{name: "dotted cluster", raw: `{"cluster":"east.example","time":1}`, want: Heartbeat{Cluster: "east.example", Time: 1}},

		{name: "too large", raw: `{"cluster":"east","time":1,"x":"` + strings.Repeat("a", MaxHeartbeatBytes) + `"}`, err: "bytes, over"},
		{name: "unknown field", raw: `{"cluster":"east","time":1,"state":"connected"}`, err: `unknown field "state"`},
		{name: "no time", raw: `{"cluster":"east"}`, err: "without time"},
		{name: "time 0", raw: `{"cluster":"east","time":0}`, err: "without time"},
		{name: "negative time", raw: `{"cluster":"east","time":-5}`, err: "without time"},
		{name: "time not a number", raw: `{"cluster":"east","time":"1"}`, err: "cannot unmarshal"},
		{name: "time past 64 bits", raw: `{"cluster":"east","time":9223372036854775808}`, err: "cannot unmarshal"},
		{name: "no cluster", raw: `{"time":1}`, err: "is not a cluster ID"},
		{name: "bad cluster", raw: `{"cluster":"East_1","time":1}`, err: "is not a cluster ID"},
		{name: "long cluster is clipped", raw: `{"cluster":"` + strings.Repeat("a", 200) + `","time":1}`, err: "..."},
		{name: "a second value", raw: `{"cluster":"east","time":1}{"cluster":"east","time":2}`, err: "data after the value"},
		{name: "not JSON", raw: `east@1`, err: "invalid character"},
		{name: "empty", raw: ``, err: "EOF"},
		{name: "null", raw: `null`, err: "is not a cluster ID"},
		{name: "an array", raw: `[{"cluster":"east","time":1}]`, err: "cannot unmarshal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ParseHeartbeat(tc.raw)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || len(err.Error()) > 300 {
					t.Fatalf("ParseHeartbeat = %+v, %v; want a short refusal containing %q", h, err, tc.err)
				}
				if h != (Heartbeat{}) {
					t.Errorf("refused, yet returned %+v", h)
				}
				return
			}
			if err != nil || h != tc.want {
				t.Errorf("ParseHeartbeat = %+v, %v; want %+v", h, err, tc.want)
			}
			if again, err := ParseHeartbeat(FormatHeartbeat(h)); err != nil || again != h {
				t.Errorf("formats to what reads back as %+v, %v", again, err)
			}
		})
	}
}

func TestVerifyHeartbeat(t *testing.T) {
	pub, key := newKey(t)
	_, otherKey := newKey(t)
	beat := FormatHeartbeat(Heartbeat{Cluster: "east", Time: 1790000000000})
	sig := SignHeartbeat(key, "east", beat)

	h, r, ok := VerifyHeartbeat(pub, sig, "east", beat)
	if !ok || h.Cluster != "east" || h.Time != 1790000000000 || h.At().UnixMilli() != 1790000000000 {
		t.Fatalf("VerifyHeartbeat = %+v, %v, %v; want the heartbeat", h, r, ok)
	}

	westBeat := FormatHeartbeat(Heartbeat{Cluster: "west", Time: 1790000000000})
	// A heartbeat that east's key signed yet names another cluster: only a
	// key used for two clusters makes one, and it is still refused.
	misnamed := SignHeartbeat(key, "east", westBeat)
	big := `{"cluster":"east","time":1,"x":"` + strings.Repeat("a", MaxHeartbeatBytes) + `"}`
	malformed := `{"cluster":"east","time":0}`
	for _, tc := range []struct {
		name                string
		key                 ed25519.PublicKey
		sig, cluster, value string
		reason              Reason
	}{
		{"missing", pub, "", "east", "", ReasonUnsigned},
		{"unsigned", pub, "", "east", beat, ReasonUnsigned},
		{"tampered", pub, sig, "east", strings.Replace(beat, "1790000000000", "1790000009999", 1), ReasonBadSignature},
		{"other cluster's name", pub, sig, "west", beat, ReasonBadSignature},
		{"other cluster's heartbeat", pub, SignHeartbeat(otherKey, "west", westBeat), "east", westBeat, ReasonBadSignature},
		{"other key", pub, SignHeartbeat(otherKey, "east", beat), "east", beat, ReasonBadSignature},
		{"names another cluster", pub, misnamed, "east", westBeat, ReasonClusterOutside},
		{"endpoint signature", pub, SignEndpoint(key, "east", "", "", "", "", beat), "east", beat, ReasonBadSignature},
		{"export signature", pub, Sign(key, "east", "", "", "", beat), "east", beat, ReasonBadSignature},
		{"malformed", pub, SignHeartbeat(key, "east", malformed), "east", malformed, ReasonJSON},
		{"oversized", pub, SignHeartbeat(key, "east", big), "east", big, ReasonSize},
		{"not a signature", pub, "ed25519:xx", "east", beat, ReasonBadSignature},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, r, ok := VerifyHeartbeat(tc.key, tc.sig, tc.cluster, tc.value)
			if ok || h != (Heartbeat{}) || r.Reason != tc.reason || r.Index != -1 || r.Detail == "" || len(r.String()) > 300 {
				t.Errorf("VerifyHeartbeat = %+v, %v, %v; want a short refusal with reason %s", h, r, ok, tc.reason)
			}
		})
	}
}

// A heartbeat signature is none of the other two: the messages differ by
// their context even over the same parts.
func TestHeartbeatDomainSeparated(t *testing.T) {
	a := string(HeartbeatSignedMessage("east", "x"))
	for _, b := range []string{string(SignedMessage("east", "x", "", "", "")), string(EndpointSignedMessage("east", "x", "", "", "", ""))} {
		if strings.HasPrefix(b, HeartbeatSignatureContext) || strings.HasPrefix(a, b[:strings.Index(b, "\n")+1]) {
			t.Errorf("heartbeat message %q shares a context with %q", a, b)
		}
	}
}

// FuzzParseHeartbeat checks that no input panics, that what is accepted obeys
// every rule, and that an accepted heartbeat formats and reads back the same.
func FuzzParseHeartbeat(f *testing.F) {
	for _, s := range []string{
		`{"cluster":"east","time":1790000000000}`,
		`{"cluster":"east","time":0}`,
		`{"CLUSTER":"east","Time":1}`,
		`{"cluster":"east","time":1}{}`,
		`null`,
		``,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		h, err := ParseHeartbeat(raw)
		if err != nil {
			if len(err.Error()) > 300 {
				t.Fatalf("refusal of %d bytes", len(err.Error()))
			}
			return
		}
		if len(raw) > MaxHeartbeatBytes || h.Time <= 0 || !ValidClusterID(h.Cluster) {
			t.Fatalf("accepted %q as %+v", raw, h)
		}
		if again, err := ParseHeartbeat(FormatHeartbeat(h)); err != nil || again != h {
			t.Fatalf("%+v formats to what reads back as %+v, %v", h, again, err)
		}
	})
}
