package store

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestPodSetMatchesMap runs random puts and removes against a podSet and a Go
// map, small name spaces so that probe runs collide, wrap around the end of
// the slots and are shifted back by removals; after every step the set must
// hold exactly the map's records and find each of them.
func TestPodSetMatchesMap(t *testing.T) {
	for _, names := range []int{3, 17, 200} {
		t.Run(fmt.Sprint(names, " names"), func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(names)))
			var s podSet // the zero set is usable
			model := map[string]*Pod{}
			for step := range 20000 {
				name := fmt.Sprint("pod-", r.IntN(names))
				if r.IntN(3) == 0 {
					got, want := s.remove(name), model[name]
					if got != want {
						t.Fatalf("step %d: remove(%s) = %v, want %v", step, name, got, want)
					}
					delete(model, name)
				} else {
					p := &Pod{Name: name}
					if got, want := s.put(p), model[name]; got != want {
						t.Fatalf("step %d: put(%s) replaced %v, want %v", step, name, got, want)
					}
					model[name] = p
				}
				if s.len() != len(model) {
					t.Fatalf("step %d: len %d, want %d", step, s.len(), len(model))
				}
				if n := len(s.slots); n > 0 && s.n*loadDen > n*loadNum {
					t.Fatalf("step %d: %d records in %d slots", step, s.n, n)
				}
				seen := 0
				for p := range s.all {
					if model[p.Name] != p {
						t.Fatalf("step %d: set holds %s that the model does not", step, p.Name)
					}
					seen++
				}
				if seen != len(model) {
					t.Fatalf("step %d: all yielded %d, want %d", step, seen, len(model))
				}
				for n, p := range model {
					if s.get(n) != p {
						t.Fatalf("step %d: get(%s) misses", step, n)
					}
				}
			}
		})
	}
}

func TestPodSetSized(t *testing.T) {
	for _, n := range []int{0, 1, 4, 5, 1000} {
		s := newPodSet(n)
		slots := len(s.slots)
		for i := range n {
			s.put(&Pod{Name: fmt.Sprint(i)})
		}
		if len(s.slots) != slots {
			t.Errorf("newPodSet(%d): grew from %d to %d slots", n, slots, len(s.slots))
		}
		if s.get("absent") != nil || (*podSet)(nil).get("x") != nil {
			t.Errorf("newPodSet(%d): found an absent name", n)
		}
	}
}
