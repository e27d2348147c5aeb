package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// The three Corefiles: the same server block, the same auxiliary plugins
// (errors; pprof, which is not in the query path: it only opens an HTTP
// listener), no cache; only the answering plugin differs.
const (
	oursCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    errors
    pprof 127.0.0.1:{PPROF}
    mcsannotations clusterset.local {
        cluster {CLUSTER}
        kubeconfig {KUBECONFIG}
{EXTRA}        snapshot {SNAPSHOT}
        ttl 5
    }
}
`
	intreeCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    errors
    pprof 127.0.0.1:{PPROF}
    kubernetes cluster.local clusterset.local {
        kubeconfig {KUBECONFIG}
        multicluster clusterset.local
        ttl 5
    }
}
`
	hostsCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    errors
    pprof 127.0.0.1:{PPROF}
    hosts {HOSTS} clusterset.local {
        ttl 5
        reload 0
        no_reverse
    }
}
`
)

// startBound is how long a contender may take from its start to answering
// every sample correctly (the in-tree plugin lists every ServiceImport and
// EndpointSlice first).
const startBound = 3 * time.Minute

// Contender names.
const (
	ours   = "mcsannotations"
	hosts  = "hosts"
	intree = "kubernetes multicluster"
	// oursOld is ours on the build of -compare-coredns.
	oursOld = ours + ", old build"
)

// contender is one CoreDNS under test.
type contender struct {
	Name  string
	SRV   bool   // answers SRV (hosts does not: it answers A, AAAA and PTR only)
	bin   string // the coredns binary when started with no wrapper; "" for bin/coredns
	tmpl  string
	vars  map[string]string
	d     *harness.CoreDNS
	pprof string
}

// start runs the contender's CoreDNS, through wrapper when it is not ""
// (a script that execs bin/coredns pinned to CPU 0, or under a profiler),
// and returns how long it took to answer every sample correctly (at most
// bound).
func (c *contender) start(t harness.T, wrapper string, ds dataset, sample []int, bound time.Duration) time.Duration {
	vars := maps.Clone(c.vars)
	pp := harness.FreePort(t)
	vars["PPROF"] = strconv.Itoa(pp)
	c.pprof = "127.0.0.1:" + strconv.Itoa(pp)
	if wrapper == "" {
		wrapper = c.bin
	}
	start := time.Now()
	c.d = harness.StartCoreDNSWith(t, wrapper, c.tmpl, vars)
	waitCorrect(t, c, ds, sample, bound)
	return time.Since(start)
}

// binary is the contender's coredns binary, for symbols in its profiles.
func (c *contender) binary() string {
	if c.bin != "" {
		return c.bin
	}
	return harness.FindTools().CoreDNS
}

// stop stops the contender's CoreDNS.
func (c *contender) stop(t harness.T) {
	if c.d != nil && c.d.Running() {
		c.d.Stop(t)
	}
}

// keepLog copies the contender's CoreDNS log into the raw folder.
func (c *contender) keepLog(raw, tag string) {
	if c.d != nil {
		_ = os.WriteFile(filepath.Join(raw, "coredns-"+tag+".log"), []byte(c.d.Log()), 0o644)
	}
}

// wrapper writes a shell script that runs bin (a coredns binary, "" for
// bin/coredns) through cmd (exec keeps the PID, so the harness stops
// CoreDNS, or what runs it, itself) and returns its path.
func wrapper(t harness.T, dir, name, cmd, bin string) string {
	if bin == "" {
		bin = harness.FindTools().CoreDNS
	}
	path := filepath.Join(dir, name)
	script := fmt.Sprintf("#!/bin/sh\nexec %s %q \"$@\"\n", cmd, bin)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	return path
}

// pinWrapper writes a script that runs the contender's binary on CPU 0.
func (c *contender) pinWrapper(t harness.T, dir string) string {
	return wrapper(t, dir, "coredns-cpu0-"+strings.NewReplacer(" ", "-", ",", "").Replace(c.Name), "taskset -c 0", c.bin)
}

// check asks for service i and says what is wrong with the answer, "" if nothing.
func check(c *contender, ds dataset, i int, qtype uint16) string {
	name := ds.qname(i)
	if qtype == dns.TypeSRV {
		name = "_" + portName + "._tcp." + name
	}
	m, err := c.d.Exchange(harness.Query{Name: name, Type: qtype, Timeout: time.Second})
	if err != nil {
		return err.Error()
	}
	if m.Truncated {
		return name + ": truncated"
	}
	switch qtype {
	case dns.TypeA:
		got := harness.Addrs(m)
		slices.Sort(got)
		if want := ds.ips(i); !slices.Equal(got, want) {
			return fmt.Sprintf("%s A: %s %v, want %v", name, dns.RcodeToString[m.Rcode], got, want)
		}
	case dns.TypeSRV:
		n := 0
		for _, rr := range m.Answer {
			if s, ok := rr.(*dns.SRV); ok && s.Port == targetPort {
				n++
			}
		}
		if n != ds.endpoints {
			return fmt.Sprintf("%s SRV: %s, %d records with port %d, want %d", name, dns.RcodeToString[m.Rcode], n, targetPort, ds.endpoints)
		}
	}
	return ""
}

// waitCorrect waits until every sample service answers correctly (A, and
// SRV where the contender answers SRV), and returns how long that took.
func waitCorrect(t harness.T, c *contender, ds dataset, sample []int, bound time.Duration) time.Duration {
	start, bad := time.Now(), ""
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, bound, true, func(context.Context) (bool, error) {
		for _, i := range sample {
			if bad = check(c, ds, i, dns.TypeA); bad == "" && c.SRV {
				bad = check(c, ds, i, dns.TypeSRV)
			}
			if bad != "" {
				break
			}
		}
		return bad == "", nil
	})
	if err != nil {
		t.Fatalf("%s: wrong answer after %s: %s\n%s", c.Name, bound, bad, c.d.LogTail(20))
	}
	return time.Since(start)
}

// sampleOf picks about n services spread over the data set, first and last included.
func sampleOf(ds dataset, n int) []int {
	if n > ds.services {
		n = ds.services
	}
	out := []int{}
	for k := 0; k < n; k++ {
		out = append(out, k*(ds.services-1)/max(1, n-1))
	}
	return slices.Compact(out)
}

// ctxSleep sleeps d or until ctx ends.
func ctxSleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
