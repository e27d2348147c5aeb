package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The start of a real `callgrind_annotate --threshold=100 --auto=no` listing
// (paths shortened), and what follows the function list.
const annotateListing = `--------------------------------------------------------------------------------
Ir                   
--------------------------------------------------------------------------------
844,560,197 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                    file:function
--------------------------------------------------------------------------------
175,765,643 (20.81%)  /usr/local/go/src/runtime/symtab.go:runtime.step [/work/main/bin/coredns]
122,282,534 (14.48%)  /usr/local/go/src/runtime/symtab.go:runtime.pcvalue [/work/main/bin/coredns]
 74,320,000 ( 8.80%)  /root/go/pkg/mod/github.com/miekg/dns@v1.1.73/msg.go:github.com/miekg/dns.packDomainName [/work/main/bin/coredns]
 25,627,078 ( 3.03%)  /usr/local/go/src/runtime/stack.go:runtime.adjustframe [/work/main/bin/coredns]
 22,235,712 ( 2.63%)  /usr/local/go/src/runtime/malloc.go:runtime.mallocgcSmallScanNoHeader [/work/main/bin/coredns]
 16,781,042 ( 1.99%)  /usr/local/go/src/runtime/stkframe.go:runtime.(*stkframe).getStackMap [/work/main/bin/coredns]
  8,862,419 ( 0.88%)  /usr/local/go/src/runtime/runtime1.go:runtime.pcvalue
  1,000,000 ( 0.12%)  /usr/local/go/src/runtime/stack.go:runtime.newstack'2 [/work/main/bin/coredns]
    500,000 ( 0.06%)  /usr/local/go/src/runtime/stack.go:runtime.stackpoolalloc [/work/main/bin/coredns]

--------------------------------------------------------------------------------
-- Auto-annotated source: /usr/local/go/src/runtime/stack.go
--------------------------------------------------------------------------------
  9,999,999 ( 1.00%)  /usr/local/go/src/runtime/stack.go:runtime.copystack [/work/main/bin/coredns]
`

func TestParseAnnotate(t *testing.T) {
	growth, top := parseAnnotate([]byte(annotateListing))
	// step, pcvalue (twice: once inlined elsewhere), adjustframe,
	// getStackMap, newstack'2; not packDomainName, malloc, stackpoolalloc,
	// nor anything after the list.
	want := int64(175765643 + 122282534 + 25627078 + 16781042 + 8862419 + 1000000)
	if growth != want {
		t.Errorf("stack growth %d, want %d", growth, want)
	}
	if got := len(strings.Split(top, "\n")); got != 9 {
		t.Errorf("top has %d lines, want the list's 9:\n%s", got, top)
	}
	if first := strings.Split(top, "\n")[0]; first != "175,765,643 (20.81%)  runtime.step" {
		t.Errorf("first line %q", first)
	}
	if g, top := parseAnnotate([]byte("no listing at all\n")); g != 0 || top != "" {
		t.Errorf("no listing: %d, %q", g, top)
	}
}

func TestCallgrindDumpsAndTotal(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "callgrind-ours.out")
	for _, name := range []string{"callgrind-ours.out", "callgrind-ours.out.10", "callgrind-ours.out.2", "callgrind-ours.out.1", "callgrind-ours.out.1.top.txt"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("events: Ir\nsummary: 5\ntotals: 1234567\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := callgrindDumps(out)
	want := []string{out + ".1", out + ".2", out + ".10"}
	if !slices.Equal(got, want) {
		t.Errorf("dumps %v, want %v (numeric order, no other files)", got, want)
	}
	n, err := callgrindTotal(got[0])
	if err != nil || n != 1234567 {
		t.Errorf("total %d, %v; want 1234567", n, err)
	}
	if err := os.WriteFile(out+".3", []byte("events: Ir\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := callgrindTotal(out + ".3"); err == nil {
		t.Error("a dump with no totals line gave no error")
	}
}
