package annotation

import (
	"strings"
	"testing"
	"time"
)

// The annotation's value reads into the entry's fields and writes back the
// same; an unknown value is refused with what is expected, never guessed.
func TestParseStaleEndpoints(t *testing.T) {
	for _, c := range []struct {
		value  string
		policy string
		grace  int32
		err    string // a part of the error; "": none
		back   string // FormatStaleEndpoints of the result; "": value
	}{
		{value: "serve"},
		{value: " serve ", back: "serve"},
		{value: "drop-after=30s", policy: StaleDrop, grace: 30},
		{value: "drop-after=5m", policy: StaleDrop, grace: 300, back: "drop-after=5m0s"},
		{value: "drop-after=0s", policy: StaleDrop},
		{value: "drop-if-local-after=30s", policy: StaleDropIfLocal, grace: 30},
		{value: "drop-after=168h", policy: StaleDrop, grace: MaxStaleGrace, back: "drop-after=168h0m0s"},
		{value: "", err: "want serve, drop-after=DURATION or drop-if-local-after=DURATION"},
		{value: "Serve", err: "want serve"},
		{value: "drop", err: "want serve"},
		{value: "drop-if-local", err: "want serve"},
		{value: "keep", err: "want serve"},
		{value: "drop-after=30", err: "drop-after takes a duration"},
		{value: "drop-after=", err: "drop-after takes a duration"},
		{value: "drop-if-local-after=soon", err: "drop-if-local-after takes a duration"},
		{value: "drop-after=-1s", err: "whole seconds from 0s to 168h0m0s"},
		{value: "drop-after=1500ms", err: "whole seconds"},
		{value: "drop-after=169h", err: "whole seconds from 0s to 168h0m0s"},
		{value: "drop-after=" + strings.Repeat("9", 1000) + "s", err: "takes a duration"},
	} {
		policy, grace, err := ParseStaleEndpoints(c.value)
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want one saying %q", c.value, err, c.err)
			} else if len(err.Error()) > 300 {
				t.Errorf("%q: an error of %d octets", c.value, len(err.Error()))
			}
			continue
		case err != nil:
			t.Errorf("%q: %v", c.value, err)
			continue
		case policy != c.policy || grace != c.grace:
			t.Errorf("%q: %q %d, want %q %d", c.value, policy, grace, c.policy, c.grace)
		}
		back := c.back
		if back == "" {
			back = c.value
		}
		if got := FormatStaleEndpoints(policy, grace); got != back {
			t.Errorf("%q written back as %q, want %q", c.value, got, back)
		}
		s := Service{StaleEndpoints: policy, StaleGraceSeconds: grace}
		if r, bad := checkServiceFields(&s); bad {
			t.Errorf("%q: its fields are refused in an entry: %v", c.value, r)
		}
	}
	if p := (&Service{}).StalePolicy(); p != StaleServe {
		t.Errorf("default policy %q, want %q", p, StaleServe)
	}
}

// The rule's matrix: each policy, in contact, within the grace, at it and
// past it, with and without local endpoints. hasLocal is asked only when
// its answer decides.
func TestDropsStale(t *testing.T) {
	const grace = 30 * time.Second
	for _, policy := range []string{"", StaleServe, StaleDrop, StaleDropIfLocal} {
		for _, out := range []time.Duration{0, grace - time.Second, grace, grace + time.Second} {
			for _, local := range []bool{false, true} {
				s := Service{StaleEndpoints: policy}
				if policy == StaleDrop || policy == StaleDropIfLocal {
					s.StaleGraceSeconds = int32(grace / time.Second)
				}
				asked := false
				got := s.DropsStale(out, func() bool { asked = true; return local })
				past := out > grace
				want := past && (policy == StaleDrop || policy == StaleDropIfLocal && local)
				if got != want {
					t.Errorf("%q, out of contact %s, local %t: drops %t, want %t", policy, out, local, got, want)
				}
				if asked != (past && policy == StaleDropIfLocal) {
					t.Errorf("%q, out of contact %s: hasLocal asked %t", policy, out, asked)
				}
			}
		}
	}
	// A grace of 0 drops as soon as the cluster is out of contact at all.
	s := Service{StaleEndpoints: StaleDrop}
	if s.DropsStale(0, nil) || !s.DropsStale(time.Nanosecond, nil) {
		t.Errorf("drop-after=0s: in contact %t, out of contact %t", s.DropsStale(0, nil), s.DropsStale(time.Nanosecond, nil))
	}
}
