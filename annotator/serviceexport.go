package annotator

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	mcs "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// exportResult is what a reconcile learned about one exported Service.
type exportResult struct {
	pods     int   // Pods it selects that the annotator writes to
	writeErr error // the first failed write to one of them
}

// conditions are the status conditions (KEP-1645) of a ServiceExport whose
// Service is svc (nil when there is none); Conflict only when withConflict
// (no MCS controller compares the clusters' exports).
func conditions(svc *corev1.Service, name string, res exportResult, generation int64, withConflict bool) []metav1.Condition {
	cond := func(t mcs.ServiceExportConditionType, s metav1.ConditionStatus, r mcs.ServiceExportConditionReason, msg string) metav1.Condition {
		return metav1.Condition{Type: string(t), Status: s, Reason: string(r), Message: msg, ObservedGeneration: generation}
	}
	var valid metav1.Condition
	switch {
	case svc == nil:
		valid = cond(mcs.ServiceExportConditionValid, metav1.ConditionFalse, mcs.ServiceExportReasonNoService,
			fmt.Sprintf("Service %s does not exist", name))
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		valid = cond(mcs.ServiceExportConditionValid, metav1.ConditionFalse, mcs.ServiceExportReasonInvalidServiceType,
			"ExternalName Services cannot be exported")
	default:
		valid = cond(mcs.ServiceExportConditionValid, metav1.ConditionTrue, mcs.ServiceExportReasonValid,
			"the Service is exported through its Pods' export annotation")
	}
	var ready metav1.Condition
	switch {
	case valid.Status != metav1.ConditionTrue:
		ready = cond(mcs.ServiceExportConditionReady, metav1.ConditionFalse, mcs.ServiceExportReasonFailed, "not exported: "+valid.Message)
	case res.writeErr != nil:
		ready = cond(mcs.ServiceExportConditionReady, metav1.ConditionFalse, mcs.ServiceExportReasonFailed,
			fmt.Sprintf("writing the export annotation failed (retrying): %v", res.writeErr))
	default:
		ready = cond(mcs.ServiceExportConditionReady, metav1.ConditionTrue, mcs.ServiceExportReasonExported,
			fmt.Sprintf("%d Pods carry the export annotation", res.pods))
	}
	if !withConflict {
		return []metav1.Condition{valid, ready}
	}
	conflict := cond(mcs.ServiceExportConditionConflict, metav1.ConditionFalse, mcs.ServiceExportReasonNoConflicts,
		"each cluster's endpoints are answered with their own ports (headless): no conflict in this cluster; other clusters are not compared here")
	return []metav1.Condition{valid, ready, conflict}
}

// updateStatus sets want in se's status conditions when they differ (a
// condition whose status did not change keeps its transition time), and
// reports whether it wrote. It applies only its own conditions with
// server-side apply: conditions are a list keyed by type in both API
// versions, so other writers' conditions stay, and a write needs no
// resourceVersion, so a cache a moment behind its own last write causes no
// conflict.
func (c *Controller) updateStatus(ctx context.Context, gvr schema.GroupVersionResource, se *unstructured.Unstructured, want []metav1.Condition) (bool, error) {
	have, err := readConditions(se)
	if err != nil {
		klog.Warningf("ServiceExport %s/%s: unreadable status conditions are replaced: %v", se.GetNamespace(), se.GetName(), err)
		have = nil
	}
	next := append([]metav1.Condition(nil), have...)
	for _, w := range want {
		meta.SetStatusCondition(&next, w)
	}
	if equality.Semantic.DeepEqual(have, next) {
		return false, nil
	}
	list := make([]any, 0, len(want))
	for _, w := range want {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(meta.FindStatusCondition(next, w.Type))
		if err != nil {
			return false, err
		}
		list = append(list, m)
	}
	out := &unstructured.Unstructured{}
	out.SetAPIVersion(se.GetAPIVersion())
	out.SetKind(se.GetKind())
	out.SetNamespace(se.GetNamespace())
	out.SetName(se.GetName())
	if err := unstructured.SetNestedSlice(out.Object, list, "status", "conditions"); err != nil {
		return false, err
	}
	_, err = c.dynamic.Resource(gvr).Namespace(se.GetNamespace()).ApplyStatus(ctx, se.GetName(), out, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	return true, err
}

// readConditions reads status.conditions of an unstructured object.
func readConditions(u *unstructured.Unstructured) ([]metav1.Condition, error) {
	raw, found, err := unstructured.NestedSlice(u.Object, "status", "conditions")
	if err != nil || !found {
		return nil, err
	}
	out := make([]metav1.Condition, 0, len(raw))
	for _, r := range raw {
		m, ok := r.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("status.conditions: %T, want an object", r)
		}
		var cond metav1.Condition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &cond); err != nil {
			return nil, err
		}
		out = append(out, cond)
	}
	return out, nil
}
