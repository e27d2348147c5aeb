package mcscontroller

import (
	"context"
	"errors"
	"slices"
)

// sync writes one service as plan decided it (j): its ServiceImport,
// derived Service and the slices of the clusters whose share is current
// (when j.im is set), then deletes the objects of the service that it no
// longer wants, and sets its local ServiceExport's Conflict condition. A
// failed write leaves the rest of the service as it is (nothing of it is
// deleted) and is returned; it reports whether anything was written.
func (c *Controller) sync(ctx context.Context, j job) (wrote bool, err error) {
	var errs []error
	if j.im != nil {
		if err := c.syncService(ctx, j.k, j.im, j.cur, j.out, j.derived); err != nil {
			errs = append(errs, err)
			j.out.failed = true
		}
	}
	if j.out != nil {
		slices.Sort(j.out.slices)
		wrote = j.out.wrote
	}
	deleted, err := c.cleanup(ctx, j.k)
	errs = append(errs, err)
	errs = append(errs, c.syncConflict(ctx, j.k))
	return wrote || deleted, errors.Join(errs...)
}
