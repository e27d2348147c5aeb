package ingest

import (
	"context"
	"errors"
	"net/http"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// The one way every reader of a cluster (CoreDNS's sources, the MCS
// controller's sources) builds its clients: the same content types, the same
// bounds on what an API server's replies may make it read, the same rate
// limits. A peer's API server is anyone's.

// Client-side rate limit of a cluster's readers. A scoped peer is read one
// exporting namespace at a time: a list and a watch each at start and after
// an outage, which client-go's default (5 a second, bursts of 10) would
// spread over seconds. The API server protects itself (priority and
// fairness).
const (
	ReaderQPS   = 50
	ReaderBurst = 200
)

// Protobuf is the content type a reader asks Pods in.
const Protobuf = "application/vnd.kubernetes.protobuf"

// RESTConfig is the REST config of a kubeconfig file and context; an empty
// kubeconfig means the in-cluster config.
func RESTConfig(kubeconfig, context string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
		&clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
}

// Reader is how a component reads clusters: its user agent, and what it does
// with a reply cut at its bound (log and count it; nil: nothing).
type Reader struct {
	UserAgent string
	TooLarge  func(error)
}

// bound makes rc's every reply bounded (see Transport) and sets the user
// agent.
func (r Reader) bound(rc *rest.Config) *rest.Config {
	rc = rest.CopyConfig(rc)
	rc.UserAgent = r.UserAgent
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return Transport(rt, r.TooLarge) })
	return rc
}

// Pods returns the client a source reads a cluster's Pods with: Pods in
// protobuf, decoded with only the fields the sources and the clients watcher
// read (podproto.Plugin), lists streamed one Pod at a time, every reply
// bounded, at the readers' rate limit.
func (r Reader) Pods(rc *rest.Config) (kubernetes.Interface, error) {
	rc = r.bound(rc)
	rc.QPS, rc.Burst = ReaderQPS, ReaderBurst
	// Decoding protobuf is several times cheaper than JSON, which is most of
	// a (re)list's cost; JSON stays for what has no protobuf form.
	rc.ContentType = Protobuf
	rc.AcceptContentTypes = Protobuf + ",application/json"
	cs, err := podproto.NewClient(rc, podproto.Plugin)
	s, ok := cs.(Streamer)
	if err != nil || !ok || r.TooLarge == nil {
		return cs, err
	}
	return reporting{cs, s, r.TooLarge}, nil
}

// reporting is a Pods client whose streamed lists report a Pod or list
// metadata over its bound, or more Pods than MaxObjects (ErrTooLarge), as
// the transport reports a reply over its bound: the bound is met while
// decoding, not while reading. The error it returns is marked reported, so
// that the ListerWatcher does not report the same list again as malformed.
type reporting struct {
	kubernetes.Interface
	s        Streamer
	tooLarge func(error)
}

func (c reporting) ListPodsIn(ctx context.Context, namespace string, opts metav1.ListOptions, each func(*v1.Pod) error) (metav1.ListMeta, error) {
	meta, err := c.s.ListPodsIn(ctx, namespace, opts, each)
	if errors.Is(err, ErrTooLarge) {
		c.tooLarge(err)
		err = reported{err}
	}
	return meta, err
}

// reported is an error a Reader's TooLarge already heard of.
type reported struct{ error }

func (r reported) Unwrap() error { return r.error }

// wasReported tells whether err is one a Reader's TooLarge already heard of.
func wasReported(err error) bool {
	var r reported
	return errors.As(err, &r)
}

// Dynamic returns the client a component reads custom resources with (in
// JSON, lists read one item at a time: see ListEach), every reply bounded.
func (r Reader) Dynamic(rc *rest.Config) (*Dynamic, error) {
	return NewDynamic(r.bound(rc))
}
