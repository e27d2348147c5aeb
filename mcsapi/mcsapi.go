// Package mcsapi names the MCS API resources (KEP-1645, the CRDs of
// sigs.k8s.io/mcs-api) that the plugin and the annotator read, and asks
// discovery which version an API server serves. Both versions name the same
// objects (the CRD has no conversion webhook), so only one is watched.
package mcsapi

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
)

// Group is the MCS API group.
const Group = "multicluster.x-k8s.io"

// The resources read.
const (
	ServiceExports = "serviceexports"
	ServiceImports = "serviceimports"
)

// Versions are the API versions looked for, the preferred first.
var Versions = []string{"v1beta1", "v1alpha1"}

// Find asks discovery which version of resource the API server serves.
// found is false with a nil error when it serves none; an error means the
// API server did not say (unreachable, or another failure): the caller keeps
// what it had.
func Find(d discovery.DiscoveryInterface, resource string) (gvr schema.GroupVersionResource, found bool, err error) {
	var errs []error
	for _, v := range Versions {
		rl, err := d.ServerResourcesForGroupVersion(Group + "/" + v)
		if err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
			continue
		}
		for _, r := range rl.APIResources {
			if r.Name == resource {
				return schema.GroupVersionResource{Group: Group, Version: v, Resource: resource}, true, nil
			}
		}
	}
	return schema.GroupVersionResource{}, false, errors.Join(errs...)
}
