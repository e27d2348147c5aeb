package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/mcscontroller"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
)

// peerFlags collects -peer NAME=KUBECONFIG, as CoreDNS's `peer` words name
// the same peers with the same credentials.
type peerFlags []peer

type peer struct{ name, kubeconfig string }

func (p *peerFlags) String() string {
	var s []string
	for _, x := range *p {
		s = append(s, x.name+"="+x.kubeconfig)
	}
	return strings.Join(s, ",")
}

func (p *peerFlags) Set(v string) error { return addNamed((*[]peer)(p), "peer", v) }

// hubFlags collects -hub NAME=KUBECONFIG, as CoreDNS's `hub` words name the
// same relay hubs with the same credentials.
type hubFlags []peer

func (h *hubFlags) String() string { return (*peerFlags)(h).String() }

func (h *hubFlags) Set(v string) error { return addNamed((*[]peer)(h), "hub", v) }

// addNamed adds NAME=KUBECONFIG v to list, a kind ("peer", "hub") of
// cluster each named once.
func addNamed(list *[]peer, kind, v string) error {
	name, path, ok := strings.Cut(v, "=")
	if !ok || name == "" || path == "" {
		return fmt.Errorf("%q: want NAME=KUBECONFIG", v)
	}
	if !annotation.ValidClusterID(name) {
		return fmt.Errorf("%s %q: must be an RFC 1123 subdomain of at most %d characters", kind, name, annotation.MaxClusterIDLen)
	}
	for _, x := range *list {
		if x.name == name {
			return fmt.Errorf("%s %q named twice", kind, name)
		}
	}
	*list = append(*list, peer{name, path})
	return nil
}

// checkMCS checks the MCS controller's flags.
func checkMCS(o *options) error {
	o.hubLists = o.hubLists || o.hubUIDLists
	if o.hubLists && len(o.hubs) == 0 {
		return errors.New("-hub-require-pod-lists needs -hub")
	}
	if o.hubLists && o.verify == "" {
		return errors.New("-hub-require-pod-lists needs -verify: only a controller that verifies checks the origins' Pod lists")
	}
	if !o.mcsController {
		if len(o.peers) > 0 {
			return errors.New("-peer needs -mcs-controller")
		}
		if len(o.hubs) > 0 {
			return errors.New("-hub needs -mcs-controller: the MCS controller reads the hubs")
		}
		if o.verify != "" {
			return errors.New("-verify needs -mcs-controller: only the MCS controller reads export annotations")
		}
		if o.relay {
			return errors.New("-relay needs -mcs-controller: a relay hub's controller writes what it relays")
		}
		if o.snapshotDir != "" {
			return errors.New("-snapshot-dir needs -mcs-controller: it is the MCS controller's snapshot")
		}
		return nil
	}
	if o.cluster == "" {
		return errors.New("-mcs-controller needs --cluster: the local cluster's ID names its share of every import")
	}
	for _, p := range o.peers {
		if p.name == o.cluster {
			return fmt.Errorf("peer %q has the name of the local cluster", p.name)
		}
	}
	if o.verify != "" {
		keys, err := annotation.ReadPublicKeys(o.verify)
		if err != nil {
			return fmt.Errorf("-verify %s: cannot read the public keys: %w", o.verify, err)
		}
		o.keys = keys
		if err := annotation.RequireKey(keys, o.verify, o.cluster, "the local cluster"); err != nil {
			return err
		}
		for _, p := range o.peers {
			if err := annotation.RequireKey(keys, o.verify, p.name, "peer"); err != nil {
				return err
			}
		}
	}
	if o.peerExpire < 0 {
		return fmt.Errorf("-peer-expire %v: must not be negative", o.peerExpire)
	}
	return nil
}

// startMCS starts the MCS controller's sources (the local cluster and every
// peer, feeding the record store) and its informers on every replica, so
// that a new leader writes at once. It returns the write loop, for the
// leader to run.
//
// The local cluster's exported Pods come from the annotator's informer of
// every local Pod (localPods, with annotator.Config.RecordFields), so that
// the binary watches the local Pods once. Every peer and hub is read as
// CoreDNS reads it (ingest.Reader: protobuf, streamed lists, every reply
// bounded). With -verify every cluster is read under the same signature
// check: what CoreDNS would refuse never reaches an object.
func startMCS(ctx context.Context, o options, localPods cache.SharedInformer, client kubernetes.Interface, dyn dynamic.Interface,
	disco discovery.DiscoveryInterface, reg prometheus.Registerer) (func(context.Context), error) {
	sm := newSourceMetrics(reg)
	reader := ingest.Reader{
		UserAgent: "mcs-controller",
		TooLarge: func(err error) {
			sm.oversized.Inc()
			klog.Warningf("mcs-controller: refused a reply over its size bound (a broken or hostile API server?), keeping what is held: %v", err)
		},
	}
	records := store.New()
	events := source.Events{
		Rejected: func(cluster, ns, name string, rej []annotation.Rejection) {
			for _, r := range rej {
				sm.rejected.WithLabelValues(cluster, string(r.Reason)).Inc()
				klog.Warningf("cluster %s: Pod %s/%s: export annotation: %s", cluster, ns, name, r)
			}
		},
		StateChanged: func(cluster string, from, to source.State, err error) {
			klog.Infof("mcs-controller: cluster %s: %s -> %s (%v)", cluster, from, to, err)
		},
		Scope: func(cluster string, sc source.Scope) {
			if sc.ClusterWide {
				klog.Warningf("mcs-controller: cluster %s: reading Pods of every namespace: %s; a credential that may read every Pod is broader than needed", cluster, sc.Why)
				return
			}
			klog.Infof("mcs-controller: cluster %s: reading Pods of its %d exporting namespaces", cluster, len(sc.Namespaces))
		},
	}
	if o.keys != nil {
		klog.Infof("mcs-controller: -verify %s: export annotations count only when signed with their cluster's key (%d keys)", o.verify, len(o.keys))
	} else if o.signKey != "" {
		klog.Warningf("mcs-controller: this cluster signs its exports but -verify is not given: the controller uses unsigned export annotations that a verifying CoreDNS refuses")
	}
	var srcs []*source.Source
	beats := map[string]kubernetes.Interface{o.cluster: client} // a relay hub passes each cluster's heartbeat on (the local one read with the annotator's client)
	// A relay hub's records keep the origin Pods' own bytes (store.Proof),
	// which its EndpointSlices carry (those read through -hub too, readHubs).
	// The local client checks the API server's /readyz for contact.
	srcs = append(srcs, source.New(o.cluster, client, records, events, source.Options{Key: o.keys[o.cluster], KeepProof: o.relay, Shared: localPods}))
	for _, p := range o.peers {
		rc, err := ingest.RESTConfig(p.kubeconfig, "")
		if err != nil {
			return nil, fmt.Errorf("peer %s: %w", p.name, err)
		}
		c, err := reader.Pods(rc)
		if err != nil {
			return nil, fmt.Errorf("peer %s: %w", p.name, err)
		}
		beats[p.name] = c
		srcs = append(srcs, source.New(p.name, c, records, events, source.Options{Key: o.keys[p.name], Scoped: true, KeepProof: o.relay, Ingest: sm.ingestOptions(p.name)}))
	}
	// The snapshot file the hubs' replay memory is journaled to, once open.
	var replayFile atomic.Pointer[snapshot.Store]
	hubs, err := readHubs(o, reader, records, sm, replayFile.Load)
	if err != nil {
		return nil, err
	}
	metrics := mcscontroller.NewMetrics(reg)
	var feeds []mcscontroller.Source
	for _, s := range srcs {
		feeds = append(feeds, feed{s})
	}
	// The snapshot, before any source runs: the clusters' records from
	// before the restart, then every change.
	var restored map[string]bool
	switch {
	case o.snapshotDir != "" && o.relay:
		// A hub's slices carry the origins' own bytes (store.Proof), which
		// the snapshot's records do not keep: restored records would be
		// relayed without them. Its slices are held as they are instead.
		// A hub of hubs under verify keeps its replay memory there.
		if hubs == nil || o.verify == "" {
			klog.Warningf("mcs-controller: --snapshot-dir is not used with --relay (the snapshot does not keep the origins' bytes a hub relays; with --hub and --verify it keeps the replay memory): a cluster cut across a restart keeps its EndpointSlices as they are")
			break
		}
		klog.Infof("mcs-controller: --snapshot-dir with --relay keeps only the replay memory of the hubs read (a cluster cut across a restart keeps its EndpointSlices as they are)")
		if st := mcscontroller.OpenSnapshot(filepath.Join(o.snapshotDir, snapshotFile), metrics); st != nil {
			snapshotClosed = mcscontroller.ReplayOnlySnapshot(ctx, st)
			mcscontroller.SeedReplay(st, hubs, metrics)
			replayFile.Store(st)
		}
	case o.snapshotDir != "":
		if st := mcscontroller.OpenSnapshot(filepath.Join(o.snapshotDir, snapshotFile), metrics); st != nil {
			restored = mcscontroller.RestoreSnapshot(st, records, feeds, metrics)
			if hubs != nil {
				mcscontroller.SeedReplay(st, hubs, metrics)
				replayFile.Store(st)
			}
			snapshotClosed = mcscontroller.JournalSnapshot(ctx, st, records, feeds, metrics)
		}
	}
	for _, s := range srcs {
		if err := s.Start(); err != nil {
			return nil, err
		}
	}
	if hubs != nil {
		if err := hubs.Start(); err != nil {
			return nil, err
		}
	}
	go func() {
		<-ctx.Done()
		for _, s := range srcs {
			_ = s.Stop()
		}
		if hubs != nil {
			_ = hubs.Stop()
		}
	}()
	// Events on the ServiceExports and ServiceImports (conflicts, refusals),
	// for kubectl describe.
	bc := record.NewBroadcaster(record.WithContext(ctx))
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	rec := bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: mcscontroller.FieldManager})
	ctl := mcscontroller.New(records, feeds, client, dyn, disco, mcscontroller.Config{LocalCluster: o.cluster, Expire: o.peerExpire, Recorder: rec,
		Relay: o.relay, RelayNamespace: o.leaseNamespace, LeaseGrace: o.relayLeaseGrace, Heartbeats: beats, Hubs: hubs, Restored: restored}, metrics)
	go ctl.Run(ctx)
	klog.Infof("mcs-controller: cluster %s, %d peers, %d relay hubs, expiry %v", o.cluster, len(o.peers), len(o.hubs), o.peerExpire)
	if o.relay {
		klog.Infof("mcs-controller: relay hub: EndpointSlices carry the origins' bytes (%s), one Lease per cluster in %s", relay.SliceAnnotation, o.leaseNamespace)
	}
	return ctl.RunLoop, nil
}

// readHubs returns the reader of the -hub clusters (nil without any): each
// read with the client every cluster is read with, writing every origin's
// records into records, ignoring the local cluster's and the peers' (read
// directly), and under -verify accepting only what an origin's key signed.
func readHubs(o options, reader ingest.Reader, records *store.Store, sm sourceMetrics, replayFile func() *snapshot.Store) (*relay.Relay, error) {
	if len(o.hubs) == 0 {
		return nil, nil
	}
	direct := map[string]bool{}
	for _, p := range o.peers {
		direct[p.name] = true
	}
	r := relay.New(records, relay.Config{
		Local:  o.cluster,
		Direct: func(cluster string) bool { return direct[cluster] },
		Keys:   o.keys,
		// Under verify, a hub's word that an origin is connected counts
		// only with the origin's recent heartbeat.
		HeartbeatTimeout:   o.hubTimeout,
		RequirePodLists:    o.hubLists,
		RequirePodUIDLists: o.hubUIDLists,
		// A hub reading hubs relays their origins too: their records keep
		// the origin's bytes and the hubs they crossed.
		KeepProof: o.relay,
		Events: relay.Events{
			Refused: func(hub, origin, ns, pod string, rej annotation.Rejection) {
				sm.relayRefused.WithLabelValues(hub, string(rej.Reason)).Inc()
				if ns == "" { // the hub's word on the origin (a heartbeat)
					klog.Warningf("mcs-controller: hub %s: origin %s: refused: %s", hub, origin, rej)
					return
				}
				if rej.Reason == relay.ReasonLoop {
					// Hubs reading each other see their own records come
					// back at every change: expected, counted, not warned.
					klog.V(2).Infof("mcs-controller: hub %s: origin %s: %s/%s refused: %s", hub, origin, ns, pod, rej)
					return
				}
				klog.Warningf("mcs-controller: hub %s: origin %s: %s/%s refused: %s", hub, origin, ns, pod, rej)
			},
			HubState: func(hub string, from, to source.State, err error) {
				klog.Infof("mcs-controller: hub %s: %s -> %s (%v)", hub, from, to, err)
			},
			OriginState: func(origin string, from, to source.State) {
				klog.Infof("mcs-controller: origin %s (through hubs): %s -> %s", origin, from, to)
			},
			// Under verify, with --snapshot-dir: the replay memory's
			// changes, into the file.
			Remembered: relay.JournalSnapshot(replayFile),
		},
		Ingest: sm.ingestOptions("hubs"),
	})
	for _, h := range o.hubs {
		rc, err := ingest.RESTConfig(h.kubeconfig, "")
		if err != nil {
			return nil, fmt.Errorf("hub %s: %w", h.name, err)
		}
		c, err := reader.Pods(rc)
		if err != nil {
			return nil, fmt.Errorf("hub %s: %w", h.name, err)
		}
		if err := r.AddHub(h.name, c, ""); err != nil {
			return nil, fmt.Errorf("hub %s: %w", h.name, err)
		}
	}
	if o.relay {
		klog.Infof("mcs-controller: -relay with -hub: the origins read through hubs are relayed further with their bytes and the hubs they crossed (at most %d)", relay.MaxPath)
	}
	return r, nil
}

// snapshotFile is the MCS controller's snapshot in --snapshot-dir.
const snapshotFile = "mcs-controller.db"

// snapshotClosed is closed once the snapshot, journaled until the process
// stops, has written its last changes and closed (nil: no snapshot).
var snapshotClosed <-chan struct{}

// waitSnapshot waits, at exit, for the snapshot to close (at most
// snapshotCloseWait: a full disk must not hold the exit up).
func waitSnapshot() {
	if snapshotClosed == nil {
		return
	}
	select {
	case <-snapshotClosed:
	case <-time.After(snapshotCloseWait):
		klog.Warningf("mcs-controller: the snapshot did not close within %v: its last changes may be lost", snapshotCloseWait)
	}
}

const snapshotCloseWait = 5 * time.Second

// feed is a cluster's source as the controller reads it.
type feed struct{ *source.Source }

func (f feed) Connected() bool { return f.State() == source.Connected }

// sourceMetrics count what the controller's sources refused.
type sourceMetrics struct {
	rejected  *prometheus.CounterVec
	oversized prometheus.Counter
	malformed *prometheus.CounterVec
	// relayRefused counts the records read through hubs that were refused.
	relayRefused *prometheus.CounterVec
}

// ingestOptions are the options of cluster's reflectors: they log and count
// a list that broke off, did not decode or was over a bound (bytes or
// ingest.MaxObjects), and a store that dropped Pods for holding
// ingest.MaxObjects.
func (m sourceMetrics) ingestOptions(cluster string) ingest.Options {
	return ingest.Options{Name: "cluster/" + cluster, Events: ingest.Events{
		Malformed: func(err error) {
			m.malformed.WithLabelValues(cluster).Inc()
			klog.Warningf("mcs-controller: cluster %s: a malformed list of Pods (a broken or hostile API server?), kept what was held, listing again: %v", cluster, err)
		},
		Full: func(err error) {
			m.malformed.WithLabelValues(cluster).Inc()
			klog.Warningf("mcs-controller: cluster %s: more Pods than a reader holds (a broken or hostile API server?), keeping what is held and dropping new ones: %v", cluster, err)
		},
	}}
}

func newSourceMetrics(reg prometheus.Registerer) sourceMetrics {
	m := sourceMetrics{
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mcs_controller_rejected_annotations_total",
			Help: "Export annotation entries the MCS controller skipped (unsigned, bad signature, invalid, ...), by cluster and reason."}, []string{"cluster", "reason"}),
		oversized: prometheus.NewCounter(prometheus.CounterOpts{Name: "mcs_controller_oversized_replies_total",
			Help: "Replies of an API server the MCS controller refused for exceeding their bound (a reply, event, Pod or list metadata over its size; a list of more Pods than a reader holds)."}),
		malformed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mcs_controller_malformed_lists_total",
			Help: "Lists the MCS controller's sources refused for breaking off or not decoding, and spells of a source's store dropping Pods for holding the most a reader holds, by cluster."}, []string{"cluster"}),
		relayRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mcs_controller_relay_refused_total",
			Help: "Records read through relay hubs that the MCS controller refused (unsigned, bad signature, replayed, malformed, unknown origin, ...), by hub and reason."}, []string{"hub", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.rejected, m.oversized, m.malformed, m.relayRefused)
	}
	return m
}
