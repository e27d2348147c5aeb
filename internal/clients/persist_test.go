package clients

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/mcsannotations/mcsannotations/annotation"
)

type journal struct {
	mu   sync.Mutex
	puts map[string]int
	dels map[string]int
}

func (j *journal) record(ns, name string, c *Client, _ []netip.Addr) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if c == nil {
		j.dels[ns+"/"+name]++
	} else {
		j.puts[ns+"/"+name]++
	}
}

// Seeded clients answer at once, are not written back, and those the first
// list does not mention are forgotten (and deleted from the snapshot).
func TestSeedThenDropSeeded(t *testing.T) {
	x := NewIndex()
	j := &journal{puts: map[string]int{}, dels: map[string]int{}}
	x.OnChange(j.record)
	imports := []annotation.Import{{Name: "db", Namespace: "web", Alias: "db"}}
	x.Seed(&Client{Namespace: "web", Name: "stays", Imports: imports}, []netip.Addr{ipA})
	x.Seed(&Client{Namespace: "web", Name: "gone", Imports: imports}, []netip.Addr{ipB})
	if x.Lookup(ipA) == nil || x.Lookup(ipB) == nil || !x.HasImporters() {
		t.Fatal("seeded clients not indexed")
	}
	if len(j.puts)+len(j.dels) != 0 {
		t.Fatalf("seeding was journaled: %+v", j)
	}
	// The list mentions "stays", unchanged: nothing to write.
	x.Set(&Client{Namespace: "web", Name: "stays", Imports: imports}, []netip.Addr{ipA})
	if j.puts["web/stays"] != 0 {
		t.Error("an unchanged client was journaled")
	}
	if n := x.DropSeeded(); n != 1 {
		t.Fatalf("DropSeeded() = %d, want 1", n)
	}
	if x.Lookup(ipA) == nil || x.Lookup(ipB) != nil || x.Len() != 1 {
		t.Fatalf("after DropSeeded: %v %v %d", x.Lookup(ipA), x.Lookup(ipB), x.Len())
	}
	if j.dels["web/gone"] != 1 {
		t.Errorf("the dropped client was not deleted from the journal: %+v", j.dels)
	}
	if n := x.DropSeeded(); n != 0 {
		t.Errorf("second DropSeeded() = %d", n)
	}
	// A changed client is journaled.
	x.Set(&Client{Namespace: "web", Name: "stays"}, []netip.Addr{ipA})
	if j.puts["web/stays"] != 1 || x.HasImporters() {
		t.Errorf("changed client: puts %v, importers %v", j.puts, x.HasImporters())
	}
	var each int
	x.Each(func(*Client, []netip.Addr) { each++ })
	if each != 1 {
		t.Errorf("Each visited %d", each)
	}
}

// The watcher drops the seeded clients its first list did not mention.
func TestWatcherDropsSeededAfterSync(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "live", Namespace: "web", ResourceVersion: "1"},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIPs: []v1.PodIP{{IP: "10.0.0.9"}}}}
	x := NewIndex()
	x.Seed(&Client{Namespace: "web", Name: "deleted-while-offline"}, []netip.Addr{ipA})
	dropped := make(chan int, 1)
	w := NewWatcher(fake.NewClientset(pod), x, Options{All: true, Dropped: func(n int) { dropped <- n }})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	select {
	case n := <-dropped:
		if n != 1 {
			t.Fatalf("dropped %d, want 1", n)
		}
	case <-ctx.Done():
		t.Fatal("the seeded client was never dropped")
	}
	if x.Lookup(ipA) != nil || x.Lookup(netip.MustParseAddr("10.0.0.9")) == nil {
		t.Fatal("index after the first list")
	}
}
