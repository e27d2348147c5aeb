package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// site is what a snapshot file holds, decoded with the plugin's codecs.
type site struct {
	File          string         `json:"file"`
	Copied        bool           `json:"copied"` // the file was locked (CoreDNS has it open) and was read from a consistent copy
	Sources       []sourceInfo   `json:"sources"`
	Clients       int            `json:"clients"` // local Pods known as DNS clients (imports, by IP)
	ClusterSetIPs []clusterSetIP `json:"clusterSetIPs"`
	Services      []serviceInfo  `json:"services"`

	pods          map[string][]*store.Pod // by cluster, for explain
	metas         map[string]snapshot.Meta
	clusterSetIPs []table.ClusterSetIP
}

type sourceInfo struct {
	Cluster string `json:"cluster"`
	Records int    `json:"records"`
	// Complete: the snapshot holds a complete list of the cluster's exporting
	// Pods (a full sync was written); otherwise only what changes brought.
	Complete     bool       `json:"complete"`
	LastContact  *time.Time `json:"lastContact"`  // last successful contact with its API server
	LastFullSync *time.Time `json:"lastFullSync"` // last complete list
	BadRecords   int        `json:"badRecords"`   // records the plugin would skip (and delete) at load
	// State is the source's state when the file was last written for it
	// ("connected", "syncing", "disconnected"; absent in files of older
	// builds).
	State string `json:"state,omitempty"`
	// Via names the hubs the cluster's records were relayed through when
	// the file was last written for it; absent: read directly.
	Via []string `json:"via,omitempty"`
}

type clusterSetIP struct {
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	IPs       []netip.Addr `json:"ips"`
	Ports     []string     `json:"ports,omitempty"`
}

type serviceInfo struct {
	Namespace string        `json:"namespace"`
	Name      string        `json:"name"`
	Clusters  []clusterInfo `json:"clusters"`
}

type clusterInfo struct {
	Cluster   string         `json:"cluster"`
	Ports     []string       `json:"ports,omitempty"` // name:port/protocol->targetPort
	Ready     int            `json:"ready"`
	Endpoints []endpointInfo `json:"endpoints"`
	// State is the cluster's: connected, stale, expired or unknown (stale.go).
	State string `json:"state"`
	// Age is how long it has been out of contact (absent when connected
	// or never contacted).
	Age *duration `json:"age,omitempty"`
	// Stale is the policy for its endpoints while it is out of contact.
	Stale staleView `json:"stale"`
}

// duration is a time.Duration written as a Go duration string in JSON.
type duration time.Duration

func (d duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

func (d *duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = duration(v)
	return err
}

type endpointInfo struct {
	Pod      string       `json:"pod"`
	Hostname string       `json:"hostname"` // the endpoint's DNS label: spec.hostname or the dashed IP
	IPs      []netip.Addr `json:"ips"`
	Ready    bool         `json:"ready"`
}

// runSnapshot prints what a snapshot file holds.
func runSnapshot(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := flags("snapshot", stderr)
	format := fs.String("o", "text", "output format: text or json")
	expire := fs.Duration("expire", 0, "the Corefile's expire, for which policy applies to a cluster out of contact (0: none)")
	local := fs.String("local", "", "the local cluster's ID, for drop-if-local-after policies")
	timeout := fs.Duration("timeout", 10*time.Second, "give up reading a file that CoreDNS keeps changing after this long")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (*format != "text" && *format != "json") {
		fmt.Fprintln(stderr, "usage: mcsctl snapshot FILE [-o text|json] [--expire D] [--local ID]")
		return errUsage
	}
	s, err := readSite(pos[0], *timeout)
	if err != nil {
		return err
	}
	now := time.Now()
	s.staleStates(now, *expire, *local)
	if *format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	printSite(stdout, s, now)
	return nil
}

// staleStates sets each service's clusters' state, age and stale policy at
// now, given the Corefile's expire and the local cluster ("" unknown).
func (s *site) staleStates(now time.Time, expire time.Duration, local string) {
	for i := range s.Services {
		svc := &s.Services[i]
		hasLocal := local != "" && localReady(s.pods[local], svc.Namespace, svc.Name)
		for j := range svc.Clusters {
			c := &svc.Clusters[j]
			state, age := contactState(s.metas[c.Cluster], now, expire)
			c.State = state
			if age > 0 {
				d := duration(age)
				c.Age = &d
			}
			c.Stale = applies(stalePolicyOf(s.pods[c.Cluster], svc.Namespace, svc.Name), expire, hasLocal, local != "")
		}
	}
}

// readSite reads a snapshot file read-only (a copy when CoreDNS holds it).
func readSite(path string, timeout time.Duration) (*site, error) {
	st, err := snapshot.OpenReadOnly(path, timeout)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	s := &site{File: path, Copied: st.ReadFromCopy(), pods: map[string][]*store.Pod{}, metas: map[string]snapshot.Meta{}}
	if _, err := st.LoadClients(func(*clients.Client, []netip.Addr) { s.Clients++ }); err != nil {
		return nil, err
	}
	if s.clusterSetIPs, _, err = st.LoadClusterSetIPs(); err != nil {
		return nil, err
	}
	err = st.Scan(func(name string, meta snapshot.Meta, records iter.Seq2[[]byte, []byte]) error {
		src := sourceInfo{Cluster: name, Complete: !meta.LastFullSync.IsZero(),
			LastContact: timePtr(meta.LastContact), LastFullSync: timePtr(meta.LastFullSync), State: meta.State, Via: meta.Via}
		s.metas[name] = meta
		dec := snapshot.NewPodDecoderFor(meta.Records)
		for k, v := range records {
			p, err := dec.Decode(v)
			if err != nil || p.Cluster != name || !snapshot.IsNameKey(k, p.Namespace, p.Name) {
				src.BadRecords++
				continue
			}
			s.pods[name] = append(s.pods[name], p)
		}
		src.Records = len(s.pods[name])
		s.Sources = append(s.Sources, src)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, ci := range s.clusterSetIPs {
		out := clusterSetIP{Namespace: ci.Namespace, Name: ci.Name, IPs: ci.IPs}
		for _, p := range ci.Ports {
			out.Ports = append(out.Ports, fmt.Sprintf("%s:%d/%s", p.Name, p.Port, p.Protocol))
		}
		s.ClusterSetIPs = append(s.ClusterSetIPs, out)
	}
	s.Services = services(s.pods)
	return s, nil
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// services groups the records by the services they export, then by cluster.
func services(pods map[string][]*store.Pod) []serviceInfo {
	type key struct{ ns, name string }
	by := map[key]map[string]*clusterInfo{}
	for cluster, ps := range pods {
		for _, p := range ps {
			for _, e := range p.Exports {
				k := key{e.Namespace, e.Name}
				if by[k] == nil {
					by[k] = map[string]*clusterInfo{}
				}
				ci := by[k][cluster]
				if ci == nil {
					ci = &clusterInfo{Cluster: cluster}
					by[k][cluster] = ci
				}
				for _, pt := range e.Ports {
					s := fmt.Sprintf("%s:%d/%s->%d", pt.Name, pt.Port, pt.Protocol, pt.TargetPort)
					if !slices.Contains(ci.Ports, s) {
						ci.Ports = append(ci.Ports, s)
					}
				}
				ci.Endpoints = append(ci.Endpoints, endpointInfo{Pod: p.Name, Hostname: p.EndpointHostname(), IPs: p.IPs, Ready: p.Ready && len(p.IPs) > 0})
				if p.Ready && len(p.IPs) > 0 {
					ci.Ready++
				}
			}
		}
	}
	var out []serviceInfo
	for k, cs := range by {
		svc := serviceInfo{Namespace: k.ns, Name: k.name}
		for _, ci := range cs {
			slices.Sort(ci.Ports)
			slices.SortFunc(ci.Endpoints, func(a, b endpointInfo) int { return strings.Compare(a.Pod, b.Pod) })
			svc.Clusters = append(svc.Clusters, *ci)
		}
		slices.SortFunc(svc.Clusters, func(a, b clusterInfo) int { return strings.Compare(a.Cluster, b.Cluster) })
		out = append(out, svc)
	}
	slices.SortFunc(out, func(a, b serviceInfo) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out
}

func printSite(w io.Writer, s *site, now time.Time) {
	how := ""
	if s.Copied {
		how = " (read from a copy: a running CoreDNS holds the file)"
	}
	fmt.Fprintf(w, "Snapshot %s%s\n\n", s.File, how)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tPATH\tRECORDS\tCOMPLETE\tSTATE WRITTEN\tLAST CONTACT\tLAST FULL SYNC\tBAD RECORDS")
	for _, src := range s.Sources {
		state := src.State
		if state == "" {
			state = "-"
		}
		path := "direct"
		if len(src.Via) > 0 {
			path = "via " + strings.Join(src.Via, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%t\t%s\t%s\t%s\t%d\n", src.Cluster, path, src.Records, src.Complete, state, ago(src.LastContact, now), ago(src.LastFullSync, now), src.BadRecords)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nLocal Pods known as DNS clients: %d\n", s.Clients)
	if len(s.ClusterSetIPs) > 0 {
		fmt.Fprintf(w, "\nClusterSetIP services (answered with these IPs instead of endpoints):\n")
		for _, ci := range s.ClusterSetIPs {
			fmt.Fprintf(w, "  %s/%s  %v  %s\n", ci.Namespace, ci.Name, ci.IPs, strings.Join(ci.Ports, " "))
		}
	}
	fmt.Fprintf(w, "\nServices: %d\n", len(s.Services))
	for _, svc := range s.Services {
		fmt.Fprintf(w, "  %s/%s\n", svc.Namespace, svc.Name)
		for _, c := range svc.Clusters {
			fmt.Fprintf(w, "    cluster %s: %d of %d endpoints ready; ports %s\n", c.Cluster, c.Ready, len(c.Endpoints), strings.Join(c.Ports, " "))
			if c.State != "" {
				age := time.Duration(-1)
				if c.Age != nil {
					age = time.Duration(*c.Age)
				}
				fmt.Fprintf(w, "      %s\n", staleLine(c.State, age, c.Stale))
			}
			for _, e := range c.Endpoints {
				state := "ready"
				if !e.Ready {
					state = "not ready"
				}
				fmt.Fprintf(w, "      %-30s %-20s %v %s\n", e.Pod, e.Hostname, e.IPs, state)
			}
		}
	}
}

func ago(t *time.Time, now time.Time) string {
	if t == nil {
		return "never"
	}
	return fmt.Sprintf("%s (%s ago)", t.Format(time.RFC3339), now.Sub(*t).Round(time.Second))
}
