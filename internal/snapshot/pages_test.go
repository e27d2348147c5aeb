package snapshot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mcsannotations/mcsannotations/internal/clients"
)

// page is one tree page of a bbolt file image, as the damage below finds it.
type page struct {
	id    int
	off   int // in the image
	flags uint16
	count int
}

// treePages returns the live branch and leaf pages of img, the image of
// the file at path (bbolt says which are free).
func treePages(t *testing.T, path string, img []byte, ps int) []page {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true, PreLoadFreelist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var out []page
	ne := binary.NativeEndian
	err = db.View(func(tx *bolt.Tx) error {
		for id := 2; (id+1)*ps <= len(img); id++ {
			info, err := tx.Page(id)
			if err != nil || info == nil {
				return err
			}
			off := id * ps
			if flags := ne.Uint16(img[off+8:]); info.Type == "branch" || info.Type == "leaf" {
				out = append(out, page{id: id, off: off, flags: flags, count: int(ne.Uint16(img[off+10:]))})
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// bucketElement returns the offset in img of the first bucket element (of a
// leaf page) whose root is inline (inline) or not, and the page holding it.
func bucketElement(t *testing.T, pages []page, img []byte, inline bool) (int, page) {
	t.Helper()
	ne := binary.NativeEndian
	for _, p := range pages {
		for i := range p.count {
			if p.flags != leafPage {
				break
			}
			at := p.off + pageHeaderSize + i*elementSize
			if ne.Uint32(img[at:])&bucketLeaf == 0 {
				continue
			}
			v := at + int(ne.Uint32(img[at+4:])) + int(ne.Uint32(img[at+8:]))
			if (ne.Uint64(img[v:]) == 0) == inline {
				return at, p
			}
		}
	}
	t.Fatalf("no bucket element (inline %t)", inline)
	return 0, page{}
}

func firstPage(t *testing.T, pages []page, flags uint16) page {
	t.Helper()
	for _, p := range pages {
		if p.flags == flags {
			return p
		}
	}
	t.Fatalf("no page of type %#x", flags)
	return page{}
}

// allocWatch fails the test binary when the process allocates more than
// limit bytes before stop is called: a damaged file that makes bbolt
// descend without end would otherwise take the machine's memory before the
// test could look.
func allocWatch(limit uint64, what string) (stop func()) {
	sample := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(sample)
	start := sample[0].Value.Uint64()
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			metrics.Read(sample)
			if n := sample[0].Value.Uint64() - start; n > limit {
				panic(fmt.Sprintf("%s: allocated %d bytes, over %d", what, n, limit))
			}
		}
	}()
	return func() { close(done) }
}

// readAll reads everything a reader of the file reads: mcsctl's OpenReadOnly,
// every record of every source, the clients and the ClusterSetIP services.
func readAll(path string) error {
	st, err := OpenReadOnly(path, time.Second)
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := st.LoadClients(func(*clients.Client, []netip.Addr) {}); err != nil {
		return err
	}
	if _, _, err := st.LoadClusterSetIPs(); err != nil {
		return err
	}
	return st.Scan(func(_ string, _ Meta, records iter.Seq2[[]byte, []byte]) error {
		dec := NewPodDecoder()
		for _, v := range records {
			_, _ = dec.Decode(v)
		}
		return nil
	})
}

// TestDamagedFileBounded: whatever a damaged file's lengths, counts and page
// numbers say, reading it (mcsctl's read-only open and load, and the
// plugin's Open) allocates O(its size): a bucket value whose length says
// 512 MiB or 4 GiB, pages that point back at themselves, an inline bucket
// whose page is not a leaf, overflow and element counts past the page, a
// freelist whose count does not fit, and random bit flips in the headers
// and element tables of the tree pages (fixed seeds). Each is refused as
// unusable, naming the page, or read as what it holds.
func TestDamagedFileBounded(t *testing.T) {
	base := filepath.Join(t.TempDir(), "base.db")
	writeStore(t, base, 600) // branch pages, several leaves, inline buckets
	img, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	ps := os.Getpagesize()
	ne := binary.NativeEndian
	pages := treePages(t, base, img, ps)

	type variant struct {
		name   string
		damage func(b []byte)
		reason string // in the error; "" when any outcome will do
	}
	variants := []variant{{
		name: "bucket value of 512 MiB",
		damage: func(b []byte) {
			at, _ := bucketElement(t, pages, b, false)
			ne.PutUint32(b[at+12:], ne.Uint32(b[at+12:])|1<<29)
		},
		reason: "runs past the page",
	}, {
		name:   "bucket value of 4 GiB",
		damage: func(b []byte) { at, _ := bucketElement(t, pages, b, true); ne.PutUint32(b[at+12:], ^uint32(0)) },
		reason: "runs past the page",
	}, {
		name: "inline bucket whose page is not a leaf",
		damage: func(b []byte) {
			at, _ := bucketElement(t, pages, b, true)
			v := at + int(ne.Uint32(b[at+4:])) + int(ne.Uint32(b[at+8:]))
			ne.PutUint16(b[v+bucketHeaderSize+8:], 0)
		},
		reason: "inline bucket: a page of type 0x0",
	}, {
		name: "bucket whose root is the page holding it",
		damage: func(b []byte) {
			at, p := bucketElement(t, pages, b, false)
			v := at + int(ne.Uint32(b[at+4:])) + int(ne.Uint32(b[at+8:]))
			ne.PutUint64(b[v:], uint64(p.id))
		},
		reason: "reached twice",
	}, {
		name: "branch page pointing at itself",
		damage: func(b []byte) {
			p := firstPage(t, pages, branchPage)
			ne.PutUint64(b[p.off+pageHeaderSize+8:], uint64(p.id))
		},
		reason: "reached twice",
	}, {
		name: "branch page pointing past the file",
		damage: func(b []byte) {
			p := firstPage(t, pages, branchPage)
			ne.PutUint64(b[p.off+pageHeaderSize+8:], 1<<40)
		},
		reason: "outside the file",
	}, {
		name:   "leaf overflow past the file",
		damage: func(b []byte) { p := firstPage(t, pages, leafPage); ne.PutUint32(b[p.off+12:], ^uint32(0)) },
		reason: "overflow pages run past",
	}, {
		name:   "element table past the page",
		damage: func(b []byte) { p := firstPage(t, pages, leafPage); ne.PutUint16(b[p.off+10:], 0xFFFF) },
		reason: "elements do not fit",
	}, {
		name: "freelist count of 2^26 ids",
		damage: func(b []byte) {
			m := pageHeaderSize // the meta page with the higher txid names it
			if ne.Uint64(b[ps+m+48:]) > ne.Uint64(b[m+48:]) {
				m += ps
			}
			off := int(ne.Uint64(b[m+32:])) * ps
			ne.PutUint16(b[off+10:], 0xFFFF)
			ne.PutUint64(b[off+pageHeaderSize:], 1<<26)
		},
		reason: "ids do not fit", // the plugin's Open checks it before a writable bolt.Open reads it
	}}
	r := rand.New(rand.NewPCG(36, 8))
	for i := range 300 {
		p := pages[r.IntN(len(pages))]
		table := pageHeaderSize + p.count*elementSize
		flips := make([]int, 1+r.IntN(3))
		for j := range flips {
			flips[j] = p.off*8 + r.IntN(min(table, ps)*8)
		}
		variants = append(variants, variant{
			name: fmt.Sprintf("flips %d on page %d", i, p.id),
			damage: func(b []byte) {
				for _, f := range flips {
					b[f/8] ^= 1 << (f % 8)
				}
			},
		})
	}

	// Reading the undamaged file allocates a few times its size (the
	// decoded records); a damaged one may not allocate more.
	limit := 4*uint64(len(img)) + 1<<20
	dir := t.TempDir()
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			defer allocWatch(1<<30, v.name)()
			b := append([]byte(nil), img...)
			v.damage(b)
			path := filepath.Join(dir, "damaged.db")
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			defer func() {
				matches, _ := filepath.Glob(path + "*")
				for _, m := range matches {
					_ = os.Remove(m)
				}
			}()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := readAll(path)
			runtime.ReadMemStats(&after)
			if n := after.TotalAlloc - before.TotalAlloc; n > limit {
				t.Errorf("reading allocated %d bytes, over the bound %d (4 x the file's %d bytes + 1 MiB); err %v", n, limit, len(b), err)
			}
			if v.reason != "" && (!errors.Is(err, ErrUnusable) || !strings.Contains(err.Error(), v.reason)) {
				t.Errorf("read-only open: %v, want unusable: ...%s...", err, v.reason)
			}
			var logs logBuf
			runtime.ReadMemStats(&before)
			s, res, err := Open(path, testOptions(&logs))
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			s.Close()
			if n := after.TotalAlloc - before.TotalAlloc; n > limit {
				t.Errorf("Open allocated %d bytes, over the bound %d", n, limit)
			}
			if v.reason != "" && (res.MovedAside == "" || !strings.Contains(res.Reason, v.reason)) {
				t.Errorf("Open: %+v, want the file moved aside: ...%s...", res, v.reason)
			}
		})
	}
}
