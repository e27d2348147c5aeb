package store

import (
	"hash/maphash"
	"math/bits"
)

// podSet is one group's records keyed by Pod name: an open-addressing hash
// table with linear probing over a slice of record pointers. A slot is the
// 8-byte pointer (the name is read from the record), where a Go
// map[string]*Pod spends 24 bytes a slot plus control bytes; at the loads below
// that was about 40 bytes per record (BenchmarkIndexHeap, in
// internal/snapshot). The zero podSet is empty and ready to use; it is not
// safe for concurrent use (the store's lock guards it).
type podSet struct {
	slots []*Pod // nil marks a free slot
	n     int
}

// seed keys every set's hash: fixed for the process, unknown to the names'
// authors, so no one can choose names that collide.
var seed = maphash.MakeSeed()

// Loads: a set grows (doubles) before its load passes 4/5, so it runs between
// 2/5 and 4/5; one made for a known count starts at 4/5.
const (
	loadNum, loadDen = 4, 5
	minSlots         = 2
)

// newPodSet returns an empty set that holds n records without growing.
func newPodSet(n int) *podSet {
	return &podSet{slots: make([]*Pod, max(minSlots, (n*loadDen+loadNum-1)/loadNum))}
}

func (s *podSet) len() int { return s.n }

// home is the slot a name's probe starts at: the hash scaled to the table's
// length (any length, not only powers of two).
func (s *podSet) home(name string) int {
	hi, _ := bits.Mul64(maphash.String(seed, name), uint64(len(s.slots)))
	return int(hi)
}

// find returns the slot holding name, or the free slot that ends its probe
// (-1 when the set has no slots).
func (s *podSet) find(name string) (int, bool) {
	if len(s.slots) == 0 {
		return -1, false
	}
	i := s.home(name)
	for {
		p := s.slots[i]
		if p == nil {
			return i, false
		}
		if p.Name == name {
			return i, true
		}
		if i++; i == len(s.slots) {
			i = 0
		}
	}
}

// get returns the record named name, or nil (always nil on a nil set).
func (s *podSet) get(name string) *Pod {
	if s == nil {
		return nil
	}
	if i, ok := s.find(name); ok {
		return s.slots[i]
	}
	return nil
}

// put adds p, replacing the record of the same name, and returns the one it
// replaced (nil when none).
func (s *podSet) put(p *Pod) *Pod {
	i, ok := s.find(p.Name)
	if ok {
		old := s.slots[i]
		s.slots[i] = p
		return old
	}
	if (s.n+1)*loadDen > len(s.slots)*loadNum {
		s.grow()
		i, _ = s.find(p.Name)
	}
	s.slots[i] = p
	s.n++
	return nil
}

func (s *podSet) grow() {
	old := s.slots
	s.slots = make([]*Pod, max(minSlots, 2*len(old)))
	for _, p := range old {
		if p != nil {
			i, _ := s.find(p.Name)
			s.slots[i] = p
		}
	}
}

// remove deletes the record named name and returns it (nil when none). The
// records after it in its probe run move back to close the gap (backward-shift
// deletion), so lookups never need tombstones.
func (s *podSet) remove(name string) *Pod {
	i, ok := s.find(name)
	if !ok {
		return nil
	}
	old := s.slots[i]
	s.slots[i] = nil
	s.n--
	size := len(s.slots)
	for j := (i + 1) % size; s.slots[j] != nil; j = (j + 1) % size {
		// The record at j may fill the gap at i when i lies on its probe
		// path, from its home up to j.
		h := s.home(s.slots[j].Name)
		if (j-h+size)%size >= (j-i+size)%size {
			s.slots[i], s.slots[j] = s.slots[j], nil
			i = j
		}
	}
	return old
}

// all yields every record, in no order. The set must not change meanwhile,
// but for replacing the yielded record through put.
func (s *podSet) all(yield func(*Pod) bool) {
	for _, p := range s.slots {
		if p != nil && !yield(p) {
			return
		}
	}
}
