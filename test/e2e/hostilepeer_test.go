package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/test/harness"
)

// Memory limits of the shipped containers (manifests/annotator/deployment.yaml
// and manifests/coredns/deployment.yaml): a hostile peer must not push either
// process's peak RSS past them.
const (
	annotatorMemoryLimit = 256 << 20
	corednsMemoryLimit   = 170 << 20
)

// hostileSize is how many bytes of one hostile shape the peer offers per
// reply: far over every bound, and enough to take a reader that holds the
// reply whole past its container's limit several times over.
const hostileSize = 384 << 20

// floodSize is how many bytes of small Pods a flooding peer sends in one
// reply: several times the Pods a reader holds (ingest.MaxObjects).
const floodSize = 96 << 20

// hostileShape is one way a peer's API server lies: what it sends for a list
// of Pods and for a watch of them.
type hostileShape struct {
	name string
	// list writes the reply to a list of Pods; watch, when set, the reply to
	// a watch (the list then is an empty one, so that the reader watches).
	list, watch func(w io.Writer) error
}

var hostileShapes = []hostileShape{
	{name: "one-huge-pod-in-a-list", list: func(w io.Writer) error {
		return writeList(w, `{"resourceVersion":"1"}`, func(w io.Writer) error { return writeHugePod(w) })
	}},
	{name: "huge-list-continue", list: func(w io.Writer) error {
		if _, err := io.WriteString(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1","continue":"`); err != nil {
			return err
		}
		if err := writeFill(w, hostileSize); err != nil {
			return err
		}
		_, err := io.WriteString(w, `"},"items":[]}`)
		return err
	}},
	{name: "endless-small-pods", list: func(w io.Writer) error {
		return writeList(w, `{"resourceVersion":"1"}`, func(w io.Writer) error {
			// About 700,000 Pods in one reply, whatever the page size asked.
			for i, n := 0, 0; n < floodSize; i++ {
				if i > 0 {
					if _, err := io.WriteString(w, ","); err != nil {
						return err
					}
				}
				k, err := fmt.Fprintf(w, `{"metadata":{"name":"p%d","namespace":"demo","uid":"u%d","resourceVersion":"1"},"status":{"phase":"Running","podIP":"10.9.%d.%d"}}`, i, i, i/250%250, i%250+1)
				if err != nil {
					return err
				}
				n += k
			}
			return nil
		})
	}},
	{name: "endless-watch-of-new-pods",
		list: func(w io.Writer) error {
			return writeList(w, `{"resourceVersion":"1"}`, func(io.Writer) error { return nil })
		},
		watch: func(w io.Writer) error {
			// Each a new Pod: held, a reader's store would grow as long as
			// the peer sends.
			for i, n := 0, 0; n < floodSize; i++ {
				k, err := fmt.Fprintf(w, `{"type":"ADDED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"w%d","namespace":"demo","uid":"w%d","resourceVersion":"%d","labels":{%q:"true"}},"status":{"phase":"Running","podIP":"10.8.%d.%d"}}}`+"\n",
					i, i, i+2, annotation.ExporterLabel, i/250%250, i%250+1)
				if err != nil {
					return err
				}
				n += k
			}
			return nil
		}},
	{name: "one-huge-watch-event",
		list: func(w io.Writer) error {
			return writeList(w, `{"resourceVersion":"1"}`, func(io.Writer) error { return nil })
		},
		watch: func(w io.Writer) error {
			if _, err := io.WriteString(w, `{"type":"ADDED","object":`); err != nil {
				return err
			}
			if err := writeHugePod(w); err != nil {
				return err
			}
			_, err := io.WriteString(w, "}\n")
			return err
		}},
}

func writeList(w io.Writer, meta string, items func(io.Writer) error) error {
	if _, err := io.WriteString(w, `{"kind":"PodList","apiVersion":"v1","metadata":`+meta+`,"items":[`); err != nil {
		return err
	}
	if err := items(w); err != nil {
		return err
	}
	_, err := io.WriteString(w, "]}")
	return err
}

// writeHugePod writes one exporting Pod whose annotation is hostileSize bytes.
func writeHugePod(w io.Writer) error {
	if _, err := fmt.Fprintf(w, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"huge","namespace":"demo","uid":"u1","resourceVersion":"2","labels":{%q:"true"},"annotations":{%q:"`,
		annotation.ExporterLabel, annotation.ExportAnnotation); err != nil {
		return err
	}
	if err := writeFill(w, hostileSize); err != nil {
		return err
	}
	_, err := io.WriteString(w, `"}},"status":{"phase":"Running","podIP":"10.9.0.1"}}`)
	return err
}

var fill = bytes.Repeat([]byte("A"), 1<<20)

func writeFill(w io.Writer, n int) error {
	for ; n > 0; n -= len(fill) {
		if _, err := w.Write(fill[:min(n, len(fill))]); err != nil {
			return err
		}
	}
	return nil
}

// hostilePeer is an API server that answers /readyz, publishes no list of
// exporting namespaces and lies about Pods in one shape; everything else is
// 404. It counts the Pod replies it began.
type hostilePeer struct {
	srv   *httptest.Server
	shape hostileShape

	mu      sync.Mutex
	replies map[string]int // "<reader> <list|watch> <begun|done>" -> count
	paths   []string       // the first requests, for the failure message
}

// readers are the User-Agents of the two readers of a peer (ingest.Reader's
// UserAgent in the plugin and in mcs-annotator).
var readers = []string{"mcs-controller", "coredns-mcsannotations"}

func readerOf(r *http.Request) string {
	for _, ua := range readers {
		if strings.HasPrefix(r.UserAgent(), ua) {
			return ua
		}
	}
	return r.UserAgent()
}

func startHostilePeer(t *testing.T, shape hostileShape) *hostilePeer {
	t.Helper()
	p := &hostilePeer{shape: shape, replies: map[string]int{}}
	p.srv = httptest.NewTLSServer(http.HandlerFunc(p.serve)) // on 127.0.0.1
	t.Cleanup(p.srv.Close)
	return p
}

func (p *hostilePeer) serve(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	if len(p.paths) < 20 {
		p.paths = append(p.paths, r.Method+" "+r.URL.RequestURI())
	}
	p.mu.Unlock()
	switch {
	case r.URL.Path == "/readyz":
		_, _ = io.WriteString(w, "ok")
		return
	case strings.HasSuffix(r.URL.Path, "/configmaps"):
		// No list of exporting namespaces published: the readers then list
		// Pods in every namespace.
		if r.URL.Query().Get("watch") == "true" {
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)
		return
	case !strings.HasSuffix(r.URL.Path, "/pods"):
		http.NotFound(w, r)
		return
	}
	write, kind := p.shape.list, "list"
	if r.URL.Query().Get("watch") == "true" {
		if p.shape.watch == nil {
			<-r.Context().Done() // a watch that never sends
			return
		}
		write, kind = p.shape.watch, "watch"
	}
	key := readerOf(r) + " " + kind
	p.count(key + " begun")
	w.Header().Set("Content-Type", "application/json")
	if write(w) == nil { // stops at the first write the reader no longer takes
		p.count(key + " done")
	}
}

func (p *hostilePeer) count(key string) {
	p.mu.Lock()
	p.replies[key]++
	p.mu.Unlock()
}

func (p *hostilePeer) n(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replies[key]
}

func (p *hostilePeer) requests() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.paths, "\n")
}

const hostileCorefile = `clusterset.local:{PORT} {
    bind 127.0.0.1
    mcsannotations clusterset.local {
        cluster edge-a
        kubeconfig {KUBECONFIG}
        peer hostile {PEER}
    }
}
`

// TestHostilePeerMemory: a peer's API server that sends a Pod list holding
// one Pod of 384 MiB, a list whose metadata.continue is 384 MiB, a list of
// 700,000 small Pods, a watch event of 384 MiB or a watch of 700,000 new Pods
// takes neither the MCS controller (bin/mcs-annotator -mcs-controller -peer)
// nor CoreDNS (peer) past its container's memory limit: both refuse each
// reply at its bound, or drop the Pods past what a reader holds (the
// controller counts each, CoreDNS logs it), and keep running.
func TestHostilePeerMemory(t *testing.T) {
	harness.RequireTools(t, harness.ToolEtcd, harness.ToolAPIServer, harness.ToolAnnotator, harness.ToolCoreDNS)
	ns := "hostile-peer"
	a := mcsClusters(t, ns, "edge-a")[0]
	for _, shape := range hostileShapes {
		t.Run(shape.name, func(t *testing.T) {
			peer := startHostilePeer(t, shape)
			kc := filepath.Join(harness.TempDir(t), "hostile.kubeconfig")
			if err := harness.WriteKubeconfig(kc, "hostile", peer.srv.URL, "token"); err != nil {
				t.Fatal(err)
			}
			// As the manifests run them: GOMEMLIMIT at the container's limit.
			t.Setenv("GOMEMLIMIT", fmt.Sprint(annotatorMemoryLimit))
			ctl := harness.StartAnnotator(t, a.Kubeconfig, "--cluster", "edge-a", "--leader-elect=false",
				"-mcs-controller", "-peer", "hostile="+kc)
			t.Setenv("GOMEMLIMIT", fmt.Sprint(corednsMemoryLimit))
			dns := harness.StartCoreDNS(t, hostileCorefile, map[string]string{"KUBECONFIG": a.Kubeconfig, "PEER": kc})

			// Each reader met the shape twice (its first read and a retry);
			// a flood of watched Pods until the full store ends the watch and
			// the reader watches again after a list.
			kind, state, times := "list", "begun", 2
			flood := shape.name == "endless-watch-of-new-pods"
			if shape.watch != nil {
				kind = "watch"
			}
			for _, ua := range readers {
				key := ua + " " + kind + " " + state
				pollUntil(t, 2*time.Minute, fmt.Sprintf("%d× %s", times, key), func() error {
					if n := peer.n(key); n < times {
						return fmt.Errorf("%d; requests so far:\n%s", n, peer.requests())
					}
					return nil
				})
			}
			counter, logged := "mcs_controller_oversized_replies_total", "over its size bound"
			if flood {
				counter, logged = "mcs_controller_malformed_lists_total", "more Pods than a reader holds"
			}
			eventuallyMetric(t, ctl, counter, "a refusal counted", func(v float64) bool { return v >= 1 })
			for _, c := range []struct {
				name  string
				proc  *harness.Process
				limit int64
			}{{"mcs-annotator", ctl.Process(), annotatorMemoryLimit}, {"coredns", dns.Process(), corednsMemoryLimit}} {
				if !c.proc.Running() {
					t.Fatalf("%s exited", c.name)
				}
				peak, err := c.proc.StatusBytes("VmHWM")
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s: peak RSS %d MiB (limit %d MiB)", c.name, peak>>20, c.limit>>20)
				if peak > c.limit {
					t.Errorf("%s: peak RSS %d MiB, over its container's limit of %d MiB", c.name, peak>>20, c.limit>>20)
				}
			}
			if _, err := ctl.Get("/healthz"); err != nil {
				t.Errorf("mcs-annotator /healthz: %v", err)
			}
			if !strings.Contains(dns.Log(), logged) {
				t.Errorf("CoreDNS logged no refusal (%q):\n%s", logged, dns.LogTail(30))
			}
		})
	}
}

// pollUntil polls ok every 200 ms until it returns nil or d passes.
func pollUntil(t *testing.T, d time.Duration, what string, ok func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		err := ok()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %v: %v", what, d, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
