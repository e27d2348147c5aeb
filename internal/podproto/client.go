package podproto

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

// NewClient returns kubernetes.NewForConfig(rc), except that its CoreV1
// client decodes Pods with a Decoder keeping keep: its Pods, and so its Pod
// reflectors' Pods, carry only the fields listed in the package comment. Give
// rc protobuf as its content type, or nothing changes.
func NewClient(rc *rest.Config, keep Keep) (kubernetes.Interface, error) {
	httpClient, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfigAndClient(rc, httpClient)
	if err != nil {
		return nil, err
	}
	// What corev1.NewForConfigAndClient sets, but the serializer.
	cfg := rest.CopyConfig(rc)
	cfg.GroupVersion = &v1.SchemeGroupVersion
	cfg.APIPath = "/api"
	cfg.NegotiatedSerializer = negotiated{
		NegotiatedSerializer: rest.CodecFactoryForGeneratedClient(scheme.Scheme, scheme.Codecs).WithoutConversion(),
		keep:                 keep,
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rcl, err := rest.RESTClientForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	return clientset{
		Clientset: cs,
		core:      corev1.New(rcl),
		lists:     &Decoder{Keep: keep, Fallback: scheme.Codecs.UniversalDeserializer()},
	}, nil
}

// clientset is a Clientset whose CoreV1 client is another.
type clientset struct {
	*kubernetes.Clientset
	core  corev1.CoreV1Interface
	lists *Decoder
}

// ListPods lists the Pods of every namespace that opts selects, handing each
// to each as it arrives (see Decoder.List): a list of 100,000 Pods is never
// held whole, neither its bytes nor its decoded Pods. The response is read
// as the server sends it, gzipped when it is large (client-go's transport
// asks for gzip and unzips as it reads).
func (c clientset) ListPods(ctx context.Context, opts metav1.ListOptions, each func(*v1.Pod) error) (metav1.ListMeta, error) {
	return c.ListPodsIn(ctx, metav1.NamespaceAll, opts, each)
}

// ListPodsIn is ListPods in one namespace (all when namespace is empty).
func (c clientset) ListPodsIn(ctx context.Context, namespace string, opts metav1.ListOptions, each func(*v1.Pod) error) (metav1.ListMeta, error) {
	ctx = WithStreamed(ctx)
	body, err := c.core.RESTClient().Get().Namespace(namespace).Resource("pods").VersionedParams(&opts, scheme.ParameterCodec).Stream(ctx)
	if err != nil {
		return metav1.ListMeta{}, err
	}
	defer body.Close()
	return c.lists.List(body, each)
}

type streamedKey struct{}

// WithStreamed marks ctx as that of a list read as ListPods reads it.
func WithStreamed(ctx context.Context) context.Context {
	return context.WithValue(ctx, streamedKey{}, true)
}

// Streamed reports whether ctx is that of a ListPods request: its reply, in
// protobuf, is read one field at a time, each at most MaxField bytes, so a
// transport need not bound it whole.
func Streamed(ctx context.Context) bool {
	v, _ := ctx.Value(streamedKey{}).(bool)
	return v
}

func (c clientset) CoreV1() corev1.CoreV1Interface { return c.core }

// negotiated puts a Decoder in front of every decoder that the client's
// requests and watches use.
type negotiated struct {
	runtime.NegotiatedSerializer
	keep Keep
}

func (n negotiated) DecoderToVersion(s runtime.Decoder, gv runtime.GroupVersioner) runtime.Decoder {
	return &Decoder{Keep: n.keep, Fallback: n.NegotiatedSerializer.DecoderToVersion(s, gv)}
}
