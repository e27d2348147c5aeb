package annotator

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/source"
)

// Endpoint statements (--sign-endpoints, docs/DESIGN.md#relay-hubs): on each
// Pod it exports, the annotator states the Pod's addresses, hostname and
// readiness as the plugin reads them (internal/source), with a sequence
// number that only grows, and signs the statement with the export annotation
// (annotation.SignEndpoint), so that a hub relaying the Pod's record can
// neither alter nor replay it.

// statement is an endpoint statement known to be the annotator's own on a
// Pod (written by it, or verified with its key): the export annotation value
// it was signed with, the statement and its signature, and whether it is
// known to be on the Pod (read from it, or applied).
type statement struct {
	value, endpoint, sig string
	applied              bool
}

// same tells whether two statements are the same bytes.
func (s statement) same(o statement) bool {
	return s.value == o.value && s.endpoint == o.endpoint && s.sig == o.sig
}

// endpoint returns the endpoint statement and its signature that pod should
// carry with the export annotation value want, or "", "" when not stating
// endpoints or want is "". The Pod's current statement is kept when it is
// the annotator's (remembered in prev, or verifying with its key), was
// signed with want and says what the Pod says now: then nothing is written.
// Otherwise the new statement's seq is the Unix time in milliseconds, or
// one more than the largest seq of the annotator's own earlier statements
// on the Pod when that is larger (a clock that went back, another replica's
// clock ahead), and not smaller than the time of the last Pod list (so that
// a statement signed after a list is not older than it: podlist.go). The
// result is noted in next, and the Pod among those the next list names.
func (c *Controller) endpoint(pod *corev1.Pod, want string, prev, next map[types.UID]statement) (string, string) {
	if !c.cfg.SignEndpoints || want == "" {
		return "", ""
	}
	e := annotation.Endpoint{Hostname: pod.Spec.Hostname, Ready: source.PodReady(pod)}
	for _, a := range source.PodIPs(pod) {
		if len(e.IPs) == 2 { // the API server allows two (one per family); a reader refuses more
			break
		}
		e.IPs = append(e.IPs, a.String())
	}
	known, remembered := prev[pod.UID]
	have := statement{pod.Annotations[annotation.ExportAnnotation], pod.Annotations[annotation.EndpointAnnotation], pod.Annotations[annotation.EndpointSignatureAnnotation], true}
	var seq uint64
	for _, s := range [...]statement{have, known} {
		if s.endpoint == "" {
			continue
		}
		if !remembered || !s.same(known) {
			if _, ok := annotation.VerifyEndpoint(c.public, s.sig, c.cfg.Cluster, pod.Namespace, pod.Name, string(pod.UID), s.value, s.endpoint); !ok {
				continue // not ours: its seq means nothing
			}
		}
		old, _, err := annotation.ParseEndpoint(s.endpoint)
		if err != nil {
			continue
		}
		e.Seq = old.Seq
		if s.value == want && annotation.FormatEndpoint(e) == s.endpoint {
			c.listed.stated(pod, 0)
			next[pod.UID] = s
			return s.endpoint, s.sig
		}
		seq = max(seq, old.Seq)
	}
	e.Seq = c.listed.stated(pod, max(uint64(time.Now().UnixMilli()), seq+1))
	s := statement{value: want, endpoint: annotation.FormatEndpoint(e)}
	s.sig = annotation.SignEndpoint(c.cfg.SignKey, c.cfg.Cluster, pod.Namespace, pod.Name, string(pod.UID), want, s.endpoint)
	next[pod.UID] = s
	return s.endpoint, s.sig
}

// endEndpoint handles a Pod that ended or is being deleted, which the
// annotator otherwise leaves alone (writable): when it carries a statement
// of the annotator's that no longer says what the Pod says (it was ready),
// the statement is replaced with one that says not ready, its export
// annotation and labels kept as they are, so that a relayed record stops
// answering when a direct reader's does.
func (c *Controller) endEndpoint(ctx context.Context, pod *corev1.Pod, prev, next map[types.UID]statement) error {
	if !c.cfg.SignEndpoints || !owns(pod, fieldEndpoint) || !owns(pod, fieldExport) {
		return nil
	}
	value := pod.Annotations[annotation.ExportAnnotation]
	stmt, sig := c.endpoint(pod, value, prev, next)
	if stmt == "" || endpointInSync(pod, stmt, sig) {
		return nil
	}
	w := podWrite{export: value, sig: pod.Annotations[annotation.SignatureAnnotation], endpoint: stmt, endpointSig: sig, importer: owns(pod, fieldImporter)}
	if err := c.writePod(ctx, pod, w, true, true); err != nil {
		return err
	}
	c.appliedEndpoint(pod.UID, next)
	return nil
}

// appliedEndpoint notes, after a write, that the Pod carries its statement
// in next, and counts the statement if it was new.
func (c *Controller) appliedEndpoint(uid types.UID, next map[types.UID]statement) {
	if s, ok := next[uid]; ok && !s.applied {
		s.applied = true
		next[uid] = s
		c.metrics.EndpointStatements.Inc()
	}
}
