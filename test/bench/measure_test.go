package main

import (
	"strings"
	"testing"
)

// dnsperf 2.10's output of a -v run, shortened.
const dnsperfOutput = `DNS Performance Testing Tool
Version 2.10.0

[Status] Command line: dnsperf -s 127.0.0.1 -p 34663 -d queries-A.txt -l 1 -c 4 -t 2 -Q 1000 -v
> NOERROR svc-00035.bench-003.svc.clusterset.local. A 0.029437
> NOERROR svc-00027.bench-003.svc.clusterset.local. A 0.000513
[Status] Testing complete (time limit)

Statistics:

  Queries sent:         1003
  Queries completed:    1000 (99.70%)
  Queries lost:         3 (0.30%)

  Response codes:       NOERROR 1000 (100.00%)
  Average packet size:  request 58, response 170
  Run time (s):         1.032403
  Queries per second:   968.614001

  Average Latency (s):  0.009892 (min 0.000040, max 0.100301)
`

func TestParseDNSPerf(t *testing.T) {
	p, err := parseDNSPerf(perf{Raw: "x.txt"}, dnsperfOutput, true)
	if err != nil {
		t.Fatal(err)
	}
	if p.QPS != 968.614001 || p.Completed != 1000 || p.Lost != 3 || p.Rcodes != "NOERROR 1000 (100.00%)" || len(p.Latencies) != 2 || p.Latencies[1] != 0.000513 {
		t.Errorf("parsed %+v", p)
	}
	if _, err := parseDNSPerf(perf{}, strings.Split(dnsperfOutput, "[Status] Testing")[0], false); err == nil {
		t.Error("no error for output without a summary")
	}
	if _, err := parseDNSPerf(perf{}, strings.ReplaceAll(dnsperfOutput, "> NOERROR", "NOERROR"), true); err == nil {
		t.Error("no error for -v output without per-query lines")
	}
}
