package mcscontroller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/mcsannotations/mcsannotations/internal/clusterset"
)

// syncConflict sets the Conflict condition of the local ServiceExport of k
// (if any), as the whole clusterset shows it, and records an Event when the
// exports come to conflict. The annotator sets Valid and Ready; each
// condition has one writer.
func (c *Controller) syncConflict(ctx context.Context, k clusterset.Key) error {
	o, err := c.exports.ByNamespace(k.Namespace).Get(k.Name)
	if err != nil {
		return nil // no local export
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	var im *clusterset.Import
	if d := c.done[k]; d != nil {
		im = d.merged
	}
	if im == nil {
		return nil // not exported (yet): the annotator's Valid and Ready say why
	}
	status, reason := metav1.ConditionFalse, im.Reason()
	if im.Conflict() {
		status = metav1.ConditionTrue
	}
	have := condition(u, string(mcsv1beta1.ServiceExportConditionConflict))
	if have != nil && have.Status == status && have.Reason == reason && have.Message == im.Message && have.ObservedGeneration == u.GetGeneration() {
		return nil
	}
	if status == metav1.ConditionTrue && (have == nil || have.Status != status || have.Reason != reason || have.Message != im.Message) && c.cfg.Recorder != nil {
		c.cfg.Recorder.Event(u, corev1.EventTypeWarning, ReasonConflict, im.Message)
	}
	cond := metav1.Condition{Type: string(mcsv1beta1.ServiceExportConditionConflict), Status: status, Reason: reason,
		Message: im.Message, ObservedGeneration: u.GetGeneration(), LastTransitionTime: metav1.Now()}
	cm, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&cond)
	st := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": u.GetAPIVersion(), "kind": u.GetKind(),
		"metadata": map[string]any{"namespace": u.GetNamespace(), "name": u.GetName()},
		"status":   map[string]any{"conditions": []any{cm}},
	}}
	_, err = c.dyn.Resource(c.exportsGVR).Namespace(u.GetNamespace()).ApplyStatus(ctx, u.GetName(), st,
		metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	c.metrics.write("serviceexport_status", err)
	return err
}

func condition(u *unstructured.Unstructured, typ string) *metav1.Condition {
	list, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, o := range list {
		m, ok := o.(map[string]any)
		if !ok || m["type"] != typ {
			continue
		}
		var c metav1.Condition
		if runtime.DefaultUnstructuredConverter.FromUnstructured(m, &c) == nil {
			return &c
		}
	}
	return nil
}
