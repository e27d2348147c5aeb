// Package clients knows which local Pod sends a query: an index from Pod IP
// to the Pod's namespace and its imports (the import-services annotation),
// fed by a reflector of the local cluster's Pods.
//
// Only the IPs of Pods that are running (not Succeeded or Failed, whose IPs
// the node may hand out again) are indexed. An IP belongs to the Pod that
// last claimed it; removing a Pod releases only the IPs it still owns, so a
// new Pod on a reused IP never inherits the old Pod's imports, whatever the
// order of the events.
package clients

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/mcsannotations/mcsannotations/annotation"
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

	mu       sync.Mutex // writers
	cur      map[podKey]held
	seeded   map[podKey]struct{} // loaded from the snapshot, not yet seen in a list
	onChange func(namespace, name string, c *Client, ips []netip.Addr)
}

// held is what a Pod holds: its Client and the IPs it claimed.
type held struct {
	client *Client
	ips    []netip.Addr
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{cur: map[podKey]held{}, seeded: map[podKey]struct{}{}}
}

// OnChange registers f to hear every change (c nil when the Pod is
// forgotten): the snapshot's journal. It is called with the index's write
// lock held, so it must be quick and must not call back into the index. Set
// it before any write.
func (x *Index) OnChange(f func(namespace, name string, c *Client, ips []netip.Addr)) { x.onChange = f }

// Seed loads a client remembered in the snapshot, so that alias names and
// imports enforce work from the first query after a start while the API
// server is unreachable. Seeded clients are the last known state: the first
// complete list (DropSeeded) forgets those it did not mention.
func (x *Index) Seed(c *Client, ips []netip.Addr) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.setLocked(c, ips) // not journaled: it comes from the snapshot
	x.seeded[podKey{c.Namespace, c.Name}] = struct{}{}
}

// DropSeeded forgets the seeded clients that no list or watch event has
// mentioned since, and returns how many. The watcher calls it once its first
// list is applied.
func (x *Index) DropSeeded() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := len(x.seeded)
	for k := range x.seeded {
		x.removeLocked(k)
	}
	return n
}

// Each calls f for every indexed Pod (to rewrite the snapshot).
func (x *Index) Each(f func(c *Client, ips []netip.Addr)) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, h := range x.cur {
		f(h.client, h.ips)
	}
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
	x.mu.Lock()
	defer x.mu.Unlock()
	old, known := x.cur[podKey{c.Namespace, c.Name}]
	x.setLocked(c, ips)
	if x.onChange != nil && !(known && slices.Equal(old.ips, ips) && slices.Equal(old.client.Imports, c.Imports)) {
		x.onChange(c.Namespace, c.Name, c, ips)
	}
}

func (x *Index) setLocked(c *Client, ips []netip.Addr) {
	k := podKey{c.Namespace, c.Name}
	x.releaseLocked(k, ips)
	if old := x.cur[k].client; old != nil && len(old.Imports) > 0 {
		x.importers.Add(-1)
	}
	if len(c.Imports) > 0 {
		x.importers.Add(1)
	}
	x.cur[k] = held{c, ips}
	delete(x.seeded, k)
	for _, ip := range ips {
		x.byIP.Store(ip.Unmap(), c)
	}
}

// Remove forgets the Pod namespace/name.
func (x *Index) Remove(namespace, name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removeLocked(podKey{namespace, name})
}

func (x *Index) removeLocked(k podKey) {
	x.releaseLocked(k, nil)
	old, known := x.cur[k]
	if old.client != nil && len(old.client.Imports) > 0 {
		x.importers.Add(-1)
	}
	delete(x.cur, k)
	delete(x.seeded, k)
	if known && x.onChange != nil {
		x.onChange(k.namespace, k.name, nil, nil)
	}
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
