package podproto

import (
	"compress/gzip"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	restclientwatch "k8s.io/client-go/rest/watch"
)

// apiServer answers, in protobuf, a list and a watch of Pods and a list of
// ConfigMaps, as an API server does.
func apiServer(t *testing.T, pod *v1.Pod) *httptest.Server {
	t.Helper()
	info, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/api/v1/namespaces/shop/pods" && r.URL.Query().Get("watch") == "true":
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf+";stream=watch")
			enc := restclientwatch.NewEncoder(
				streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(w), info.StreamSerializer.Serializer),
				scheme.Codecs.EncoderForVersion(info.Serializer, v1.SchemeGroupVersion))
			if err := enc.Encode(&watch.Event{Type: watch.Modified, Object: pod}); err != nil {
				t.Error(err)
			}
		case r.URL.Path == "/api/v1/namespaces/shop/pods":
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
			w.Write(encode(t, &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "7"}, Items: []v1.Pod{*pod}}))
		case r.URL.Path == "/api/v1/namespaces/shop/configmaps":
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
			w.Write(encode(t, &v1.ConfigMapList{Items: []v1.ConfigMap{{ObjectMeta: metav1.ObjectMeta{Name: "cm", Labels: map[string]string{"any": "x"}}}}}))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestClient: the client's Pods, listed and watched, carry only the kept
// fields; other kinds are whole.
func TestClient(t *testing.T) {
	pod := realistic()
	srv := apiServer(t, pod)
	rc := &rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{
		ContentType: runtime.ContentTypeProtobuf, AcceptContentTypes: runtime.ContentTypeProtobuf,
	}}
	cs, err := NewClient(rc, keep)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	want := project(pod)
	list, err := cs.CoreV1().Pods("shop").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if list.ResourceVersion != "7" || len(list.Items) != 1 {
		t.Fatalf("list %+v", list)
	}
	comparePods(t, 0, &list.Items[0], want)

	w, err := cs.CoreV1().Pods("shop").Watch(ctx, metav1.ListOptions{ResourceVersion: "7"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	select {
	case ev := <-w.ResultChan():
		got, ok := ev.Object.(*v1.Pod)
		if ev.Type != watch.Modified || !ok {
			t.Fatalf("event %v %T", ev.Type, ev.Object)
		}
		comparePods(t, 1, got, want)
	case <-ctx.Done():
		t.Fatal("no watch event")
	}

	cms, err := cs.CoreV1().ConfigMaps("shop").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cms.Items) != 1 || cms.Items[0].Labels["any"] != "x" {
		t.Errorf("ConfigMaps %+v", cms.Items)
	}
	if cs.Discovery().RESTClient() == nil || cs.AppsV1() == nil {
		t.Error("the rest of the clientset is missing")
	}
}

// TestListPods: the client's streamed list asks for what it is given and
// reads the answer gzipped or not, in protobuf or JSON; an error status is
// client-go's API error (a reflector relists on an expired version).
func TestListPods(t *testing.T) {
	a, b := realistic(), realistic()
	b.Name = "second"
	// realistic's managed fields are not JSON.
	a.ManagedFields, b.ManagedFields = nil, nil
	list := &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "11"}, Items: []v1.Pod{*a, *b}}
	var gzipped, query atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/pods" {
			http.NotFound(w, r)
			return
		}
		query.Store(r.URL.RawQuery)
		switch r.URL.Query().Get("resourceVersion") {
		case "expired":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusGone)
			w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410,"message":"too old resource version"}`))
		case "json":
			w.Header().Set("Content-Type", "application/json")
			if err := scheme.Codecs.LegacyCodec(v1.SchemeGroupVersion).Encode(list, w); err != nil {
				t.Error(err)
			}
		default:
			w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
			if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
				w.Write(encode(t, list))
				return
			}
			// As the API server does for a large response.
			gzipped.Store(true)
			w.Header().Set("Content-Encoding", "gzip")
			z := gzip.NewWriter(w)
			z.Write(encode(t, list))
			z.Close()
		}
	}))
	t.Cleanup(srv.Close)
	cs, err := NewClient(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{
		ContentType: runtime.ContentTypeProtobuf, AcceptContentTypes: runtime.ContentTypeProtobuf + ",application/json",
	}}, keep)
	if err != nil {
		t.Fatal(err)
	}
	lister, ok := cs.(interface {
		ListPods(context.Context, metav1.ListOptions, func(*v1.Pod) error) (metav1.ListMeta, error)
	})
	if !ok {
		t.Fatal("the client has no ListPods")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, rv := range []string{"5", "json"} {
		var pods []*v1.Pod
		meta, err := lister.ListPods(ctx, metav1.ListOptions{ResourceVersion: rv, LabelSelector: "l=true"}, func(p *v1.Pod) error {
			pods = append(pods, p)
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", rv, err)
		}
		if q, _ := query.Load().(string); !strings.Contains(q, "labelSelector=l%3Dtrue") || !strings.Contains(q, "resourceVersion="+rv) {
			t.Errorf("%s: asked %q", rv, q)
		}
		if meta.ResourceVersion != "11" || len(pods) != 2 {
			t.Fatalf("%s: listed %+v, %d Pods", rv, meta, len(pods))
		}
		want := []*v1.Pod{project(a), project(b)}
		if rv == "json" {
			want = []*v1.Pod{a, b} // the fallback keeps everything
		}
		for i := range pods {
			comparePods(t, i, pods[i], want[i])
		}
	}
	if g, _ := gzipped.Load().(bool); !g {
		t.Error("the client did not ask for gzip")
	}
	_, err = lister.ListPods(ctx, metav1.ListOptions{ResourceVersion: "expired"}, func(*v1.Pod) error { return nil })
	if !apierrors.IsResourceExpired(err) {
		t.Errorf("expired: err %v, want client-go's Expired error", err)
	}
}
