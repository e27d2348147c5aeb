package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/mcscontroller"
	"github.com/mcsannotations/mcsannotations/internal/source"
	"github.com/mcsannotations/mcsannotations/internal/table"
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

func (p *peerFlags) Set(v string) error {
	name, path, ok := strings.Cut(v, "=")
	if !ok || name == "" || path == "" {
		return fmt.Errorf("%q: want NAME=KUBECONFIG", v)
	}
	if !annotation.ValidClusterID(name) {
		return fmt.Errorf("peer %q: must be an RFC 1123 subdomain of at most %d characters", name, annotation.MaxClusterIDLen)
	}
	for _, x := range *p {
		if x.name == name {
			return fmt.Errorf("peer %q named twice", name)
		}
	}
	*p = append(*p, peer{name, path})
	return nil
}

// checkMCS checks the MCS controller's flags.
func checkMCS(o options) error {
	if !o.mcsController {
		if len(o.peers) > 0 {
			return errors.New("-peer needs -mcs-controller")
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
	if o.peerExpire < 0 {
		return fmt.Errorf("-peer-expire %v: must not be negative", o.peerExpire)
	}
	return nil
}

// startMCS starts the MCS controller's sources (the local cluster and every
// peer, through the plugin's own label-filtered Pod watch into a table) and
// its informers on every replica, so that a new leader writes at once. It
// returns the write loop, for the leader to run.
func startMCS(ctx context.Context, o options, client kubernetes.Interface, dyn dynamic.Interface,
	disco discovery.DiscoveryInterface, reg prometheus.Registerer) (func(context.Context), error) {
	t := table.New(table.Config{LocalCluster: o.cluster})
	events := source.Events{
		Rejected: func(cluster, ns, name string, rej []annotation.Rejection) {
			for _, r := range rej {
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
	var srcs []*source.Source
	srcs = append(srcs, source.New(o.cluster, client, t, events, source.Options{}))
	for _, p := range o.peers {
		pc, err := clientcmd.BuildConfigFromFlags("", p.kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("peer %s: %w", p.name, err)
		}
		pc.UserAgent = "mcs-controller"
		// A list and a watch per exporting namespace of the peer (see the
		// plugin's clientFor).
		pc.QPS, pc.Burst = 50, 200
		c, err := kubernetes.NewForConfig(pc)
		if err != nil {
			return nil, fmt.Errorf("peer %s: %w", p.name, err)
		}
		srcs = append(srcs, source.New(p.name, c, t, events, source.Options{Scoped: true}))
	}
	var feeds []mcscontroller.Source
	for _, s := range srcs {
		if err := s.Start(); err != nil {
			return nil, err
		}
		feeds = append(feeds, s)
	}
	go func() {
		<-ctx.Done()
		for _, s := range srcs {
			_ = s.Stop()
		}
	}()
	ctl := mcscontroller.New(t, feeds, client, dyn, disco, mcscontroller.Config{Expire: o.peerExpire}, mcscontroller.NewMetrics(reg))
	go ctl.Run(ctx)
	klog.Infof("mcs-controller: cluster %s, %d peers, expiry %v", o.cluster, len(o.peers), o.peerExpire)
	return ctl.RunLoop, nil
}
