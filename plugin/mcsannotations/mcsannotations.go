// Package mcsannotations is a CoreDNS plugin that answers Kubernetes
// Multi-Cluster Services DNS names (<svc>.<ns>.svc.clusterset.local) from Pod
// annotations watched in the local cluster.
package mcsannotations

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/pkg/fall"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/clients"
	"github.com/mcsannotations/mcsannotations/internal/ingest"
	"github.com/mcsannotations/mcsannotations/internal/probe"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/serviceimport"
	"github.com/mcsannotations/mcsannotations/internal/snapshot"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/store"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

// MCS is the plugin handler.
type MCS struct {
	Next plugin.Handler

	zones   []string // [0] is the clusterset zone
	fall    fall.F
	records *store.Store // what the sources write and the snapshot journals
	table   *table.Table // the DNS answers of records
	sources []*source.Source
	relay   *relay.Relay // the hubs' relayed origins; nil without hub words
	origins originSet    // the relayed origins, as the stale rules read them

	expire time.Duration // 0: a source's records are kept however long it is gone
	stale  staleness     // which sources' records answers mark as stale
	prober *probe.Prober // nil: no probe word

	// Who is asking: local Pods by IP, for alias names and imports enforce.
	clients *clients.Index
	watcher *clients.Watcher

	// imports watches the local cluster's ServiceImports for ClusterSetIP
	// services; nil when no client for them could be made.
	imports *serviceimport.Watcher
	enforce bool
	allow   []netip.Prefix

	checkID func(context.Context) // compares a remembered cluster ID with the API; nil if configured

	snapshotPath   string
	snapshotCheck  time.Duration // how often a damaged store is looked for
	contactSave    time.Duration // contactSaveEvery as newMCS found it
	snapMu         sync.Mutex    // serialises opening and closing the store
	snapClosed     bool          // closeSnapshot ran (reload, shutdown): a retry must not open the file
	snapRetry      func()        // cancels the attempts to open a file that would not open; nil when none run
	snapRetryDone  chan struct{}
	store          atomic.Pointer[snapshot.Store]
	snapshotLoaded atomic.Bool // the snapshot held a complete list of some source

	// pendingLogged: the ClusterSetIP services logged as answered while
	// their ClusterSetIP is not known (logPending).
	pendingMu     sync.Mutex
	pendingLogged map[string]struct{}

	mu     sync.Mutex
	cancel context.CancelFunc
}

// snapshotCheckEvery is how often a damaged snapshot store is looked for.
var snapshotCheckEvery = 5 * time.Second

// stopWait bounds the wait for each reflector on shutdown, reload and
// expiry; tests shorten it.
var stopWait = ingest.StopWait

// reader is how the plugin reads every cluster (ingest.Reader, shared with
// the MCS controller): a reply cut at its bound (a broken or hostile API
// server; a peer's is anyone's) is logged and counted.
var reader = ingest.Reader{
	UserAgent: "coredns-" + pluginName,
	TooLarge: func(err error) {
		oversizedReplies.Inc()
		log.Warningf("refused a reply over its size bound (a broken or hostile API server?), keeping what is held: %v", err)
	},
}

// clientFor builds the API client of a source; tests replace it.
var clientFor = func(kubeconfig, kubecontext string) (kubernetes.Interface, error) {
	rc, err := ingest.RESTConfig(kubeconfig, kubecontext)
	if err != nil {
		return nil, err
	}
	return reader.Pods(rc)
}

// dynamicFor builds the local cluster's client for ServiceImports (a custom
// resource, in JSON), whose lists are read one item at a time (see
// ingest.Dynamic); tests replace it.
var dynamicFor = func(kubeconfig, kubecontext string) (dynamic.Interface, error) {
	rc, err := ingest.RESTConfig(kubeconfig, kubecontext)
	if err != nil {
		return nil, err
	}
	d, err := reader.Dynamic(rc)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// newMCS builds the handler and its sources (the local cluster first, then
// each peer); nothing starts until start.
func newMCS(cfg config) (*MCS, error) {
	clientOf := func(name, kubeconfig, kubecontext string) (kubernetes.Interface, error) {
		client, err := clientFor(kubeconfig, kubecontext)
		if err != nil {
			return nil, clientError("cluster "+name, kubeconfig, err)
		}
		return client, nil
	}
	local, err := clientOf(cmp.Or(cfg.cluster, "(local)"), cfg.kubeconfig, cfg.kubecontext)
	if err != nil {
		return nil, err
	}
	cluster, remembered, err := resolveClusterID(cfg, local)
	if err != nil {
		return nil, err
	}
	for _, p := range cfg.peers {
		if p.name == cluster {
			return nil, fmt.Errorf("peer %q has the name of the local cluster", p.name)
		}
	}
	for _, h := range cfg.hubs {
		if h.name == cluster {
			return nil, fmt.Errorf("hub %q has the name of the local cluster", h.name)
		}
	}
	// parse checked the keys of the clusters the Corefile names; an ID
	// found here is checked now, before anything starts.
	if err := cfg.hasKey(cluster, "the local cluster"); err != nil {
		how := "read from the ClusterProperty"
		if remembered {
			how = "remembered in " + cfg.snapshot + clusterIDSuffix
		}
		return nil, fmt.Errorf("%w (the cluster ID is not in the Corefile; it was %s)", err, how)
	}

	if cfg.keys != nil {
		log.Infof("verify %s: export annotations count only when signed with their cluster's key (%d keys)", cfg.verify, len(cfg.keys))
	}

	records := store.New()
	t := table.New(table.Config{Zone: cfg.zones[0], TTL: cfg.ttl, LocalCluster: cluster, Locality: cfg.locality, NamespaceRecords: cfg.nsRecords}, records)
	t.OnCapped(logCapped)
	t.OnChange(func(ix *table.Index) {
		indexBuilds.Inc()
		services.Set(float64(ix.Len()))
		serviceImports.Set(float64(ix.ClusterSetIPLen()))
	})
	m := &MCS{zones: cfg.zones, fall: cfg.fall, records: records, table: t, snapshotPath: cfg.snapshot, expire: cfg.expire,
		clients: clients.NewIndex(), enforce: cfg.enforce, allow: cfg.allow, snapshotCheck: snapshotCheckEvery, contactSave: contactSaveEvery}
	if remembered {
		m.checkID = func(ctx context.Context) { checkClusterID(ctx, local, cluster, cfg.snapshot+clusterIDSuffix) }
	}
	records.Subscribe(m.journal)
	t.OnUnencodable(logUnencodable)
	m.clients.OnChange(m.journalClient)
	m.sources = append(m.sources, source.New(cluster, local, records, m.sourceEvents(cluster),
		source.Options{Key: cfg.keys[cluster], Ingest: ingestOptions(clusterInformer(cluster))}))
	// Importers are local Pods; enforcing needs every local Pod.
	m.watcher = clients.NewWatcher(local, m.clients, clients.Options{
		All: cfg.enforce,
		Rejected: func(ns, name string, rej []annotation.Rejection) {
			logRejected(cluster, ns, name, rej)
		},
		Dropped: func(n int) {
			log.Infof("local Pods: the first list dropped %d DNS clients remembered from the snapshot (gone meanwhile)", n)
		},
		Ingest: ingestOptions(clientsInformer),
	})
	if dyn, err := dynamicFor(cfg.kubeconfig, cfg.kubecontext); err != nil {
		log.Warningf("ServiceImports: no client for them (%v): ClusterSetIP services are answered as headless ones", err)
	} else {
		m.imports = serviceimport.New(local.Discovery(), dyn, m.importEvents(),
			serviceimport.Options{Recheck: importRecheck, Ingest: ingestOptions("serviceimports")})
	}
	for _, p := range cfg.peers {
		client, err := clientOf(p.name, p.kubeconfig, p.kubecontext)
		if err != nil {
			return nil, err
		}
		// A peer is read in its exporting namespaces only (its credential
		// need not read more); the local cluster everywhere.
		m.sources = append(m.sources, source.New(p.name, client, records, m.sourceEvents(p.name),
			source.Options{Key: cfg.keys[p.name], Ingest: ingestOptions(clusterInformer(p.name)), Scoped: true}))
	}
	if err := m.newRelay(cfg, cluster); err != nil {
		return nil, err
	}
	m.newProber(cfg.probe)
	return m, nil
}

// clientError says which client of what could not be made.
func clientError(what, kubeconfig string, err error) error {
	where := "in-cluster config"
	if kubeconfig != "" {
		where = "kubeconfig " + kubeconfig
	}
	return fmt.Errorf("%s: %s: %w", what, where, err)
}

// sourceFor returns the source of cluster, or nil.
func (m *MCS) sourceFor(cluster string) *source.Source {
	for _, s := range m.sources {
		if s.Cluster() == cluster {
			return s
		}
	}
	return nil
}

// sourceEvents turns the callbacks of cluster's source into log lines,
// metrics and snapshot metadata.
func (m *MCS) sourceEvents(cluster string) source.Events {
	save := func(cluster string) {
		if s := m.sourceFor(cluster); s != nil {
			m.saveMeta(s)
		}
	}
	return source.Events{
		Synced: func(cluster string) {
			save(cluster)
			if s := m.sourceFor(cluster); s != nil {
				log.Infof("cluster %s: complete list applied: %d records, %s after its reflector started",
					cluster, m.records.Len()[cluster], time.Since(s.Started()).Round(time.Millisecond))
			}
		},
		Rejected: logRejected,
		StateChanged: func(cluster string, from, to source.State, err error) {
			save(cluster)
			if err != nil {
				log.Warningf("cluster %s: %s -> %s: %v", cluster, from, to, err)
				return
			}
			log.Infof("cluster %s: %s -> %s", cluster, from, to)
		},
		Scope: logScope,
	}
}

// logScope logs and counts what a peer's source reads.
func logScope(cluster string, sc source.Scope) {
	if len(sc.Ignored) > 0 {
		log.Warningf("cluster %s: its list of exporting namespaces has lines that are no namespace name, ignored: %q", cluster, sc.Ignored)
	}
	if sc.ClusterWide {
		sourceWatches.WithLabelValues(cluster).Set(1)
		log.Warningf("cluster %s: reading Pods of every namespace: %s; a credential that may read every Pod is broader than needed", cluster, sc.Why)
		return
	}
	sourceWatches.WithLabelValues(cluster).Set(float64(len(sc.Namespaces)))
	log.Infof("cluster %s: reading Pods of its %d exporting namespaces: %q", cluster, len(sc.Namespaces), sc.Namespaces)
}

// ingestOptions are the options of a reflector, by its name (as the
// metrics name them): it logs and counts a list that broke off or did not
// decode, an expired watch, and each list of every object after the first.
func ingestOptions(name string) ingest.Options {
	what := "Pod"
	if name == "serviceimports" {
		what = "ServiceImport"
	}
	return ingest.Options{Name: name, StopWait: stopWait, Events: ingest.Events{
		Malformed: func(err error) {
			malformedLists.WithLabelValues(name).Inc()
			log.Warningf("%s: a malformed list of %ss, kept what was held, listing again: %v", name, what, err)
		},
		Full: func(err error) {
			malformedLists.WithLabelValues(name).Inc()
			log.Warningf("%s: more %ss than a reader holds (a broken or hostile API server?), keeping what is held and dropping new ones: %v", name, what, err)
		},
		Expired: func() {
			watchExpirations.WithLabelValues(name).Inc()
			log.Infof("%s: the watch of %ss expired (the API server restarted, or the watch fell behind): listing every %s again, answering from what is held meanwhile", name, what, what)
		},
		Relisted: func(n int, took time.Duration) {
			relistSeconds.WithLabelValues(name).Observe(took.Seconds())
			log.Infof("%s: listed %d %ss again in %s", name, n, what, took.Round(time.Millisecond))
		},
	}}
}

// logRejected logs skipped annotation entries, and the port names dropped
// from kept entries, once per change, and counts them.
func logRejected(cluster, ns, name string, rej []annotation.Rejection) {
	var skipped, dropped []annotation.Rejection
	for _, r := range rej {
		rejectedAnnotations.WithLabelValues(cluster, string(r.Reason)).Inc()
		if r.Kept() {
			dropped = append(dropped, r)
		} else {
			skipped = append(skipped, r)
		}
	}
	if len(dropped) > 0 {
		log.Warningf("cluster %s: Pod %s/%s: %d port names dropped (the ports answer unnamed, without SRV names): first: %s", cluster, ns, name, len(dropped), dropped[0])
	}
	switch {
	case len(skipped) == 1 && skipped[0].Index < 0:
		log.Warningf("cluster %s: Pod %s/%s: annotation ignored as a whole: %s", cluster, ns, name, skipped[0])
	case len(skipped) > 0:
		log.Warningf("cluster %s: Pod %s/%s: %d annotation entries skipped: first: %s", cluster, ns, name, len(skipped), skipped[0])
	}
}

// logCapped logs and sets the records the per-namespace cap leaves out, once
// per change. A namespace within the cap again has no series: the gauge holds
// only the capped namespaces, so namespaces that come and go do not grow it.
func logCapped(ns string, records, capped int) {
	if capped == 0 {
		cappedRecords.DeleteLabelValues(ns)
		log.Infof("namespace %s: its answers hold %d records, within records_per_namespace again", ns, records)
		return
	}
	cappedRecords.WithLabelValues(ns).Set(float64(capped))
	log.Warningf("namespace %s: its services' answers would hold %d records, more than records_per_namespace: %d left out (each service keeps an equal share)", ns, records, capped)
}

// logUnencodable logs and counts an endpoint whose name cannot be encoded
// (once per change of its record).
func logUnencodable(p *store.Pod, e annotation.Export) {
	unencodableNames.WithLabelValues(p.Cluster).Inc()
	log.Warningf("cluster %s: Pod %s/%s: its endpoint name under service %s/%s (hostname %q, cluster %q) has a label longer than 63 octets or is longer than 255: "+
		"left out of SRV answers and without an endpoint name; its addresses still answer the service name", p.Cluster, p.Namespace, p.Name, e.Namespace, e.Name, annotation.Clip(p.EndpointHostname()), annotation.Clip(p.Cluster))
}

// start runs on CoreDNS start-up (and after a reload): it loads the snapshot
// into the record store, then starts the index builder and the sources in the
// background and returns.
func (m *MCS) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancel != nil {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.registerSeries()
	m.openSnapshot(true)
	go m.table.Run(ctx)
	go m.staleLoop(ctx)
	if m.prober != nil {
		probers.add(m.prober)
		go m.prober.Run(ctx)
	}
	if m.expire > 0 {
		go m.expireLoop(ctx)
	}
	if m.snapshotPath != "" {
		go m.watchSnapshot(ctx)
	}
	if m.checkID != nil {
		go m.checkID(ctx)
	}
	for _, s := range m.sources {
		if err := s.Start(); err != nil {
			return fmt.Errorf("cluster %s: %w", s.Cluster(), err)
		}
	}
	if m.relay != nil {
		m.origins.mu.Lock()
		m.origins.started = time.Now()
		m.origins.mu.Unlock()
		if err := m.relay.Start(); err != nil {
			return fmt.Errorf("hubs: %w", err)
		}
	}
	if err := m.watcher.Start(); err != nil {
		return fmt.Errorf("local Pods: %w", err)
	}
	if m.imports != nil {
		m.imports.Start()
	}
	collector.add(m)
	return nil
}

// stop runs on shutdown and before a reload's new instance takes over.
func (m *MCS) stop() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	collector.remove(m)
	if m.prober != nil {
		probers.remove(m.prober)
	}
	// In parallel: each waits at most stopWait for its reflector.
	var wg sync.WaitGroup
	wg.Go(func() { stopped(clientsInformer, m.watcher.Stop()) })
	if m.imports != nil {
		wg.Go(func() { stopped(importsInformer, m.imports.Stop()) })
	}
	for _, s := range m.sources {
		wg.Go(func() { stopped(clusterInformer(s.Cluster()), s.Stop()) })
	}
	if m.relay != nil {
		wg.Go(func() { stopped(hubsInformer, m.relay.Stop()) })
	}
	wg.Wait()
	if m.cancel != nil {
		m.cancel()
		m.cancel = nil
	}
	return m.closeSnapshot()
}

// expireLoop drops the records of a source that has been out of contact for
// longer than the expire setting. A source is given the setting's length (at
// most 10 s) after each start to make contact before it can expire, so that a
// restart with an old snapshot does not drop records a live API server is
// about to confirm.
func (m *MCS) expireLoop(ctx context.Context) {
	every := min(max(m.expire/4, 100*time.Millisecond), 5*time.Second)
	grace := min(m.expire, 10*time.Second)
	wait.UntilWithContext(ctx, func(context.Context) {
		for _, s := range m.sources {
			last := s.LastContact()
			if s.Expired() || s.State() == source.Connected || last.IsZero() ||
				time.Since(last) < m.expire || time.Since(s.Started()) < grace {
				continue
			}
			sourceExpirations.WithLabelValues(s.Cluster()).Inc()
			log.Warningf("cluster %s: no contact since %s (longer than expire %s): dropping its records until it answers again",
				s.Cluster(), stamp(last), m.expire)
			// A slow stop of the old reflector is a warning (the new one
			// runs).
			if err := s.Expire(); errors.Is(err, ingest.ErrSlow) {
				stopped(clusterInformer(s.Cluster()), err)
			} else if err != nil {
				log.Errorf("cluster %s: restart after expiry: %v", s.Cluster(), err)
			}
		}
		m.expireOrigins(grace)
	}, every)
}

// expireOrigins drops, as expireLoop does for a source, the records of each
// relayed origin out of contact for longer than the expire setting; they
// come back once a hub is in contact with it again.
func (m *MCS) expireOrigins(grace time.Duration) {
	if m.relay == nil {
		return
	}
	m.origins.mu.Lock()
	started := m.origins.started
	m.origins.mu.Unlock()
	if started.IsZero() || time.Since(started) < grace {
		return
	}
	for _, o := range m.relay.Origins() {
		if o.Expired || o.State == source.Connected || o.LastContact.IsZero() || time.Since(o.LastContact) < m.expire {
			continue
		}
		if !m.relay.Expire(o.Cluster) {
			continue
		}
		sourceExpirations.WithLabelValues(o.Cluster).Inc()
		log.Warningf("origin %s (through hubs): no contact since %s (longer than expire %s): dropping its records until a hub is in contact with it again",
			o.Cluster, stamp(o.LastContact), m.expire)
	}
}

// Name implements plugin.Handler.
func (m *MCS) Name() string { return pluginName }

// stopped logs a reflector stop that was not waited for to the end and
// counts it (err wraps ingest.ErrSlow, the only error a stop returns).
func stopped(informer string, err error) {
	if err == nil {
		return
	}
	if errors.Is(err, ingest.ErrSlow) {
		slowStops.WithLabelValues(informer).Inc()
	}
	log.Warningf("%s: %v", informer, err)
}
