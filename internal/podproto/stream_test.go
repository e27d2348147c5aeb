package podproto

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"reflect"
	goruntime "runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/mcsannotations/mcsannotations/internal/replytest"
)

// collect lists data with d, returning the Pods handed over.
func collect(d *Decoder, r io.Reader) ([]*v1.Pod, metav1.ListMeta, error) {
	var pods []*v1.Pod
	meta, err := d.List(r, func(p *v1.Pod) error {
		pods = append(pods, p)
		return nil
	})
	return pods, meta, err
}

// sameList fails unless pods and meta are what decoding data whole gives.
func sameList(t *testing.T, name string, d *Decoder, data []byte, pods []*v1.Pod, meta metav1.ListMeta) {
	t.Helper()
	want := &v1.PodList{}
	if err := runtime.DecodeInto(d, data, want); err != nil {
		t.Fatalf("%s: decoding whole: %v", name, err)
	}
	if !reflect.DeepEqual(meta, want.ListMeta) {
		t.Fatalf("%s: list metadata %+v, want %+v", name, meta, want.ListMeta)
	}
	if len(pods) != len(want.Items) {
		t.Fatalf("%s: %d Pods, want %d", name, len(pods), len(want.Items))
	}
	for i := range pods {
		comparePods(t, i, pods[i], &want.Items[i])
	}
}

// TestListLikeDecode: a streamed list gives the Pods and metadata that the
// Decoder gives for the same bytes whole (which TestDecodeLikeClientGo holds
// to client-go's), whether the stream comes at once or a byte at a time.
func TestListLikeDecode(t *testing.T) {
	f := fuzzer.FuzzerFor(metafuzzer.Funcs, rand.NewSource(2), scheme.Codecs).NilChance(0.3).NumElements(0, 4)
	d := &Decoder{Keep: keep, Fallback: standard(t)}
	lists := []*v1.PodList{
		{},
		{ListMeta: metav1.ListMeta{ResourceVersion: "42"}, Items: []v1.Pod{*realistic(), *realistic()}},
	}
	for i := 0; i < 30; i++ {
		var list v1.PodList
		f.Fill(&list)
		lists = append(lists, &list)
	}
	for i, list := range lists {
		data := encode(t, list)
		pods, meta, err := collect(d, bytes.NewReader(data))
		if err != nil {
			t.Fatalf("list %d: %v", i, err)
		}
		sameList(t, "list", d, data, pods, meta)
		pods, meta, err = collect(d, iotest.OneByteReader(bytes.NewReader(data)))
		if err != nil {
			t.Fatalf("list %d, a byte at a time: %v", i, err)
		}
		sameList(t, "a byte at a time", d, data, pods, meta)
	}
}

// TestListCut: a stream cut anywhere before the end of the list's bytes is
// an error, never an empty or shorter list, and the Pods handed over before
// the error are the list's first ones. (After the list's bytes come only the
// envelope's empty content encoding and type: a cut between fields there
// loses nothing and lists the whole list.)
func TestListCut(t *testing.T) {
	d := &Decoder{Keep: keep, Fallback: standard(t)}
	a, b := realistic(), realistic()
	b.Name = "second"
	data := encode(t, &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "9"}, Items: []v1.Pod{*a, *b}})
	env, err := decodeEnvelope(data[len(prefix):])
	if err != nil {
		t.Fatal(err)
	}
	listEnd := bytes.Index(data, env.raw) + len(env.raw)
	if listEnd == len(data) {
		t.Fatal("the envelope has nothing after the list: the cuts below would all be before its end")
	}
	for n := 0; n < len(data); n++ {
		pods, meta, err := collect(d, bytes.NewReader(data[:n]))
		if n >= listEnd {
			// Whole, or an error when the cut is inside a trailing field.
			if err != nil && n > listEnd {
				continue
			}
			if err != nil || len(pods) != 2 || meta.ResourceVersion != "9" {
				t.Fatalf("cut at %d, after the list's %d bytes: %d Pods, %+v, %v", n, listEnd, len(pods), meta, err)
			}
			continue
		}
		if err == nil {
			t.Fatalf("cut at %d of %d: listed %d Pods with no error", n, len(data), len(pods))
		}
		if n >= len(prefix) && !errors.Is(err, ErrStream) {
			t.Fatalf("cut at %d: %v does not wrap ErrStream", n, err)
		}
		for i, p := range pods {
			if want := []string{a.Name, b.Name}[i]; p.Name != want {
				t.Fatalf("cut at %d: Pod %d is %q, want %q", n, i, p.Name, want)
			}
		}
	}
}

// TestListRefuses: oversized fields, other kinds, a second list, a content
// encoding and broken tags are errors wrapping ErrStream; each's error is
// returned as it is, and stops the list.
func TestListRefuses(t *testing.T) {
	d := &Decoder{Keep: keep, Fallback: standard(t)}
	podList := encode(t, &v1.PodList{Items: []v1.Pod{*realistic()}})
	env, err := decodeEnvelope(podList[len(prefix):])
	if err != nil {
		t.Fatal(err)
	}
	envelope := func(kind string, raw []byte, extra ...byte) []byte {
		u := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "v1", Kind: kind}, Raw: raw}
		b, err := u.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return append(append(append([]byte(nil), prefix...), b...), extra...)
	}
	// raw field (2), then the length as a varint.
	rawHeader := func(n uint64) []byte {
		b := []byte{0x12}
		for n >= 0x80 {
			b = append(b, byte(n)|0x80)
			n >>= 7
		}
		return append(b, byte(n))
	}
	typeOnly := envelope("PodList", nil)
	cases := map[string]struct {
		data []byte
		want string
	}{
		"ConfigMapList":      {encode(t, &v1.ConfigMapList{}), "not v1 PodList"},
		"a Pod, not a list":  {encode(t, realistic()), "not v1 PodList"},
		"no list":            {typeOnly, "no list after the type"},
		"a second list":      {append(append(append([]byte(nil), podList...), rawHeader(uint64(len(env.raw)))...), env.raw...), "a second list"},
		"content encoding":   {envelope("PodList", env.raw, 0x1a, 0x04, 'g', 'z', 'i', 'p'), `content encoding "gzip"`},
		"oversized Pod":      {append(typeOnly, append(rawHeader(MaxField+100), append([]byte{0x12}, rawHeader(MaxField + 1)[1:]...)...)...), "the limit is"},
		"oversized type":     {append(append([]byte(nil), prefix...), append([]byte{0x0a}, rawHeader(MaxField + 1)[1:]...)...), "the limit is"},
		"Pod overruns list":  {append(typeOnly, append(rawHeader(4), 0x12, 0x7f, 0, 0)...), "overruns its message"},
		"field number 0":     {append(append([]byte(nil), prefix...), 0x02, 0x00), "field number 0"},
		"a group":            {append(append([]byte(nil), prefix...), 0x0b), "wrong wire type"},
		"a Pod's wrong type": {envelope("PodList", []byte{0x12, 0x02, 0x08, 0x01}), "wrong wire type"},
		"an endless varint":  {append(typeOnly, rawHeader(1)[0], 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), "overflow"},
	}
	for name, c := range cases {
		_, _, err := collect(d, bytes.NewReader(c.data))
		if !errors.Is(err, ErrStream) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want ErrStream with %q", name, err, c.want)
		}
	}

	// A read that fails (the link dropped), at the start or mid-list, and
	// inside a JSON list.
	broken := errors.New("connection reset")
	for name, r := range map[string]io.Reader{
		"at the start": iotest.ErrReader(broken),
		"mid-list":     io.MultiReader(bytes.NewReader(podList[:100]), iotest.ErrReader(broken)),
		"inside JSON":  io.MultiReader(strings.NewReader(`{"kind":"PodList",`), iotest.ErrReader(broken)),
	} {
		if _, _, err := collect(d, r); !errors.Is(err, ErrStream) || !errors.Is(err, broken) {
			t.Errorf("a failed read %s: err %v, want ErrStream wrapping the read's error", name, err)
		}
	}

	stop := errors.New("stop")
	calls := 0
	_, err = d.List(bytes.NewReader(encode(t, &v1.PodList{Items: []v1.Pod{*realistic(), *realistic()}})), func(*v1.Pod) error {
		calls++
		return stop
	})
	if err != stop || calls != 1 {
		t.Errorf("each's error: got %v after %d calls, want it as it is after 1", err, calls)
	}
}

// TestListJSON: a list that is not protobuf is decoded whole by the
// fallback.
func TestListJSON(t *testing.T) {
	d := &Decoder{Keep: keep, Fallback: scheme.Codecs.UniversalDeserializer()}
	data := `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"j","annotations":{"other":"kept"}}}]}`
	pods, meta, err := collect(d, strings.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if meta.ResourceVersion != "5" || len(pods) != 1 || pods[0].Name != "j" || pods[0].Annotations["other"] != "kept" {
		t.Errorf("listed %+v, %+v", meta, pods)
	}
	if _, _, err := collect(d, strings.NewReader(`{"kind":"PodList"`)); !errors.Is(err, ErrStream) {
		t.Errorf("broken JSON: err %v", err)
	}
}

// FuzzList: whatever the bytes, no panic; a list that streams decodes whole
// to the same Pods.
func FuzzList(f *testing.F) {
	f.Add(encode(f, &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "3"}, Items: []v1.Pod{*realistic(), *realistic()}}))
	f.Add(encode(f, &v1.PodList{}))
	d := &Decoder{Keep: keep, Fallback: refuse{}}
	f.Fuzz(func(t *testing.T, data []byte) {
		pods, meta, err := collect(d, bytes.NewReader(data))
		if err != nil {
			return
		}
		sameList(t, "fuzz", d, data, pods, meta)
	})
}

// BenchmarkList streams a list of 1,000 realistic Pods.
func BenchmarkList(b *testing.B) {
	list := &v1.PodList{Items: make([]v1.Pod, 1000)}
	for i := range list.Items {
		list.Items[i] = *realistic()
	}
	data := encode(b, list)
	d := &Decoder{Keep: keep, Fallback: standard(b)}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.List(bytes.NewReader(data), func(*v1.Pod) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// TestListMetaBounded: a list of Pods whose metadata (a continue token) or
// type is longer than MaxListMeta, though under MaxField, is refused as a
// broken stream: in protobuf by its length, before its bytes are read, in
// JSON once MaxListMeta of it is held (a field a JSON list does not know
// too): the client reads a few times MaxListMeta of the reply, never all
// of it. A protobuf field the list does not know, however long, is skipped
// without being held.
func TestListMetaBounded(t *testing.T) {
	list := encode(t, &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "7"}, Items: []v1.Pod{*realistic()}})
	env, err := decodeEnvelope(list[len(prefix):])
	if err != nil {
		t.Fatal(err)
	}
	header := func(kind string) []byte { // the envelope up to its raw field
		b, err := (&runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "v1", Kind: kind}}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return append(append([]byte(nil), prefix...), b...)
	}
	const unknown = 64 << 20
	unknownTag := protowire.AppendVarint(protowire.AppendTag(nil, 15, protowire.BytesType), unknown)
	cases := []struct {
		name string
		head []byte // then pad bytes of 'x' up to the reply's end
		pad  int
		want string // in the error; "" for a list that reads
	}{{
		name: "continue token of 8 MiB",
		head: encode(t, &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "7", Continue: strings.Repeat("x", 8<<20)}, Items: []v1.Pod{*realistic()}}),
		want: "the list's metadata: a field of",
	}, {
		name: "type of 8 MiB",
		head: header(strings.Repeat("x", 8<<20)),
		want: "the limit is 65536",
	}, {
		name: "JSON list with a continue token of 8 MiB",
		head: []byte(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":"` + strings.Repeat("x", 8<<20) + `"},"items":[]}`),
		want: "the list's metadata",
	}, {
		name: "JSON list with an unknown field of 8 MiB",
		head: []byte(`{"kind":"PodList","apiVersion":"v1","padding":"` + strings.Repeat("x", 8<<20) + `","items":[]}`),
		want: "over its size bound",
	}, {
		name: "unknown field of 64 MiB in the list",
		head: append(append(append(header("PodList"), protowire.AppendVarint([]byte{0x12}, uint64(len(env.raw)+len(unknownTag)+unknown))...), env.raw...), unknownTag...),
		pad:  unknown,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pad := bytes.Repeat([]byte{'x'}, 64<<10)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
				if _, err := w.Write(tc.head); err != nil {
					return
				}
				for n := 0; n < tc.pad; n += len(pad) {
					if _, err := w.Write(pad); err != nil {
						return
					}
				}
			}))
			defer srv.Close()
			var over atomic.Bool
			limit := int64(streamBuffer + 4*MaxListMeta)
			if tc.want == "" {
				limit = int64(len(tc.head) + tc.pad)
			}
			rc := &rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: runtime.ContentTypeProtobuf, AcceptContentTypes: runtime.ContentTypeProtobuf},
				WrapTransport: replytest.Counting(limit, &over)}
			cs, err := NewClient(rc, keep)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var before, after goruntime.MemStats
			goruntime.ReadMemStats(&before)
			n := 0
			meta, err := cs.(clientset).ListPodsIn(ctx, "shop", metav1.ListOptions{}, func(*v1.Pod) error { n++; return nil })
			goruntime.ReadMemStats(&after)
			if over.Load() {
				t.Errorf("the reply was read past %d bytes", limit)
			}
			if tc.want == "" {
				if err != nil || n != 1 || meta.ResourceVersion != "7" {
					t.Errorf("listed %d Pods, %+v, %v; want the Pod at version 7", n, meta, err)
				}
				if a := after.TotalAlloc - before.TotalAlloc; a > 4<<20 {
					t.Errorf("skipping a %d-byte field allocated %d bytes", unknown, a)
				}
				return
			}
			if !errors.Is(err, ErrStream) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want ErrStream with %q", err, tc.want)
			}
		})
	}
}
