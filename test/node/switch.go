package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

// StartProbe runs `workload probe NAME DURATION` in a Pod through kubectl
// exec, in the background: the Pod resolves name every 100 ms through its
// own resolv.conf. Its output ("ok=N fail=M", then one line per failure
// with its time) arrives on the channel once the probe ends.
func (c *Cluster) StartProbe(ns, pod, name string, d time.Duration) <-chan string {
	ch := make(chan string, 1)
	go func() {
		out, err := c.Kubectl(d+2*time.Minute, "-n", ns, "exec", pod, "--", "/workload", "probe", name, d.String())
		if err != nil {
			out += "\n" + err.Error()
		}
		ch <- out
	}()
	return ch
}

// ParseProbe reads the counts of a probe's output.
func ParseProbe(out string) (ok, fail int, err error) {
	_, err = fmt.Sscanf(out, "ok=%d fail=%d", &ok, &fail)
	return ok, fail, err
}

// EndpointLog records, with the time of each, the states of the kube-dns
// Service's endpoints (EndpointSlices of kube-system with the label
// kubernetes.io/service-name=kube-dns) as a watch sees them change: which
// CoreDNS Pod was ready, serving or terminating when. Set beside a probe's
// failure times, it tells in which step of a rollout a lookup was lost.
type EndpointLog struct {
	mu     sync.Mutex
	lines  []string
	last   map[string]string // slice name -> its last summary
	cancel context.CancelFunc
	done   chan struct{}
}

// WatchDNSEndpoints starts an EndpointLog; Stop ends it.
func (c *Cluster) WatchDNSEndpoints() *EndpointLog {
	ctx, cancel := context.WithCancel(context.Background())
	l := &EndpointLog{last: map[string]string{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		// Watches end (server timeouts, a restarted API server): start
		// again until stopped, at most once a second.
		for ctx.Err() == nil {
			w, err := c.Client.DiscoveryV1().EndpointSlices("kube-system").Watch(ctx,
				metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kube-dns"})
			if err == nil {
				for ev := range w.ResultChan() {
					if s, ok := ev.Object.(*discoveryv1.EndpointSlice); ok {
						l.record(s, ev.Type == watch.Deleted)
					}
				}
				w.Stop()
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return l
}

func (l *EndpointLog) record(s *discoveryv1.EndpointSlice, deleted bool) {
	var eps []string
	if !deleted {
		for _, e := range s.Endpoints {
			state := func(b *bool) string {
				if b == nil {
					return "?"
				}
				if *b {
					return "1"
				}
				return "0"
			}
			pod := ""
			if e.TargetRef != nil {
				pod = e.TargetRef.Name
			}
			eps = append(eps, fmt.Sprintf("%s(%s) ready=%s serving=%s terminating=%s", strings.Join(e.Addresses, ","), pod,
				state(e.Conditions.Ready), state(e.Conditions.Serving), state(e.Conditions.Terminating)))
		}
		sort.Strings(eps)
	}
	sum := strings.Join(eps, "; ")
	if deleted {
		sum = "(deleted)"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last[s.Name] == sum {
		return
	}
	l.last[s.Name] = sum
	l.lines = append(l.lines, time.Now().UTC().Format("15:04:05.000")+" "+string(s.AddressType)+" "+sum)
}

// Stop ends the watch.
func (l *EndpointLog) Stop() {
	l.cancel()
	<-l.done
}

// String is the log, a line per change.
func (l *EndpointLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// RestoreStockDNS re-applies kubeadm's DNS add-on the way kubeadm writes it
// (create or update: each object replaced whole, as `kubeadm upgrade`
// does), over ours: the ServiceAccount, the ClusterRole and its binding,
// the Corefile ConfigMap and the coredns Deployment. The kube-dns Service is
// left as it is (the same in both). It waits until a Pod of the stock
// template is ready.
func (c *Cluster) RestoreStockDNS(t harness.T) {
	t.Helper()
	b, err := os.ReadFile(stockDNSPath())
	if err != nil {
		t.Fatalf("node %s: %v", c.Name, err)
	}
	var keep []string
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if strings.Contains(doc, "\nkind: Service\n") {
			continue
		}
		keep = append(keep, doc)
	}
	f := filepath.Join(c.Dir, "kubeadm-coredns-restore.yaml")
	if err := os.WriteFile(f, []byte(strings.Join(keep, "\n---\n")), 0o644); err != nil {
		t.Fatalf("node %s: %v", c.Name, err)
	}
	c.mustKubectl(t, "replace", "-f", f)
	c.WaitRollout(t, "kube-system", "coredns")
}

// ConntrackCleanups are kube-proxy's log lines that report UDP conntrack
// entries deleted (entries that led to an endpoint no longer serving), with
// their times.
func (c *Cluster) ConntrackCleanups() string {
	b, err := os.ReadFile(filepath.Join(c.Dir, "kube-proxy.log"))
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Finished reconciling conntrack entries") && !strings.Contains(l, "entriesDeleted=0") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
