package podinformer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	restclientwatch "k8s.io/client-go/rest/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/mcsannotations/mcsannotations/internal/podproto"
)

type cut struct{ v1.Pod }

// cutting is a transform that cuts Pods down to their metadata, counting
// them in n, and passes anything else through.
func cutting(n *atomic.Int32) cache.TransformFunc {
	return func(obj any) (any, error) {
		p, ok := obj.(*v1.Pod)
		if !ok {
			return obj, nil
		}
		n.Add(1)
		return &cut{Pod: v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion}}}, nil
	}
}

func TestNew(t *testing.T) {
	pod := func(name string, labels map[string]string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Labels: labels, ResourceVersion: "1"}}
	}
	client := fake.NewClientset(pod("in", map[string]string{"export": "true"}), pod("out", nil))
	var transformed atomic.Int32
	factory, inf, err := New(client, "export=true", cutting(&transformed), Events{})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer func() { close(stop); factory.Shutdown() }()
	factory.Start(stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("no sync")
	}
	keys := inf.GetStore().ListKeys()
	if len(keys) != 1 || keys[0] != "shop/in" {
		t.Errorf("stored %v, want the selected Pod only", keys)
	}
	if obj, _, _ := inf.GetStore().GetByKey("shop/in"); obj == nil || transformed.Load() != 1 {
		t.Errorf("stored %T after %d transforms", obj, transformed.Load())
	} else if _, ok := obj.(*cut); !ok {
		t.Errorf("stored %T, want the transform's object", obj)
	}
	if ix := inf.GetIndexer().GetIndexers(); len(ix) != 0 {
		t.Errorf("indexers %v, want none", ix)
	}
}

// TestNewStreams: with podproto's client against a server that answers as
// an API server does, the informer lists through the client's stream (not
// client-go's watch-list), transforms each Pod once, and then watches.
func TestNewStreams(t *testing.T) {
	pod := func(name, rv string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", UID: k8stypes.UID("uid-" + name), ResourceVersion: rv}}
	}
	info, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	encoder := scheme.Codecs.EncoderForVersion(info.Serializer, v1.SchemeGroupVersion)
	var lists, watchLists atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if r.URL.Path != "/api/v1/pods" || q.Get("labelSelector") != "export=true" {
			http.NotFound(w, r)
			return
		}
		if q.Get("sendInitialEvents") != "" {
			watchLists.Add(1)
		}
		if q.Get("watch") != "true" {
			lists.Add(1)
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
			list := &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "10"}, Items: []v1.Pod{*pod("a", "8"), *pod("b", "9")}}
			if err := encoder.Encode(list, w); err != nil {
				t.Error(err)
			}
			return
		}
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf+";stream=watch")
		enc := restclientwatch.NewEncoder(streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(w), info.StreamSerializer.Serializer), encoder)
		if q.Get("resourceVersion") == "10" {
			if err := enc.Encode(&watch.Event{Type: watch.Added, Object: pod("c", "11")}); err != nil {
				t.Error(err)
			}
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	client, err := podproto.NewClient(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{
		ContentType: runtime.ContentTypeProtobuf, AcceptContentTypes: runtime.ContentTypeProtobuf,
	}}, podproto.Keep{})
	if err != nil {
		t.Fatal(err)
	}
	var transformed atomic.Int32
	factory, inf, err := New(client, "export=true", cutting(&transformed), Events{})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer func() { close(stop); factory.Shutdown(); srv.CloseClientConnections() }()
	factory.Start(stop)
	deadline := time.Now().Add(10 * time.Second)
	for len(inf.GetStore().ListKeys()) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	keys := inf.GetStore().ListKeys()
	sort.Strings(keys)
	if !reflect.DeepEqual(keys, []string{"shop/a", "shop/b", "shop/c"}) {
		t.Fatalf("stored %v, want the listed Pods and the watched one", keys)
	}
	for _, k := range keys {
		if obj, _, _ := inf.GetStore().GetByKey(k); reflect.TypeOf(obj) != reflect.TypeOf(&cut{}) {
			t.Errorf("%s stored as %T", k, obj)
		}
	}
	if n := transformed.Load(); n != 3 {
		t.Errorf("%d transforms, want one per Pod", n)
	}
	if lists.Load() != 1 || watchLists.Load() != 0 {
		t.Errorf("%d lists and %d watch-lists, want one list and no watch-list", lists.Load(), watchLists.Load())
	}
}
