package annotation

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestFormatExports(t *testing.T) {
	in := []Export{
		{Name: "backend", Namespace: "ns", Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080, Protocol: TCP}}},
		{Name: "db", Namespace: "ns", Cluster: "edge-a", Allowed: []string{"api", "web"}},
	}
	got, err := FormatExports(in, "ns", "edge-a")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"services":[{"name":"backend","namespace":"ns","ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}]},{"name":"db","namespace":"ns","cluster":"edge-a","allowedNamespaces":["api","web"]}]}`
	if got != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
	back, rej := ParseExports(got, "ns", "edge-a")
	in[0].Cluster = "edge-a" // the reader's default
	if len(rej) > 0 || !reflect.DeepEqual(back, in) {
		t.Errorf("reads back as %+v (%v), want %+v", back, rej, in)
	}
}

// What a reader would reject is an error naming the reader's reason, and
// nothing is returned to write.
func TestFormatExportsRefuses(t *testing.T) {
	big := make([]Port, MaxPortsPerExport)
	for i := range big {
		big[i] = Port{Name: strings.Repeat("p", 40) + string(rune('a'+i%26)) + string(rune('a'+i/26)), Port: int32(i + 1), Protocol: TCP}
	}
	many := make([]Export, 20)
	for i := range many {
		many[i] = Export{Name: "s" + string(rune('a'+i)), Namespace: "ns", Ports: big}
	}
	for _, tc := range []struct {
		name    string
		exports []Export
		reason  Reason
	}{
		{"another namespace", []Export{{Name: "a", Namespace: "other"}}, ReasonNamespaceOutside},
		{"another cluster", []Export{{Name: "a", Namespace: "ns", Cluster: "edge-b"}}, ReasonClusterOutside},
		{"a bad name", []Export{{Name: "Not_A_Label", Namespace: "ns"}}, ReasonName},
		{"twice", []Export{{Name: "a", Namespace: "ns"}, {Name: "a", Namespace: "ns"}}, ReasonDuplicate},
		// Readers drop a bad port name and keep the entry; the writer stays
		// strict and writes none.
		{"a bad port name", []Export{{Name: "a", Namespace: "ns", Ports: []Port{{Name: "abcdefghijklmnop", Port: 80, Protocol: TCP}}}}, ReasonPortName},
		{"too large", many, ReasonSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FormatExports(tc.exports, "ns", "edge-a")
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Rejection.Reason != tc.reason || got != "" {
				t.Errorf("got %q, %v; want no value and a FormatError with reason %s", got, err, tc.reason)
			}
		})
	}
}
