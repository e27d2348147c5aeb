package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// staleGrace is the plugin's (source.StaleGrace).
const staleGrace = source.StaleGrace

// The states of a cluster, as the plugin treats its records.
const (
	stateConnected = "connected" // its API server answers: current records
	stateStale     = "stale"     // out of contact: served as last seen, or dropped by the service's policy
	stateExpired   = "expired"   // out of contact for longer than expire: every record dropped
	stateUnknown   = "unknown"   // a file written before the state was kept
)

// contactState is a cluster's state at now, from its snapshot meta (the
// state it was written in, on each change, and the last contact) and the
// Corefile's expire (0: never), with how long it has been out of contact
// (0 when connected, -1 when it never had contact).
func contactState(m snapshot.Meta, now time.Time, expire time.Duration) (string, time.Duration) {
	if m.State == "connected" {
		return stateConnected, 0
	}
	if m.LastContact.IsZero() {
		if m.State == "" {
			return stateUnknown, -1
		}
		return stateStale, -1
	}
	age := now.Sub(m.LastContact)
	switch {
	case m.State == "":
		return stateUnknown, age
	case age <= staleGrace:
		return stateConnected, 0
	case expire > 0 && age >= expire:
		return stateExpired, age
	}
	return stateStale, age
}

// staleView is what applies to a cluster's endpoints of a service while the
// cluster is out of contact.
type staleView struct {
	Policy  string `json:"policy"`  // the service's, as its annotation: serve, drop-after=30s, ...
	Applies string `json:"applies"` // which applies, the service's or the Corefile's expire, and why
	// Drops: its endpoints leave the answers once it has been out of
	// contact for longer than DropAfter.
	Drops     bool          `json:"-"`
	DropAfter time.Duration `json:"-"`
}

// stalePolicyOf reads the stale policy of the entries of ns/name in pods (a
// cluster's records): the distinct values, sorted; the first is applied.
func stalePolicyOf(pods []*store.Pod, ns, name string) []string {
	var out []string
	for _, p := range pods {
		for _, e := range p.Exports {
			if e.Namespace == ns && e.Name == name {
				if v := annotation.FormatStaleEndpoints(e.StaleEndpoints, e.StaleGraceSeconds); !slices.Contains(out, v) {
					out = append(out, v)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// applies says which of the service's policy (policies[0]) and the
// Corefile's expire is the stricter for a cluster's endpoints: the sooner
// drop wins. local is whether the consumer has ready endpoints of the
// service; localKnown whether that is known (the local cluster was given).
func applies(policies []string, expire time.Duration, local, localKnown bool) staleView {
	v := staleView{Policy: "serve"}
	if len(policies) > 0 {
		v.Policy = policies[0]
	}
	policy, grace, _ := annotation.ParseStaleEndpoints(v.Policy)
	g := time.Duration(grace) * time.Second
	expireText := "no expire"
	if expire > 0 {
		expireText = "expire " + expire.String()
	}
	why := ""
	switch {
	case policy == annotation.StaleDropIfLocal && !localKnown:
		why = "; it applies only while the consumer has ready endpoints of its own: give --local"
		policy = annotation.StaleServe
	case policy == annotation.StaleDropIfLocal && !local:
		why = "; not while the consumer has no ready endpoints of its own"
		policy = annotation.StaleServe
	}
	switch {
	case (policy == annotation.StaleDrop || policy == annotation.StaleDropIfLocal) && (expire == 0 || g < expire):
		v.Drops, v.DropAfter = true, g
		v.Applies = fmt.Sprintf("the service's %s (stricter than the Corefile's %s)", v.Policy, expireText)
	case expire > 0:
		v.Drops, v.DropAfter = true, expire
		v.Applies = fmt.Sprintf("the Corefile's expire %s (stricter than the service's %s%s)", expire, v.Policy, why)
	default:
		v.Applies = fmt.Sprintf("the service's %s (%s%s): served as last seen however long", v.Policy, expireText, why)
	}
	if len(policies) > 1 {
		v.Applies += fmt.Sprintf("; its entries differ (%s) until every Pod is written again", strings.Join(policies, ", "))
	}
	return v
}

// staleLine says, for a cluster of a service, its state, how long it has
// been out of contact, which policy applies and what that does now.
func staleLine(state string, age time.Duration, v staleView) string {
	var b strings.Builder
	b.WriteString("state " + state)
	switch {
	case age < 0 && state != stateConnected:
		b.WriteString(", never contacted")
	case age > 0:
		fmt.Fprintf(&b, ", %s since its last contact", age.Round(time.Second))
	}
	b.WriteString("; policy: " + v.Applies)
	switch state {
	case stateStale:
		switch {
		case v.Drops && age > v.DropAfter:
			b.WriteString("; its endpoints are left out of the answers")
		case v.Drops && age >= 0:
			fmt.Fprintf(&b, "; its endpoints are answered, marked stale to EDNS0 clients, for %s more", (v.DropAfter - age).Round(time.Second))
		default:
			b.WriteString("; its endpoints are answered, marked stale to EDNS0 clients")
		}
	case stateExpired:
		b.WriteString("; expired: its records are dropped until it answers again")
	case stateUnknown:
		b.WriteString("; the file does not say whether it is in contact (written by an older build)")
	}
	return b.String()
}
