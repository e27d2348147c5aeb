package podproto

import (
	"bytes"
	"errors"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// Plugin is what the plugin's transforms (the sources' and the clients
// watcher's) read of a Pod's labels and annotations. Their tests decode Pods
// through Trim with it, so that a transform that starts reading a field the
// decoder drops fails there. (The endpoint statement and its signature are
// read only by a relay hub's sources, source.Options.KeepProof.)
var Plugin = Keep{
	Labels: []string{annotation.ExporterLabel, annotation.ImporterLabel},
	Annotations: []string{annotation.ExportAnnotation, annotation.SignatureAnnotation, annotation.ImportAnnotation,
		annotation.EndpointAnnotation, annotation.EndpointSignatureAnnotation},
}

// Trim returns pod as a client built by NewClient with keep receives it:
// encoded in protobuf as the API server sends it, and decoded by a Decoder.
func Trim(pod *v1.Pod, keep Keep) (*v1.Pod, error) {
	var buf bytes.Buffer
	enc := scheme.Codecs.EncoderForVersion(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), v1.SchemeGroupVersion)
	if err := enc.Encode(pod, &buf); err != nil {
		return nil, err
	}
	out := &v1.Pod{}
	d := &Decoder{Keep: keep, Fallback: refuse{}}
	if err := runtime.DecodeInto(d, buf.Bytes(), out); err != nil {
		return nil, err
	}
	return out, nil
}

// refuse is Trim's fallback: a Pod that the Decoder did not take is an error,
// not a whole Pod.
type refuse struct{}

func (refuse) Decode([]byte, *schema.GroupVersionKind, runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	return nil, nil, errors.New("not decoded by podproto")
}
