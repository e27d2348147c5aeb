// Package clients knows which local Pod sends a query: an index from Pod IP
// to the Pod's namespace and its imports (the import-services annotation),
// fed by an informer of the local cluster's Pods.
//
// Only the IPs of Pods that are running (not Succeeded or Failed, whose IPs
// the node may hand out again) are indexed. An IP belongs to the Pod that
// last claimed it; removing a Pod releases only the IPs it still owns, so a
// new Pod on a reused IP never inherits the old Pod's imports, whatever the
// order of the events.
package clients

import (
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/mcsannotations/mcsannotations/plugin/annotation"
)

// Client is a local Pod as a DNS client.
type Client struct {
	Namespace, Name, UID string
	Imports              []annotation.Import
}

// Imported reports whether the client imports the service name in namespace.
func (c *Client) Imported(namespace, name string) bool {
	for _, i := range c.Imports {
		if i.Namespace == namespace && i.Name == name {
			return true
		}
	}
	return false
}

// Alias returns the import whose alias is alias, if any.
func (c *Client) Alias(alias string) (annotation.Import, bool) {
	for _, i := range c.Imports {
		if i.Alias == alias {
			return i, true
		}
	}
	return annotation.Import{}, false
}

type podKey struct{ namespace, name string }

// Index maps Pod IPs to Clients. Lookups do not lock.
type Index struct {
	byIP      sync.Map // netip.Addr -> *Client
	importers atomic.Int64

	mu  sync.Mutex // writers
	cur map[podKey]held
}

// held is what a Pod holds: its Client and the IPs it claimed.
type held struct {
	client *Client
	ips    []netip.Addr
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{cur: map[podKey]held{}}
}

// Lookup returns the Pod using ip, or nil.
func (x *Index) Lookup(ip netip.Addr) *Client {
	if v, ok := x.byIP.Load(ip.Unmap()); ok {
		return v.(*Client)
	}
	return nil
}

// HasImporters reports whether any indexed Pod imports something: when none
// does, no alias name can match and the lookup can be skipped.
func (x *Index) HasImporters() bool { return x.importers.Load() > 0 }

// Len returns the number of indexed Pods.
func (x *Index) Len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.cur)
}

// Set records that c uses ips (replacing what was known of that Pod).
func (x *Index) Set(c *Client, ips []netip.Addr) {
	k := podKey{c.Namespace, c.Name}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.releaseLocked(k, ips)
	if old := x.cur[k].client; old != nil && len(old.Imports) > 0 {
		x.importers.Add(-1)
	}
	if len(c.Imports) > 0 {
		x.importers.Add(1)
	}
	x.cur[k] = held{c, ips}
	for _, ip := range ips {
		x.byIP.Store(ip.Unmap(), c)
	}
}

// Remove forgets the Pod namespace/name.
func (x *Index) Remove(namespace, name string) {
	k := podKey{namespace, name}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.releaseLocked(k, nil)
	if old := x.cur[k].client; old != nil && len(old.Imports) > 0 {
		x.importers.Add(-1)
	}
	delete(x.cur, k)
}

// releaseLocked drops the Pod's IPs that are not in keep, where it still owns them.
func (x *Index) releaseLocked(k podKey, keep []netip.Addr) {
	old, ok := x.cur[k]
	if !ok {
		return
	}
	for _, ip := range old.ips {
		if contains(keep, ip) {
			continue
		}
		x.byIP.CompareAndDelete(ip.Unmap(), old.client)
	}
}

func contains(ips []netip.Addr, ip netip.Addr) bool {
	for _, a := range ips {
		if a == ip {
			return true
		}
	}
	return false
}
