package snapshot

import (
	"errors"
	"iter"
	"runtime"
	"slices"
	"sync"

	"github.com/mcsannotations/mcsannotations/internal/store"
)

// The record store's records in a snapshot, as CoreDNS's plugin and the MCS
// controller keep them: journaled from the record store's change feed
// (Journal) and decoded back at start (DecodeRecords).

// DecodeBatch is how many records a decoding goroutine takes at a time.
const DecodeBatch = 1024

type rawRecord struct{ k, v []byte }

// errMismatch: a record that decodes but does not belong where it was stored.
var errMismatch = errors.New("record does not belong where it was stored")

// DecodeRecords decodes the n records of cluster that Scan hands out, on
// GOMAXPROCS goroutines (each with its own decoder, under st's fault
// protection), and returns the good ones and the keys of the bad ones: those
// that do not decode, or that claim another cluster or key than their own,
// or export into another cluster or namespace than their own.
func DecodeRecords(st *Store, cluster string, n int, records iter.Seq2[[]byte, []byte]) ([]*store.Pod, []string, error) {
	workers := max(1, min(runtime.GOMAXPROCS(0), n/DecodeBatch))
	var (
		work = make(chan []rawRecord, 2*workers)
		free = make(chan []rawRecord, 2*workers)
		outs = make([][]*store.Pod, workers)
		bads = make([][]string, workers)
		errs = make([]error, workers)
		wg   sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			errs[w] = st.Guard(func() {
				// Records share their cluster, namespace and exports. Sized
				// for this worker's share: most clusters are small.
				share := n
				if workers > 1 {
					share = n/workers + DecodeBatch
				}
				dec := NewPodDecoderFor(share)
				out := make([]*store.Pod, 0, share)
				for b := range work {
					for _, r := range b {
						p, err := dec.Decode(r.v)
						if err == nil && (p.Cluster != cluster || !IsNameKey(r.k, p.Namespace, p.Name) || !exportsOwn(p)) {
							err = errMismatch
						}
						if err != nil {
							bads[w] = append(bads[w], string(r.k))
							continue
						}
						out = append(out, p)
					}
					select {
					case free <- b[:0]:
					default:
					}
				}
				outs[w] = out
			})
			for range work { // after a fault: let the scan finish
			}
		})
	}
	// Also when the scan faults (the store turns that panic into an error):
	// the workers end before the transaction does.
	finish := sync.OnceFunc(func() { close(work); wg.Wait() })
	defer finish()
	b := make([]rawRecord, 0, min(max(n, 1), DecodeBatch))
	for k, v := range records {
		b = append(b, rawRecord{k, v})
		if len(b) == DecodeBatch {
			work <- b
			select {
			case b = <-free:
			default:
				b = make([]rawRecord, 0, DecodeBatch)
			}
		}
	}
	work <- b
	finish()
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	return slices.Concat(outs...), slices.Concat(bads...), nil
}

// exportsOwn re-checks the sameness rules on a stored record.
func exportsOwn(p *store.Pod) bool {
	for _, e := range p.Exports {
		if e.Cluster != p.Cluster || e.Namespace != p.Namespace {
			return false
		}
	}
	return true
}

// Journal queues the record store's changes for the next batch write, under
// each record's cluster and "<namespace>/<name>" (only the clusters keep
// says, every one when keep is nil). It never blocks on the disk. It
// returns how many records did not encode (left out of the file).
func (s *Store) Journal(changes []store.Change, keep func(cluster string) bool) (unencodable int) {
	for _, c := range changes {
		k := c.Key()
		if keep != nil && !keep(k.Cluster) {
			continue
		}
		key := nameKey(k.Namespace, k.Name)
		if c.New == nil {
			s.Delete(k.Cluster, key)
			continue
		}
		b, err := EncodePod(c.New)
		if err != nil {
			unencodable++
			continue
		}
		s.Put(k.Cluster, key, b)
	}
	return unencodable
}
