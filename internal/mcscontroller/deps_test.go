package mcscontroller

import (
	"os/exec"
	"strings"
	"testing"
)

// The MCS controller reads the record store (internal/store) and never builds
// a DNS index: neither it nor the annotator binary that runs it depends on
// the DNS answer table or on a DNS library. (go list reads the import graph
// from the sources: no build.)
func TestNoDNSDependency(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the dependencies with")
	}
	out, err := exec.Command(goTool, "list", "-deps", ".", "../../cmd/mcs-annotator").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	forbidden := []string{
		"github.com/mcsannotations/mcsannotations/internal/table",
		"github.com/miekg/dns",
		"github.com/coredns/coredns",
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list named %d packages: %q", len(deps), out)
	}
	for _, dep := range deps {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("the MCS controller or the annotator depends on %s", dep)
			}
		}
	}
}
