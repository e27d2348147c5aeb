package node

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// WorkloadPod is a Pod running the workload image's HTTP echo on 8080,
// which answers with the cluster and Pod name; Ready once it serves.
func WorkloadPod(ns, name, cluster string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name:            "workload",
				Image:           WorkloadImage,
				ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{
					{Name: "CLUSTER", Value: cluster},
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromString("http")}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
}

// CreatePod creates a Pod and waits (bounded) until it is Ready, with the
// kubelet's events and the components' logs when it is not.
func (c *Cluster) CreatePod(t harness.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if _, err := c.Client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("node %s: create Pod %s/%s: %v", c.Name, pod.Namespace, pod.Name, err)
	}
	return c.WaitPodReady(t, pod.Namespace, pod.Name)
}

// WaitPodReady waits (bounded) until the Pod is Ready and returns it.
func (c *Cluster) WaitPodReady(t harness.T, ns, name string) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	c.waitFor(t, fmt.Sprintf("Pod %s/%s Ready", ns, name), func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				got = p
				return nil
			}
		}
		return fmt.Errorf("phase %s, conditions %v, containers %v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
	})
	return got
}

// waitFor is wait, with the cluster's events added to a timeout's report.
func (c *Cluster) waitFor(t harness.T, what string, f func() error) {
	t.Helper()
	if err := c.poll(f); err != nil {
		ev, _ := c.Kubectl(30*time.Second, "get", "events", "-A", "--sort-by", ".lastTimestamp")
		t.Fatalf("node %s: no %s after %s: %v\nevents:\n%s\n%s", c.Name, what, readyTimeout, err, ev, c.Logs(30))
	}
}

// WaitDeployment waits (bounded) until a Deployment has a ready replica.
func (c *Cluster) WaitDeployment(t harness.T, ns, name string) {
	t.Helper()
	c.waitFor(t, fmt.Sprintf("Deployment %s/%s ready", ns, name), func() error {
		d, err := c.Client.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ReadyReplicas == 0 {
			return fmt.Errorf("no ready replica: %+v", d.Status)
		}
		return nil
	})
}

// WaitRollout waits (bounded) until a Pod of the Deployment's current
// revision (its newest ReplicaSet) is Ready: the template just applied runs,
// not only the previous one.
func (c *Cluster) WaitRollout(t harness.T, ns, name string) {
	t.Helper()
	c.waitFor(t, fmt.Sprintf("a ready Pod of Deployment %s/%s's current revision", ns, name), func() error {
		ctx := context.Background()
		d, err := c.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		rev := d.Annotations["deployment.kubernetes.io/revision"]
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil {
			return err
		}
		rss, err := c.Client.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil {
			return err
		}
		hash := ""
		for _, rs := range rss.Items {
			if rev != "" && rs.Annotations["deployment.kubernetes.io/revision"] == rev {
				hash = rs.Labels["pod-template-hash"]
			}
		}
		if hash == "" {
			return fmt.Errorf("no ReplicaSet of revision %q yet", rev)
		}
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String() + ",pod-template-hash=" + hash})
		if err != nil {
			return err
		}
		var states []string
		for _, p := range pods.Items {
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					return nil
				}
			}
			states = append(states, fmt.Sprintf("%s: %s %v", p.Name, p.Status.Phase, p.Status.Conditions))
		}
		return fmt.Errorf("revision %s (pod-template-hash %s): no ready Pod: %v", rev, hash, states)
	})
}
