package mcsannotations

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// A port name that breaks the IANA service-name rule (an older annotator
// wrote any DNS label; here 16 characters) costs only that name: the service
// still answers A, its good port still has its SRV name, the bad name has
// none. The drop is logged and counted under reason invalid_port_name.
func TestBadPortNameDropsOnlyTheName(t *testing.T) {
	const anno = `{"services":[{"name":"legacy","ports":[{"name":"abcdefghijklmnop","port":80},{"name":"http","port":81}]}]}`
	counter := rejectedAnnotations.WithLabelValues("edge-a", string(annotation.ReasonPortName))
	before := testutil.ToFloat64(counter)
	logs := captureLog(t)
	withClient(t, fakeAPI(exporter("old", "10.0.0.1", anno)))
	i, udp, _ := serveSnapshot(t, filepath.Join(t.TempDir(), "table.db"))
	defer stopServer(i)

	waitAnswer(t, udp, "legacy.default.svc.clusterset.local.", []string{"10.0.0.1"})
	if r := exchange(t, "udp", udp, "_http._tcp.legacy.default.svc.clusterset.local.", dns.TypeSRV, 0); len(r.Answer) != 1 {
		t.Errorf("SRV of the good port: %v, want one record", r.Answer)
	}
	if r := exchange(t, "udp", udp, "_abcdefghijklmnop._tcp.legacy.default.svc.clusterset.local.", dns.TypeSRV, 0); len(r.Answer) != 0 {
		t.Errorf("SRV of the dropped name: %v, want none", r.Answer)
	}
	if got := testutil.ToFloat64(counter) - before; got != 1 {
		t.Errorf("rejected_annotations_total{reason=invalid_port_name} rose by %v, want 1", got)
	}
	if !strings.Contains(logs(), `1 port names dropped`) || !strings.Contains(logs(), `"abcdefghijklmnop"`) {
		t.Errorf("no log line names the dropped port name:\n%s", logs())
	}
	if strings.Contains(logs(), "entries skipped") {
		t.Errorf("the entry is logged as skipped:\n%s", logs())
	}
}
