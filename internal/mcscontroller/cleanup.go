package mcscontroller

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
)

// cleanup deletes the objects this controller made for service k that its
// outcome (c.done[k]) does not hold: every one when nothing of k is wanted
// (its ServiceImport included), else the slices and derived Service it no
// longer writes. Nothing of a service whose writes failed is deleted: what
// it holds is not known to be all it wants. It reports whether it deleted
// anything; failed deletes are returned.
func (c *Controller) cleanup(ctx context.Context, k clusterset.Key) (bool, error) {
	d := c.done[k]
	if d != nil && d.failed {
		return false, nil
	}
	deleted := false
	var errs []error
	del := func(kind string, err error) {
		if apierrors.IsNotFound(err) { // gone already: nothing was written
			return
		}
		c.metrics.write(kind+"_delete", err)
		if err != nil {
			errs = append(errs, err)
			return
		}
		deleted = true
	}
	sls, _ := c.slices.ByIndex(indexService, k.String())
	for _, o := range sls {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok && (d == nil || !d.hasSlice(s.Namespace, s.Name)) {
			del("endpointslice", c.client.DiscoveryV1().EndpointSlices(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}))
		}
	}
	svcs, _ := c.services.ByIndex(indexService, k.String())
	for _, o := range svcs {
		if s, ok := o.(*corev1.Service); ok && (d == nil || d.service != s.Namespace+"/"+s.Name) {
			del("service", c.client.CoreV1().Services(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}))
		}
	}
	if d == nil && c.storedImport(k) != nil {
		del("serviceimport", c.dyn.Resource(c.importsGVR).Namespace(k.Namespace).Delete(ctx, k.Name, metav1.DeleteOptions{}))
	}
	return deleted, errors.Join(errs...)
}
