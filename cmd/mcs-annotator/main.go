// Command mcs-annotator writes the export annotation of multi-cluster
// services onto the Pods that back them (docs/DESIGN.md#the-annotator): it
// exports each Service annotated multicluster.kubernetes.io/export: "true" or
// named by an MCS ServiceExport. Run it as a Deployment with two replicas:
// they elect a leader through a Lease, and only the leader writes. See annotator/ and
// manifests/annotator/.
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/annotator"
	"github.com/mcsannotations/mcsannotations/internal/relay"
)

type options struct {
	kubeconfig      string
	cluster         string
	leaderElect     bool
	leaseNamespace  string
	leaseName       string
	id              string
	leaseDuration   time.Duration
	renewDeadline   time.Duration
	retryPeriod     time.Duration
	listen          string
	workers         int
	sePoll          time.Duration
	signKey         string
	signEndpoints   bool
	heartbeat       time.Duration
	hubTimeout      time.Duration
	hubLists        bool
	hubUIDLists     bool
	mcsController   bool
	peers           peerFlags
	hubs            hubFlags
	peerExpire      time.Duration
	verify          string
	keys            map[string]ed25519.PublicKey // read from verify
	peerReader      string
	relay           bool
	relayLeaseGrace time.Duration
	kubeAPIQPS      float64
	kubeAPIBurst    int
	version         bool

	// snapshotDir: the MCS controller's snapshot folder (--snapshot-dir).
	snapshotDir string
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("mcs-annotator", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (default: the in-cluster config)")
	fs.StringVar(&o.cluster, "cluster", "", "cluster ID written into each entry (default: none; readers use the ID they know the cluster by)")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader through a Lease; only the leader writes")
	fs.StringVar(&o.leaseNamespace, "lease-namespace", "", "namespace of the Lease (default: $POD_NAMESPACE, else kube-system)")
	fs.StringVar(&o.leaseName, "lease-name", "mcs-annotator", "name of the Lease")
	fs.StringVar(&o.id, "id", "", "identity in the election (default: host name and a random suffix)")
	fs.DurationVar(&o.leaseDuration, "lease-duration", 15*time.Second, "how long followers wait before taking a lease that was not renewed")
	fs.DurationVar(&o.renewDeadline, "renew-deadline", 10*time.Second, "how long the leader tries to renew before it gives up leading")
	fs.DurationVar(&o.retryPeriod, "retry-period", 2*time.Second, "how often the lease is tried")
	fs.StringVar(&o.listen, "listen", ":9090", "address of /metrics, /healthz and /readyz (empty: none)")
	fs.IntVar(&o.workers, "workers", 2, "namespaces reconciled in parallel")
	fs.DurationVar(&o.sePoll, "serviceexport-poll", 30*time.Second, "how often to look for the ServiceExport CRD while it is not installed")
	fs.StringVar(&o.signKey, "sign-key", "", "ed25519 private key (PEM, PKCS #8) to sign each export annotation with (needs --cluster)")
	fs.BoolVar(&o.signEndpoints, "sign-endpoints", false, "also state each exported Pod's addresses, hostname and readiness, with a growing sequence number, in a signed endpoint statement, so that relay hubs can pass its records on unaltered (needs --sign-key)")
	fs.DurationVar(&o.heartbeat, "heartbeat-interval", annotator.DefaultHeartbeatInterval, "with --sign-endpoints, how often the signed heartbeat Lease kube-system/mcs-heartbeat is written (relay hubs pass it on; every edge receives one Lease event per cluster per interval)")
	fs.BoolVar(&o.mcsController, "mcs-controller", false, "also run the MCS controller: ServiceImports, derived Services and EndpointSlices from every cluster's export annotations (needs --cluster)")
	fs.Var(&o.peers, "peer", "a peer cluster for the MCS controller, NAME=KUBECONFIG (repeatable; the same peers as CoreDNS's peer words)")
	fs.Var(&o.hubs, "hub", "a relay hub for the MCS controller, NAME=KUBECONFIG (repeatable; the same hubs as CoreDNS's hub words): the origins it relays are imported as peers are and, with --relay, relayed further (a hub of hubs)")
	fs.DurationVar(&o.hubTimeout, "hub-heartbeat-timeout", relay.DefaultHeartbeatTimeout, "with --hub and --verify, how old an origin's signed heartbeat may be for a hub's word that the origin is connected to count (a few of the origins' --heartbeat-interval)")
	fs.BoolVar(&o.hubLists, "hub-require-pod-lists", false, "with --hub and --verify, take a hub's word that an origin is connected only with the origin's signed Pod list as new as its heartbeat, from the start (as CoreDNS's hub_require_pod_lists): for fleets whose annotators and hubs all write Pod lists")
	fs.BoolVar(&o.hubUIDLists, "hub-require-pod-uid-lists", false, "as --hub-require-pod-lists, and the origin's signed Pod list by UID, from the start (as CoreDNS's hub_require_pod_lists uids): for fleets whose annotators and hubs all write lists by UID (this release and later)")
	fs.StringVar(&o.verify, "verify", "", "folder of the clusters' public keys (<cluster>.pub, as CoreDNS's verify word): the MCS controller then uses only export annotations signed with their cluster's key, as CoreDNS answers only those (give it wherever CoreDNS verifies)")
	fs.DurationVar(&o.peerExpire, "peer-expire", 0, "drop a peer's share of the imports when its API server has not answered for this long (0: never; the local cluster never expires)")
	fs.StringVar(&o.peerReader, "peer-reader", "kube-system/mcsannotations-peer-reader", "ServiceAccount NAMESPACE/NAME that peers read this cluster with: it gets a RoleBinding to read Pods in each namespace that exports, and the list of those namespaces is published (empty: neither)")
	fs.BoolVar(&o.relay, "relay", false, "make this cluster a relay hub: the MCS controller writes on each EndpointSlice the origin Pods' own signed bytes, and one Lease per cluster it reads in --lease-namespace (needs --mcs-controller)")
	fs.DurationVar(&o.relayLeaseGrace, "relay-lease-grace", time.Minute, "with --relay, how long a cluster the hub no longer reads or relays (a peer taken out, an origin its hubs no longer hold) keeps its Lease before the hub deletes it, so that edges forget it")
	// The MCS controller's own memory of every cluster's share across a restart.
	fs.StringVar(&o.snapshotDir, "snapshot-dir", "", "folder of the MCS controller's snapshot ("+snapshotFile+"): the records of every cluster and their last contact (and, with --hub and --verify, the statements accepted through the hubs, so that a hub cannot replay an older one after a restart; with --relay, only those), kept on disk so that after a restart a cluster out of contact keeps exactly its share (needs --mcs-controller; without it, such a cluster's EndpointSlices are left as they are until it answers or --peer-expire passes)")
	fs.Float64Var(&o.kubeAPIQPS, "kube-api-qps", 200, "requests per second to the local API server (its priority and fairness protects it; the MCS controller's first sync makes about four requests per exported service, plus one per exporting cluster)")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 400, "burst of requests to the local API server above --kube-api-qps")
	fs.BoolVar(&o.version, "version", false, "print the version and commit, and exit")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.Var(klogVerbosity{klogFlags}, "v", "log verbosity (2 logs every Pod write)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.cluster != "" && !annotation.ValidClusterID(o.cluster) {
		return o, fmt.Errorf("--cluster %q: must be an RFC 1123 subdomain of at most %d characters", o.cluster, annotation.MaxClusterIDLen)
	}
	if o.signKey != "" && o.cluster == "" {
		return o, errors.New("--sign-key needs --cluster: the signature covers the cluster ID the plugin verifies against")
	}
	if o.signEndpoints && o.signKey == "" {
		return o, errors.New("--sign-endpoints needs --sign-key: an endpoint statement is worth only its signature")
	}
	if o.heartbeat <= 0 || o.hubTimeout <= 0 {
		return o, fmt.Errorf("--heartbeat-interval %v, --hub-heartbeat-timeout %v: both must be positive", o.heartbeat, o.hubTimeout)
	}
	if o.relayLeaseGrace <= 0 {
		return o, fmt.Errorf("--relay-lease-grace %v: must be positive", o.relayLeaseGrace)
	}
	if err := checkMCS(&o); err != nil {
		return o, err
	}
	if o.peerReader != "" {
		if err := annotator.ParsePeerReader(o.peerReader); err != nil {
			return o, fmt.Errorf("--peer-reader: %w", err)
		}
	}
	if !(o.kubeAPIQPS > 0) || math.IsInf(o.kubeAPIQPS, 1) || o.kubeAPIBurst < 1 { // NaN is not > 0
		return o, fmt.Errorf("--kube-api-qps %v, --kube-api-burst %d: both must be positive", o.kubeAPIQPS, o.kubeAPIBurst)
	}
	if o.workers < 1 {
		return o, fmt.Errorf("--workers %d: must be at least 1", o.workers)
	}
	if o.leaderElect && !(o.leaseDuration > o.renewDeadline && o.renewDeadline > o.retryPeriod && o.retryPeriod > 0) {
		return o, fmt.Errorf("need --lease-duration > --renew-deadline > --retry-period > 0, have %v, %v, %v", o.leaseDuration, o.renewDeadline, o.retryPeriod)
	}
	if o.leaseNamespace == "" {
		o.leaseNamespace = os.Getenv("POD_NAMESPACE")
	}
	if o.leaseNamespace == "" {
		o.leaseNamespace = "kube-system"
	}
	if o.id == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		o.id = host + "_" + hex.EncodeToString(b)
	}
	return o, nil
}

// klogVerbosity passes -v through to klog.
type klogVerbosity struct{ fs *flag.FlagSet }

func (k klogVerbosity) String() string     { return "0" }
func (k klogVerbosity) Set(v string) error { return k.fs.Set("v", v) }

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcs-annotator:", err)
		os.Exit(2)
	}
	if o.version {
		fmt.Print(versionString())
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = run(ctx, o)
	waitSnapshot()
	if err != nil {
		klog.Errorf("mcs-annotator: %v", err)
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func run(ctx context.Context, o options) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "mcs-annotator"
	cfg.QPS, cfg.Burst = float32(o.kubeAPIQPS), o.kubeAPIBurst
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}

	var key ed25519.PrivateKey
	if o.signKey != "" {
		if key, err = annotation.ReadPrivateKey(o.signKey); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := annotator.NewMetrics(reg)
	ctl := annotator.New(client, dyn, disco, annotator.Config{Cluster: o.cluster, SignKey: key, SignEndpoints: o.signEndpoints, Workers: o.workers, ServiceExportPoll: o.sePoll, ClustersetConflicts: o.mcsController, RecordFields: o.mcsController, PeerReader: o.peerReader, HeartbeatInterval: o.heartbeat}, m)

	if o.listen != "" {
		srv, err := serve(o.listen, reg, ctl)
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	klog.Infof("mcs-annotator %s: cluster ID %q, leader election %v (lease %s/%s), signing %v, endpoint statements %v", o.id, o.cluster, o.leaderElect, o.leaseNamespace, o.leaseName, key != nil, o.signEndpoints)
	if err := ctl.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the first sync
		}
		return err
	}
	mcsLoop := func(context.Context) {}
	if o.mcsController {
		if mcsLoop, err = startMCS(ctx, o, ctl.PodInformer(), client, dyn, disco, reg); err != nil {
			return err
		}
	}
	if !o.leaderElect {
		m.Leader.Set(1)
		go mcsLoop(ctx)
		ctl.Run(ctx)
		return nil
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: o.leaseNamespace, Name: o.leaseName},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.id},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   o.leaseDuration,
		RenewDeadline:   o.renewDeadline,
		RetryPeriod:     o.retryPeriod,
		ReleaseOnCancel: true, // a stopped leader hands over at once
		Name:            o.leaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				klog.Infof("became leader (%s): writing", o.id)
				m.Leader.Set(1)
				go mcsLoop(ctx)
				ctl.Run(ctx)
			},
			OnStoppedLeading: func() {
				m.Leader.Set(0)
				klog.Infof("stopped leading (%s)", o.id)
			},
			OnNewLeader: func(id string) {
				if id != o.id {
					klog.Infof("leader is %s: following", id)
				}
			},
		},
	})
	if err != nil {
		return err
	}
	le.Run(ctx) // returns when leadership is lost or ctx ends
	if ctx.Err() == nil {
		// Lost the lease while running (the API server was unreachable past
		// the renew deadline): exit so that a restart rejoins the election
		// with fresh state rather than writing beside a new leader.
		return errors.New("lost the lease")
	}
	return nil
}

// serve starts the HTTP endpoints: /metrics, /healthz (alive), /readyz (the
// informers synced).
func serve(addr string, reg *prometheus.Registry, ctl *annotator.Controller) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ctl.Ready() {
			http.Error(w, "informers not synced", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.Errorf("HTTP %s: %v", addr, err)
		}
	}()
	klog.Infof("serving /metrics, /healthz and /readyz on %s", ln.Addr())
	return srv, nil
}
