package snapshot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// checkPages walks the page tree of the file that tx reads, from the file's
// bytes, before bbolt reads any page but the meta pages: bbolt trusts every
// length, count and page number it finds, and a damaged one makes it
// allocate what the number says (a value's length, up to 4 GiB, copied
// whole) or descend without end (a page that points back at its own
// ancestor: a cursor's stack grows until memory runs out). The walk reads
// each page at most once, keeping a bit per page and the pages still to
// read, so a file of N bytes costs O(N) memory and time whatever it holds.
// It returns an error wrapping errUnusable, naming the page, for:
//   - a page outside the file's pages, or not the page it claims to be;
//   - a page reached twice (a loop, or two parents sharing a child);
//   - a tree page that is neither a branch nor a leaf, or a branch page
//     without elements;
//   - an element table, key or value that runs past its page (overflow
//     pages included);
//   - a bucket value too short for a bucket, or an inline bucket holding a
//     bucket (bbolt never writes one);
//   - a freelist page whose count does not fit in it.
//
// Key order and the freelist's contents are left to tx.Check, which runs
// once this walk has passed.
func checkPages(tx *bolt.Tx) error {
	w, freelist, err := newPageWalker(tx)
	if err != nil {
		return err
	}
	defer w.close()
	if freelist != noFreelist {
		if err := w.freelist(freelist); err != nil {
			return err
		}
	}
	root := uint64(tx.Cursor().Bucket().RootPage())
	w.todo = append(w.todo, root)
	for len(w.todo) > 0 {
		id := w.todo[len(w.todo)-1]
		w.todo = w.todo[:len(w.todo)-1]
		if err := w.page(id); err != nil {
			return err
		}
	}
	return nil
}

// checkFreelistFirst checks the freelist page of the file at path, if it
// holds anything, before a writable bolt.Open reads it: that Open copies
// as many page ids as the page's count says (a damaged count: gigabytes, or
// more than the machine has, a fatal error). The file is opened read-only
// for it (a shared lock: no writer is committing meanwhile; bbolt reads
// the meta pages only). A bad freelist is an error wrapping errUnusable; a
// lock held elsewhere wraps ErrLocked.
func checkFreelistFirst(path string, timeout time.Duration) error {
	if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		return nil // the writable Open creates or initialises it, or fails
	}
	db, _, err := openReadOnlyWith(path, timeout, func(tx *bolt.Tx, size int64) error {
		if hw := tx.Size(); hw > size {
			return unusable("file is %d bytes but its pages extend to %d bytes (truncated)", size, hw)
		}
		w, freelist, err := newPageWalker(tx)
		if err != nil || freelist == noFreelist {
			return err
		}
		defer w.close()
		return w.freelist(freelist)
	})
	if err != nil {
		return err
	}
	closeQuietly(db)
	return nil
}

// bbolt's file format (go.etcd.io/bbolt/internal/common), in native byte
// order: a page header is id (8 bytes), flags (2), count (2), overflow (4);
// a branch element is pos (4), ksize (4), child page id (8); a leaf element
// is flags (4), pos (4), ksize (4), vsize (4), pos counting from the
// element's own start; a bucket's value starts with its root page id (8)
// and sequence (8), followed by the bucket's page when the root is 0
// (inline); a meta page holds, after the header, magic, version, page
// size, flags (4 each), root bucket (16), freelist page id, page count,
// txid and checksum (8 each).
const (
	pageHeaderSize   = 16
	elementSize      = 16
	bucketHeaderSize = 16
	metaSize         = 64

	branchPage   = 0x01
	leafPage     = 0x02
	freelistPage = 0x10
	bucketLeaf   = 0x01

	boltMagic  = 0xED0CDAED
	noFreelist = ^uint64(0)
)

// pageWalker reads pages of a bbolt file once each.
type pageWalker struct {
	r        io.ReaderAt
	pageSize int64
	pages    uint64   // the file's page count (its high-water mark)
	seen     []uint64 // a bit per page
	todo     []uint64 // pages to read
	buf      []byte
	elems    []byte // the element table of the page being read
}

// newPageWalker returns a walker of the file tx reads, its meta pages read
// (the one tx read, and its freelist page id).
func newPageWalker(tx *bolt.Tx) (*pageWalker, uint64, error) {
	f, err := os.Open(tx.DB().Path())
	if err != nil {
		return nil, 0, fmt.Errorf("snapshot: %w", err)
	}
	ps := int64(tx.DB().Info().PageSize)
	if ps < pageHeaderSize+metaSize {
		f.Close()
		return nil, 0, unusable("page size %d", ps)
	}
	w := &pageWalker{r: f, pageSize: ps, pages: uint64(tx.Size() / ps)}
	w.seen = make([]uint64, (w.pages+63)/64)
	freelist, err := w.meta(uint64(tx.ID()), uint64(tx.Cursor().Bucket().RootPage()))
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return w, freelist, nil
}

func (w *pageWalker) close() { _ = w.r.(*os.File).Close() }

// read returns n bytes at off, in a buffer reused by the next read.
func (w *pageWalker) read(off int64, n uint64) ([]byte, error) {
	if uint64(cap(w.buf)) < n {
		w.buf = make([]byte, n)
	}
	b := w.buf[:n]
	if _, err := w.r.ReadAt(b, off); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, unusable("the file ends inside its pages")
		}
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return b, nil
}

// meta returns the freelist page of the meta page that tx read (its txid,
// root and page count match), checking that the meta pages are the file's
// first two.
func (w *pageWalker) meta(txid, root uint64) (uint64, error) {
	for id := range uint64(2) {
		b, err := w.read(int64(id)*w.pageSize, pageHeaderSize+metaSize)
		if err != nil {
			return 0, err
		}
		m := b[pageHeaderSize:]
		ne := binary.NativeEndian
		if ne.Uint32(m[0:]) == boltMagic && ne.Uint64(m[16:]) == root && ne.Uint64(m[40:]) == w.pages && ne.Uint64(m[48:]) == txid {
			w.mark(0, 2)
			return ne.Uint64(m[32:]), nil
		}
	}
	return 0, unusable("no meta page holds the state bbolt opened (txid %d, root page %d, %d pages)", txid, root, w.pages)
}

// mark records pages [id, end) as read; false when one was already.
func (w *pageWalker) mark(id, end uint64) bool {
	for ; id < end; id++ {
		word, bit := id/64, uint64(1)<<(id%64)
		if w.seen[word]&bit != 0 {
			return false
		}
		w.seen[word] |= bit
	}
	return true
}

// header reads page id's header, checks that the page and its overflow lie
// inside the file and were not read before, and marks them read. It returns
// the page's flags, count and size in bytes.
func (w *pageWalker) header(id uint64) (flags uint16, count uint16, size uint64, err error) {
	if id < 2 || id >= w.pages {
		return 0, 0, 0, unusable("page %d is outside the file's %d pages", id, w.pages)
	}
	b, err := w.read(int64(id)*w.pageSize, pageHeaderSize)
	if err != nil {
		return 0, 0, 0, err
	}
	ne := binary.NativeEndian
	if got := ne.Uint64(b); got != id {
		return 0, 0, 0, unusable("page %d calls itself page %d", id, got)
	}
	flags, count = ne.Uint16(b[8:]), ne.Uint16(b[10:])
	overflow := uint64(ne.Uint32(b[12:]))
	if overflow >= w.pages-id {
		return 0, 0, 0, unusable("page %d: %d overflow pages run past the file's %d pages", id, overflow, w.pages)
	}
	if !w.mark(id, id+1+overflow) {
		return 0, 0, 0, unusable("page %d is reached twice (a loop, or a page shared by two parents)", id)
	}
	return flags, count, (1 + overflow) * uint64(w.pageSize), nil
}

// freelist checks the freelist page id.
func (w *pageWalker) freelist(id uint64) error {
	flags, count, size, err := w.header(id)
	if err != nil {
		return err
	}
	if flags != freelistPage {
		return unusable("page %d, the freelist, is of type %#x", id, flags)
	}
	n, slots := uint64(count), (size-pageHeaderSize)/8
	if count == 0xFFFF { // the count is the first id
		b, err := w.read(int64(id)*w.pageSize+pageHeaderSize, 8)
		if err != nil {
			return err
		}
		n = binary.NativeEndian.Uint64(b) + 1
	}
	if n > slots {
		return unusable("freelist page %d: %d ids do not fit in its %d bytes", id, n, size)
	}
	return nil
}

// page checks the tree page id and queues its children and the roots of
// the buckets it holds.
func (w *pageWalker) page(id uint64) error {
	flags, count, size, err := w.header(id)
	if err != nil {
		return err
	}
	switch flags {
	case branchPage, leafPage:
	default:
		return unusable("page %d is of type %#x where a branch or leaf page belongs", id, flags)
	}
	if flags == branchPage && count == 0 {
		return unusable("branch page %d has no elements", id)
	}
	table := pageHeaderSize + uint64(count)*elementSize
	if table > size {
		return unusable("page %d: %d elements do not fit in its %d bytes", id, count, size)
	}
	start := int64(id) * w.pageSize
	b, err := w.read(start, table)
	if err != nil {
		return err
	}
	// The table is copied out: reading a bucket's value reuses w.buf.
	w.elems = append(w.elems[:0], b[pageHeaderSize:]...)
	elems := w.elems
	ne := binary.NativeEndian
	for i := range uint64(count) {
		e := elems[i*elementSize:]
		at := pageHeaderSize + i*elementSize // the element's offset in the page
		if flags == branchPage {
			if end := at + uint64(ne.Uint32(e[0:])) + uint64(ne.Uint32(e[4:])); end > size {
				return unusable("branch page %d: element %d's key runs past the page", id, i)
			}
			w.todo = append(w.todo, ne.Uint64(e[8:]))
			continue
		}
		vstart := at + uint64(ne.Uint32(e[4:])) + uint64(ne.Uint32(e[8:]))
		vsize := uint64(ne.Uint32(e[12:]))
		if vstart+vsize > size {
			return unusable("leaf page %d: element %d's key or value (%d bytes) runs past the page", id, i, vsize)
		}
		if ne.Uint32(e[0:])&bucketLeaf == 0 {
			continue
		}
		if vsize < bucketHeaderSize {
			return unusable("leaf page %d: element %d is a bucket of %d bytes", id, i, vsize)
		}
		v, err := w.read(start+int64(vstart), vsize)
		if err != nil {
			return err
		}
		if root := ne.Uint64(v); root != 0 {
			w.todo = append(w.todo, root)
		} else if err := inlinePage(v[bucketHeaderSize:]); err != nil {
			return unusable("leaf page %d: element %d's inline bucket: %v", id, i, err)
		}
	}
	return nil
}

// inlinePage checks the page of an inline bucket (a leaf page inside its
// parent's value).
func inlinePage(p []byte) error {
	if len(p) < pageHeaderSize {
		return errors.New("too short for a page")
	}
	ne := binary.NativeEndian
	flags, count := ne.Uint16(p[8:]), uint64(ne.Uint16(p[10:]))
	if flags != leafPage {
		return fmt.Errorf("a page of type %#x", flags)
	}
	if pageHeaderSize+count*elementSize > uint64(len(p)) {
		return fmt.Errorf("%d elements do not fit in its %d bytes", count, len(p))
	}
	for i := range count {
		at := pageHeaderSize + i*elementSize
		e := p[at:]
		if ne.Uint32(e[0:])&bucketLeaf != 0 {
			return errors.New("it holds a bucket")
		}
		if at+uint64(ne.Uint32(e[4:]))+uint64(ne.Uint32(e[8:]))+uint64(ne.Uint32(e[12:])) > uint64(len(p)) {
			return fmt.Errorf("element %d's key or value runs past it", i)
		}
	}
	return nil
}
