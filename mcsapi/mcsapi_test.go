package mcsapi

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clienttesting "k8s.io/client-go/testing"
)

// served answers discovery for the group versions it lists, NotFound for
// the others, or an error for every one when down.
type served struct {
	*fakediscovery.FakeDiscovery
	versions map[string][]string // version -> resources
	down     bool
}

func (s *served) ServerResourcesForGroupVersion(gv string) (*metav1.APIResourceList, error) {
	if s.down {
		return nil, errors.New("connect: connection refused")
	}
	for v, rs := range s.versions {
		if gv == Group+"/"+v {
			l := &metav1.APIResourceList{GroupVersion: gv}
			for _, r := range rs {
				l.APIResources = append(l.APIResources, metav1.APIResource{Name: r, Namespaced: true})
			}
			return l, nil
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: Group}, gv)
}

func TestFind(t *testing.T) {
	fake := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}
	for _, tc := range []struct {
		name     string
		d        *served
		resource string
		version  string // "" not found
		err      bool
	}{
		{"none served", &served{FakeDiscovery: fake}, ServiceImports, "", false},
		{"v1beta1 preferred", &served{FakeDiscovery: fake, versions: map[string][]string{"v1alpha1": {ServiceImports}, "v1beta1": {ServiceImports}}}, ServiceImports, "v1beta1", false},
		{"v1alpha1 only", &served{FakeDiscovery: fake, versions: map[string][]string{"v1alpha1": {ServiceExports, ServiceImports}}}, ServiceExports, "v1alpha1", false},
		{"the group without the resource", &served{FakeDiscovery: fake, versions: map[string][]string{"v1beta1": {ServiceImports}}}, ServiceExports, "", false},
		{"unreachable: an error, not absent", &served{FakeDiscovery: fake, down: true}, ServiceImports, "", true},
	} {
		gvr, found, err := Find(tc.d, tc.resource)
		if found != (tc.version != "") || (found && gvr != (schema.GroupVersionResource{Group: Group, Version: tc.version, Resource: tc.resource})) || (err != nil) != tc.err {
			t.Errorf("%s: %v, found %v, err %v; want version %q, error %v", tc.name, gvr, found, err, tc.version, tc.err)
		}
	}
}
