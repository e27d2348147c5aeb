package ingest

import (
	"fmt"
	"iter"
	"maps"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
)

// Object is what a Store keeps: a slim object that knows its key.
type Object interface {
	runtime.Object
	Key() string
}

// Key is the store key of an object: namespace/name.
func (m *Meta) Key() string { return m.Namespace + "/" + m.Name }

// Store is what a reflector writes into for a component: it keeps the slim
// objects by key and hands each change to the component, whose Replaced is
// its swap and whose Changed and Deleted are its upserts. The component's
// functions are called one at a time, under the store's lock, and never
// after Close.
type Store[T Object] struct {
	// Changed hears of an object added or updated; old is what was held
	// under its key (the zero T if nothing).
	Changed func(old, obj T)
	// Deleted hears of an object deleted.
	Deleted func(obj T)
	// Replaced hears of a complete list: objs replace old.
	Replaced func(old, objs map[string]T)

	mu     sync.Mutex
	closed bool
	listed bool
	items  map[string]T
	full   bool        // an object was refused since the store last had room
	refuse func(error) // hears of the first refusal of each spell (see Start)
}

// MaxObjects bounds the objects of one resource a reader holds from one
// cluster, and the objects of one list (all its pages), so that a broken or
// hostile API server cannot grow a reader's memory without end. 50,000 keep
// CoreDNS within its shipped memory limit however the objects come
// (test/e2e TestHostilePeerMemory holds both binaries to their limits), and
// are more exporting (or importing) Pods than an edge cluster runs. A list over the bound is refused (the store keeps what it
// holds); a watched object that would take a full store past it is dropped.
// A variable for tests.
var MaxObjects = 50_000

// Get returns the object held under key.
func (s *Store[T]) Get(key string) (T, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj, ok := s.items[key]
	return obj, ok
}

// Items returns the objects held, for the component's functions only: they
// run under the store's lock, which Items does not take.
func (s *Store[T]) Items() iter.Seq[T] { return maps.Values(s.items) }

// Listed reports whether a complete list came in.
func (s *Store[T]) Listed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listed
}

// Close makes the store ignore everything from now on; once it returns, no
// call of the component's functions is running.
func (s *Store[T]) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
}

// Add implements cache.ReflectorStore.
func (s *Store[T]) Add(obj any) error { return s.Update(obj) }

// Update implements cache.ReflectorStore.
func (s *Store[T]) Update(obj any) error {
	return s.locked(obj, func(t T) {
		if s.items == nil {
			s.items = map[string]T{}
		}
		old, held := s.items[t.Key()]
		if !held && len(s.items) >= MaxObjects {
			if !s.full && s.refuse != nil {
				s.refuse(fmt.Errorf("%w: %w: a new object (%s) while %d are held, the most a reader holds; dropped, and so is every new one until there is room", ErrStream, ErrTooLarge, t.Key(), len(s.items)))
			}
			s.full = true
			return
		}
		s.items[t.Key()] = t
		if s.Changed != nil {
			s.Changed(old, t)
		}
	})
}

// Delete implements cache.ReflectorStore.
func (s *Store[T]) Delete(obj any) error {
	return s.locked(obj, func(t T) {
		delete(s.items, t.Key())
		s.full = false
		if s.Deleted != nil {
			s.Deleted(t)
		}
	})
}

// locked runs f with obj under the lock, unless obj is no T or the store is
// closed.
func (s *Store[T]) locked(obj any, f func(T)) error {
	t, ok := obj.(T)
	if !ok {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		f(t)
	}
	return nil
}

// Replace implements cache.ReflectorStore.
func (s *Store[T]) Replace(list []any, _ string) error {
	if len(list) > MaxObjects { // the ListerWatcher refuses such lists; a store is never filled past the bound
		return fmt.Errorf("%w: a list of %d objects, more than %d", ErrTooLarge, len(list), MaxObjects)
	}
	objs := make(map[string]T, len(list))
	for _, obj := range list {
		if t, ok := obj.(T); ok {
			objs[t.Key()] = t
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	old := s.items
	s.items, s.listed, s.full = objs, true, false
	if s.Replaced != nil {
		s.Replaced(old, objs)
	}
	return nil
}

// refuseWith makes the store tell f of the first object it drops in each
// spell of being full.
func (s *Store[T]) refuseWith(f func(error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = f
}

// Resync implements cache.ReflectorStore; there is nothing to resync.
func (s *Store[T]) Resync() error { return nil }
