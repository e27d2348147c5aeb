package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

// ErrStream is wrapped by every error of a list read one item at a time
// (ListEach) but those of its each: the reply broke off, is not a list, or
// holds an item over MaxEvent bytes or metadata over podproto.MaxListMeta.
var ErrStream = errors.New("bad list stream")

// Dynamic is the client of custom resources (in JSON): client-go's dynamic
// client, whose lists Resource reads one item at a time (ListEach).
type Dynamic struct {
	dynamic.Interface
	rest rest.Interface
}

// NewDynamic returns the Dynamic client of rc: client-go's dynamic client
// over one REST client, which ListEach also lists through. It asks for JSON
// only (ListEach decodes JSON), even where client-go's CBOR feature gate
// would let the dynamic client take CBOR.
func NewDynamic(rc *rest.Config) (*Dynamic, error) {
	cfg := dynamic.ConfigFor(rc)
	cfg.ContentType, cfg.AcceptContentTypes = "application/json", "application/json"
	cfg.GroupVersion = nil // every path is absolute, as the dynamic client's
	c, err := rest.UnversionedRESTClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return &Dynamic{Interface: dynamic.New(c), rest: c}, nil
}

// ListEach lists gvr in every namespace as the dynamic client does, but
// hands each item to each as soon as its bytes are in: the reply is never
// held whole, neither its bytes nor its decoded objects.
// Each item may be at most MaxEvent bytes, the list's metadata and any
// other field at most podproto.MaxListMeta. An error of each stops the list
// and is returned as it is; every other error after the request was
// answered wraps ErrStream.
func (d *Dynamic) ListEach(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions, each func(*unstructured.Unstructured) error) (metav1.ListMeta, error) {
	path := []string{"/apis", gvr.Group, gvr.Version, gvr.Resource}
	if gvr.Group == "" {
		path = []string{"/api", gvr.Version, gvr.Resource}
	}
	body, err := d.rest.Get().AbsPath(path...).
		SpecificallyVersionedParams(&opts, metav1.ParameterCodec, schema.GroupVersion{Version: "v1"}).
		Stream(withStreamed(ctx))
	if err != nil {
		return metav1.ListMeta{}, err
	}
	defer body.Close()
	var list metav1.TypeMeta
	return eachJSONItem(body, MaxEvent, &list, func(raw []byte) error {
		u := &unstructured.Unstructured{}
		if err := utiljson.Unmarshal(raw, &u.Object); err != nil || u.Object == nil {
			return fmt.Errorf("%w: an item is no object: %v", ErrStream, err)
		}
		if u.GetKind() == "" { // the items of a built-in type's list (a PodList) have none
			u.SetAPIVersion(list.APIVersion)
			u.SetKind(strings.TrimSuffix(list.Kind, "List"))
		}
		return each(u)
	})
}

// Resource returns the ListerWatcher of gvr in every namespace, each object
// cut down by transform. Through a *Dynamic the list is read one object at
// a time and each is transformed as it arrives (see ListEach).
func Resource(client dynamic.Interface, gvr schema.GroupVersionResource, transform func(*unstructured.Unstructured) (runtime.Object, error)) *ListerWatcher {
	ri := client.Resource(gvr)
	lw := typed(transform, func(*metav1.ListOptions) {}, ri.List, ri.Watch)
	if d, ok := client.(*Dynamic); ok {
		lw.ListWithContextFunc = func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return transformedList(transform, func(each func(*unstructured.Unstructured) error) (metav1.ListMeta, error) {
				return d.ListEach(ctx, gvr, opts, each)
			})
		}
	}
	return lw
}

type streamedKey struct{}

// withStreamed marks ctx as that of a list read by ListEach: its reply is
// bounded item by item, so Transport does not bound it whole.
func withStreamed(ctx context.Context) context.Context {
	return context.WithValue(ctx, streamedKey{}, true)
}

func streamed(ctx context.Context) bool {
	v, _ := ctx.Value(streamedKey{}).(bool)
	return v
}

// eachJSONItem is podproto.EachJSONItem with this package's errors: each's
// error is returned as it is; every other wraps ErrStream (and ErrTooLarge
// for a part over its bound), a list cut off io.ErrUnexpectedEOF.
func eachJSONItem(r io.Reader, max int64, tm *metav1.TypeMeta, each func([]byte) error) (metav1.ListMeta, error) {
	var eachErr error
	meta, err := podproto.EachJSONItem(r, max, ErrTooLarge, tm, func(raw []byte) error {
		eachErr = each(raw)
		return eachErr
	})
	switch {
	case eachErr != nil:
		return metav1.ListMeta{}, eachErr
	case err != nil:
		return metav1.ListMeta{}, fmt.Errorf("%w: %w", ErrStream, err)
	}
	return meta, nil
}
