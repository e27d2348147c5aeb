package mcscontroller

import (
	"context"
	"errors"
	"fmt"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/workqueue"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// Reconcile syncs, once, every service queued by now (every service the
// first time): what RunLoop does after each burst, and what the tests call.
func (c *Controller) Reconcile(ctx context.Context) error { return c.reconcile(ctx) }

// reconcile takes every key queued by now (with first, taken already) and
// syncs the services they name together: those queued themselves (their
// local objects changed), every service of a namespace queued, those whose
// records changed since the last sync (as the record index says), and
// every service when keyAll was queued or the clusters' states changed.
// Each service is decided by plan (the caps admit new ones in order of
// age, over the whole batch) and written by its own sync, up to Workers at
// once; a service that waits (damping, the backoff of a failed write) goes
// back to the queue until it is due.
func (c *Controller) reconcile(ctx context.Context, first ...clusterset.Key) error {
	batch := first
	defer func() {
		for _, k := range batch {
			c.queue.Done(k)
		}
	}()
	if !c.canSync() {
		for _, k := range first {
			c.queue.AddAfter(k, c.cfg.Interval) // the loop waits for the sync: not reached
		}
		return nil
	}
	for c.queue.Len() > 0 {
		k, shutdown := c.queue.Get()
		if shutdown {
			break
		}
		batch = append(batch, k)
	}
	dirty, dirtyNS, all := map[clusterset.Key]bool{}, map[string]bool{}, false
	for _, k := range batch {
		switch {
		case k == keyAll:
			all = true
		case k == keyRecords: // the index says which, below
		case k.Name == "":
			dirtyNS[k.Namespace] = true
		default:
			dirty[k] = true
		}
	}

	c.reconciling.Lock()
	defer c.reconciling.Unlock()
	start := time.Now()
	current, stale, outOf, state := c.clusterState(start)
	if seen := c.seenState.Load(); seen == nil || *seen != state {
		all = true
	}

	// The services whose records changed since the last reconcile are
	// dirty; only the dirty services' records are read (all of them when
	// every service is synced), those of current clusters.
	for k := range c.index.takeChanged() {
		dirty[k] = true
	}
	var groups map[clusterset.Key][]*store.Pod
	if all {
		groups = c.index.groups(nil, current)
		for k := range groups {
			dirty[k] = true
		}
		for k := range c.done {
			dirty[k] = true
		}
		c.ownedKeys(dirty)
	} else {
		for ns := range dirtyNS {
			c.index.keysIn(ns, dirty)
		}
		for k := range c.done {
			if dirtyNS[k.Namespace] {
				dirty[k] = true
			}
		}
		groups = c.index.groups(dirty, current)
	}

	// The slices of the clusters whose share is not known (not heard from
	// since the start, not restored from the snapshot): held as they are.
	var existing []*discoveryv1.EndpointSlice
	for k := range dirty {
		objs, _ := c.slices.ByIndex(indexService, k.String())
		for _, o := range objs {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok {
				existing = append(existing, s)
			}
		}
	}
	held := heldSlices(existing, stale)

	now := time.Now()
	if all {
		c.pruneDamping(now)
	}
	// A service that waits (damping, the backoff of a failed write) is
	// left as it is until due: it is queued again for then.
	for k := range dirty {
		if t, ok := c.notBefore[k]; ok && now.Before(t) {
			delete(dirty, k)
			c.queue.AddAfter(k, t.Sub(now))
			c.metrics.Deferred.Inc()
		}
	}
	planned, said := c.plan(dirty, groups, held, outOf, now)
	// The services with something to write go first, then those that only
	// delete: an object that one service no longer wants and another one
	// would write under the same name is left alone until the next sync,
	// as the owner check says, not taken over in a race.
	jobs := make([]job, 0, len(dirty))
	for _, j := range planned {
		jobs = append(jobs, j)
	}
	writers := len(jobs)
	for k := range dirty {
		if _, ok := planned[k]; !ok {
			jobs = append(jobs, job{k: k, out: c.done[k]})
		}
	}
	type result struct {
		wrote bool
		err   error
	}
	results := make([]result, len(jobs))
	for _, part := range [][2]int{{0, writers}, {writers, len(jobs)}} {
		workqueue.ParallelizeUntil(ctx, c.cfg.Workers, part[1]-part[0], func(i int) {
			wrote, err := c.sync(ctx, jobs[part[0]+i])
			results[part[0]+i] = result{wrote, err}
		})
	}
	var errs []error
	if ctx.Err() != nil {
		// Stopped before every sync ran: what did not run is not known to be written.
		for _, j := range jobs {
			if j.out != nil {
				j.out.failed = true
			}
		}
		errs = append(errs, ctx.Err())
	}
	for k := range dirty {
		if o := c.done[k]; o != nil {
			s, cf := o.counts()
			c.nslices, c.nconflicts = c.nslices+s, c.nconflicts+cf
		}
	}

	// What was left out is reported; each service's writes are paced, and
	// a failed one is tried again after its own backoff.
	for _, j := range jobs {
		if j.im != nil {
			said[j.k] = j.out.notes // the plan's and the sync's
		}
	}
	for k, n := range said {
		c.report(k, n)
	}
	for i, j := range jobs {
		k := j.k
		if results[i].wrote {
			if t := c.wrote(k, now); t.After(c.notBefore[k]) {
				c.notBefore[k] = t
			}
		}
		if j.out != nil && j.im != nil {
			for _, cl := range j.out.wroteShares {
				sk := shareKey{k, cl}
				if t := c.wroteShare(k, cl, now); t.After(c.shareNotBefore[sk]) {
					c.shareNotBefore[sk] = t
				}
			}
			if !j.out.due.IsZero() {
				// Shares left as stored for their damping: again when due.
				c.queue.AddAfter(k, j.out.due.Sub(now))
				c.metrics.Deferred.Inc()
			}
		}
		if err := results[i].err; err != nil {
			errs = append(errs, fmt.Errorf("service %s: %w", k, err))
			d := c.retry.When(k)
			if t := now.Add(d); t.After(c.notBefore[k]) {
				c.notBefore[k] = t
			}
			c.queue.AddAfter(k, d)
			continue
		}
		c.queue.Forget(k)
	}

	c.seenState.Store(&state)
	c.logCaps()
	c.metrics.observe(len(c.done), c.nslices, c.nconflicts, len(c.refused), time.Since(start))
	return errors.Join(errs...)
}

// canSync says whether the CRDs are served and every informer has synced.
func (c *Controller) canSync() bool {
	select {
	case <-c.ready:
	default:
		return false // the CRDs are not served yet
	}
	for _, s := range c.synced {
		if !s() {
			return false
		}
	}
	return true
}

// ownedKeys adds to keys every service this controller holds an object of
// (a slice, a derived Service, a ServiceImport) or that has a local
// ServiceExport: a full sync looks at each, to delete what nothing wants
// and to set each export's condition.
func (c *Controller) ownedKeys(keys map[clusterset.Key]bool) {
	for _, l := range [][]any{c.slices.List(), c.services.List()} {
		for _, o := range l {
			if k, ok := byServiceLabel(o); ok && k.Name != "" {
				keys[k] = true
			}
		}
	}
	imports, _ := c.imports.List(labels.SelectorFromSet(labels.Set{clusterset.LabelManagedBy: clusterset.ManagedBy}))
	exports, _ := c.exports.List(labels.Everything())
	for _, o := range append(imports, exports...) {
		if k, ok := byName(o); ok {
			keys[k] = true
		}
	}
}
