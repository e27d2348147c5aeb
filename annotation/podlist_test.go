package annotation

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"strings"
	"testing"
)

// pods64 is the base64 of hashes, as a list carries them.
func pods64(hashes ...uint64) string {
	var b []byte
	for _, h := range hashes {
		b = binary.BigEndian.AppendUint64(b, h)
	}
	return base64.StdEncoding.EncodeToString(b)
}

func TestParsePodList(t *testing.T) {
	full := make([]uint64, MaxPodListPods+1)
	for i := range full {
		full[i] = uint64(i + 1)
	}
	for _, tc := range []struct {
		name string
		raw  string
		want int    // Pods in the set
		over bool   // a list over the cap, naming none
		err  string // a part of the refusal; "" accepts
	}{
		{name: "empty list", raw: `{"cluster":"east","time":1790000000000,"pods":""}`},
		{name: "two Pods", raw: `{"cluster":"east","time":1,"pods":"` + pods64(1, 2) + `"}`, want: 2},
		{name: "at the cap", raw: `{"cluster":"east","time":1,"pods":"` + pods64(full[:MaxPodListPods]...) + `"}`, want: MaxPodListPods},

		{name: "over the cap", raw: `{"cluster":"east","time":1,"pods":"` + pods64(full...) + `"}`, err: "over"},
		{name: "too large", raw: `{"cluster":"east","time":1,"pods":"` + strings.Repeat("A", MaxPodListBytes) + `"}`, err: "bytes, over"},
		{name: "unsorted", raw: `{"cluster":"east","time":1,"pods":"` + pods64(2, 1) + `"}`, err: "increasing order"},
		{name: "twice", raw: `{"cluster":"east","time":1,"pods":"` + pods64(3, 3) + `"}`, err: "increasing order"},
		{name: "not whole hashes", raw: `{"cluster":"east","time":1,"pods":"AAAA"}`, err: "8-byte hashes"},
		{name: "not base64", raw: `{"cluster":"east","time":1,"pods":"!!!!!!!!!!!!"}`, err: "8-byte hashes"},
		{name: "unpadded", raw: `{"cluster":"east","time":1,"pods":"` + strings.TrimRight(pods64(1), "=") + `"}`, err: "8-byte hashes"},
		{name: "unknown field", raw: `{"cluster":"east","time":1,"pods":"","more":true}`, err: `unknown field "more"`},
		{name: "no time", raw: `{"cluster":"east","pods":""}`, err: "without time"},
		{name: "negative time", raw: `{"cluster":"east","time":-1,"pods":""}`, err: "without time"},
		{name: "bad cluster", raw: `{"cluster":"East_1","time":1,"pods":""}`, err: "is not a cluster ID"},
		{name: "a second value", raw: `{"cluster":"east","time":1,"pods":""}{}`, err: "data after the value"},
		{name: "pods not a string", raw: `{"cluster":"east","time":1,"pods":[1]}`, err: "cannot unmarshal"},
		{name: "over, said", raw: `{"cluster":"east","time":1,"over":4097}`, over: true},
		{name: "over, at the cap", raw: `{"cluster":"east","time":1,"over":4096}`, err: "over 4096 Pods says 4096"},
		{name: "over, negative", raw: `{"cluster":"east","time":1,"over":-5}`, err: "says -5"},
		{name: "over, huge", raw: `{"cluster":"east","time":1,"over":9000000000}`, err: "says 9000000000"},
		{name: "over with pods", raw: `{"cluster":"east","time":1,"pods":"","over":5000}`, err: "both pods and over"},
		{name: "a heartbeat", raw: `{"cluster":"east","time":1}`, err: "without pods"},
		{name: "pods null", raw: `{"cluster":"east","time":1,"pods":null}`, err: "without pods"},
		{name: "not JSON", raw: `east`, err: "invalid character"},
		{name: "null", raw: `null`, err: "is not a cluster ID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, set, err := ParsePodList(tc.raw)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || len(err.Error()) > 300 {
					t.Fatalf("ParsePodList = %+v, %v; want a short refusal containing %q", l, err, tc.err)
				}
				if l != (PodList{}) || set.Len() != 0 || set.Over() {
					t.Errorf("refused, yet returned %+v with %d Pods", l, set.Len())
				}
				return
			}
			if err != nil || set.Len() != tc.want || set.Over() != tc.over {
				t.Fatalf("ParsePodList = %+v (%d Pods, over %v), %v; want %d Pods, over %v", l, set.Len(), set.Over(), err, tc.want, tc.over)
			}
			if again, _, err := ParsePodList(FormatPodList(l)); err != nil || again != l {
				t.Errorf("formats to what reads back as %+v, %v", again, err)
			}
		})
	}
}

func TestNewPodList(t *testing.T) {
	a, b, c := PodHash("default", "web-0"), PodHash("default", "web-1"), PodHash("other", "web-0")
	l, ok := NewPodList("east", 7, []uint64{c, a, b, a})
	if !ok {
		t.Fatal("NewPodList refused 3 Pods")
	}
	raw := FormatPodList(l)
	if len(raw) > MaxPodListBytes {
		t.Fatalf("%d bytes", len(raw))
	}
	got, set, err := ParsePodList(raw)
	if err != nil || got.Time != 7 || got.Cluster != "east" || set.Len() != 3 {
		t.Fatalf("ParsePodList(%s) = %+v (%d Pods), %v", raw, got, set.Len(), err)
	}
	for _, tc := range []struct {
		ns, name string
		want     bool
	}{
		{"default", "web-0", true}, {"default", "web-1", true}, {"other", "web-0", true},
		{"default", "web-2", false}, {"other", "web-1", false}, {"default/web", "0", false},
	} {
		if set.Has(tc.ns, tc.name) != tc.want {
			t.Errorf("Has(%s, %s) = %v, want %v", tc.ns, tc.name, !tc.want, tc.want)
		}
	}

	many := make([]uint64, MaxPodListPods)
	for i := range many {
		many[i] = PodHash("ns", strings.Repeat("p", 1+i%50)+string(rune('a'+i%26))+string(rune('a'+i/26%26))+string(rune('a'+i/676)))
	}
	l, ok = NewPodList("east", 1790000000000, many)
	if raw := FormatPodList(l); !ok || len(raw) > MaxPodListBytes {
		t.Errorf("at the cap: %v, %d bytes (bound %d)", ok, len(raw), MaxPodListBytes)
	} else if _, set, err := ParsePodList(raw); err != nil || set.Len() != MaxPodListPods {
		t.Errorf("at the cap: reads back %d Pods, %v", set.Len(), err)
	}
	over, ok := NewPodList("east", 1, append(many, PodHash("ns", "one-more"), PodHash("ns", "one-more")))
	if ok {
		t.Error("NewPodList took more than MaxPodListPods")
	}
	// Over the cap: a list that names none and says how many there are
	// (duplicates dropped), small whatever the count.
	raw = FormatPodList(over)
	if got, set, err := ParsePodList(raw); err != nil || got.Over != MaxPodListPods+1 || got.Time != 1 || set.Len() != 0 || !set.Over() || len(raw) > 100 {
		t.Errorf("over the cap: %s reads back as %+v (%d Pods, over %v), %v", raw, got, set.Len(), set.Over(), err)
	}
	if set := (PodSet{over: true}); set.Has("ns", "one-more") {
		t.Error("a list over the cap names a Pod")
	}
}

func TestVerifyPodList(t *testing.T) {
	pub, key := newKey(t)
	_, otherKey := newKey(t)
	l, _ := NewPodList("east", 1790000000000, []uint64{PodHash("default", "web-0")})
	list := FormatPodList(l)
	sig := SignPodList(key, "east", list)

	got, set, r, ok := VerifyPodList(pub, sig, "east", list)
	if !ok || got != l || !set.Has("default", "web-0") {
		t.Fatalf("VerifyPodList = %+v, %v, %v; want the list", got, r, ok)
	}

	wl, _ := NewPodList("west", 1790000000000, nil)
	westList := FormatPodList(wl)
	beat := FormatHeartbeat(Heartbeat{Cluster: "east", Time: 1790000000000})
	malformed := `{"cluster":"east","time":1,"pods":"AAAA"}`
	big := `{"cluster":"east","time":1,"pods":"` + strings.Repeat("A", MaxPodListBytes) + `"}`
	if _, _, ok := VerifyHeartbeat(pub, SignPodList(key, "east", beat), "east", beat); ok {
		t.Error("a list signature over a heartbeat's bytes verifies as the heartbeat's")
	}
	// Each refusal, for a list by name and a list by UID alike.
	for _, kind := range []struct {
		name   string
		sign   func(ed25519.PrivateKey, string, string) string
		verify func(ed25519.PublicKey, string, string, string) (PodList, PodSet, Rejection, bool)
	}{
		{"by name", SignPodList, VerifyPodList},
		{"by UID", SignPodUIDList, VerifyPodUIDList},
	} {
		sig := kind.sign(key, "east", list)
		for _, tc := range []struct {
			name                string
			sig, cluster, value string
			reason              Reason
		}{
			{"missing", "", "east", "", ReasonUnsigned},
			{"unsigned", "", "east", list, ReasonUnsigned},
			{"tampered", sig, "east", strings.Replace(list, "1790000000000", "1790000009999", 1), ReasonBadSignature},
			{"other cluster's name", sig, "west", list, ReasonBadSignature},
			{"other key", kind.sign(otherKey, "east", list), "east", list, ReasonBadSignature},
			{"names another cluster", kind.sign(key, "east", westList), "east", westList, ReasonClusterOutside},
			{"heartbeat signature", SignHeartbeat(key, "east", list), "east", list, ReasonBadSignature},
			{"heartbeat as a list", SignHeartbeat(key, "east", beat), "east", beat, ReasonBadSignature},
			{"endpoint signature", SignEndpoint(key, "east", "", "", "", "", list), "east", list, ReasonBadSignature},
			{"export signature", Sign(key, "east", "", "", "", list), "east", list, ReasonBadSignature},
			{"malformed", kind.sign(key, "east", malformed), "east", malformed, ReasonJSON},
			{"oversized", kind.sign(key, "east", big), "east", big, ReasonSize},
		} {
			t.Run(kind.name+"/"+tc.name, func(t *testing.T) {
				got, set, r, ok := kind.verify(pub, tc.sig, tc.cluster, tc.value)
				if ok || got != (PodList{}) || set.Len() != 0 || r.Reason != tc.reason || r.Index != -1 || r.Detail == "" || len(r.String()) > 300 {
					t.Errorf("verify = %+v, %v, %v; want a short refusal with reason %s", got, r, ok, tc.reason)
				}
			})
		}
	}
}

// A list by UID names a Pod by its UID too: the Pod made again under its
// name is another Pod. Its signature is its own: a list by name does not
// verify as one by UID, nor the reverse.
func TestVerifyPodUIDList(t *testing.T) {
	pub, key := newKey(t)
	l, _ := NewPodList("east", 1790000000000, []uint64{PodUIDHash("default", "web-0", "uid-2")})
	list := FormatPodList(l)
	sig := SignPodUIDList(key, "east", list)

	got, set, r, ok := VerifyPodUIDList(pub, sig, "east", list)
	if !ok || got != l || !set.ByUID() {
		t.Fatalf("VerifyPodUIDList = %+v, %v, %v; want the list by UID", got, r, ok)
	}
	if !set.HasHash(PodUIDHash("default", "web-0", "uid-2")) || set.HasHash(PodUIDHash("default", "web-0", "uid-1")) || set.HasHash(PodUIDHash("default", "web-1", "uid-2")) {
		t.Error("the list by UID does not name exactly web-0 of uid-2")
	}
	if set.Has("default", "web-0") {
		t.Error("a list by UID names a Pod by its name alone")
	}
	if _, _, r, ok := VerifyPodList(pub, sig, "east", list); ok || r.Reason != ReasonBadSignature {
		t.Errorf("a list by UID verifies as a list by name: %v", r)
	}
	byName := SignPodList(key, "east", list)
	if _, _, r, ok := VerifyPodUIDList(pub, byName, "east", list); ok || r.Reason != ReasonBadSignature || !strings.Contains(r.Detail, "by UID") {
		t.Errorf("a list by name verifies as a list by UID: %v", r)
	}
	if _, _, r, ok := VerifyPodUIDList(pub, "", "east", list); ok || r.Reason != ReasonUnsigned || !strings.Contains(r.Detail, PodUIDListSignatureAnnotation) {
		t.Errorf("unsigned list by UID: %v", r)
	}
	_, byNameSet, _, _ := VerifyPodList(pub, byName, "east", list)
	if byNameSet.ByUID() {
		t.Error("a list by name is taken as one by UID")
	}
}

// A list signature is none of the others: the messages differ by their
// context even over the same parts.
func TestPodListDomainSeparated(t *testing.T) {
	a := string(PodListSignedMessage("east", "x"))
	for _, b := range []string{string(PodUIDListSignedMessage("east", "x")), string(HeartbeatSignedMessage("east", "x")), string(SignedMessage("east", "x", "", "", "")), string(EndpointSignedMessage("east", "x", "", "", "", ""))} {
		if ctx := b[:strings.Index(b, "\n")+1]; strings.HasPrefix(a, ctx) || strings.HasPrefix(b, PodListSignatureContext) {
			t.Errorf("list message %q shares a context with %q", a, b)
		}
	}
}

// FuzzParsePodList checks that no input panics, that what is accepted obeys
// every rule, and that an accepted list formats and reads back the same.
func FuzzParsePodList(f *testing.F) {
	for _, s := range []string{
		`{"cluster":"east","time":1790000000000,"pods":""}`,
		`{"cluster":"east","time":1,"pods":"` + pods64(1, 2) + `"}`,
		`{"cluster":"east","time":1,"pods":"` + pods64(2, 1) + `"}`,
		`{"cluster":"east","time":1,"pods":"AAAA"}`,
		`{"cluster":"east","time":1}`,
		`{"cluster":"east","time":1,"over":5000}`,
		`{"cluster":"east","time":1,"pods":"","over":5000}`,
		`null`,
		``,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		l, set, err := ParsePodList(raw)
		if err != nil {
			if len(err.Error()) > 300 {
				t.Fatalf("refusal of %d bytes", len(err.Error()))
			}
			return
		}
		if len(raw) > MaxPodListBytes || l.Time <= 0 || !ValidClusterID(l.Cluster) || set.Len() > MaxPodListPods ||
			set.Over() != (l.Over != 0) || set.Over() && (set.Len() != 0 || l.Over <= MaxPodListPods || l.Pods != "") {
			t.Fatalf("accepted %q as %+v", raw, l)
		}
		for i := 1; i < len(set.hashes); i++ {
			if set.hashes[i-1] >= set.hashes[i] {
				t.Fatalf("accepted %q with hashes out of order", raw)
			}
		}
		if again, _, err := ParsePodList(FormatPodList(l)); err != nil || again != l {
			t.Fatalf("%+v formats to what reads back as %+v, %v", l, again, err)
		}
	})
}
