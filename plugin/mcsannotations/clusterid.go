package mcsannotations

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// The cluster ID, when the Corefile does not give it, comes from the MCS
// ClusterProperty of KEP-2149 (group about.k8s.io), or from the copy kept
// beside the snapshot so that an offline start knows it too.
const (
	clusterPropertyPath = "/apis/about.k8s.io/v1alpha1/clusterproperties/cluster.clusterset.k8s.io"
	clusterIDSuffix     = ".cluster-id" // beside the snapshot file
)

// discoverTimeout bounds the one API request made at start-up when the ID is
// neither configured nor remembered.
var discoverTimeout = 5 * time.Second

// resolveClusterID returns the local cluster's ID: the cluster word, else the
// ID remembered beside the snapshot (no network needed; it is checked against
// the API in the background by checkClusterID), else the ClusterProperty.
func resolveClusterID(cfg config, client kubernetes.Interface) (id string, remembered bool, err error) {
	if cfg.cluster != "" {
		return cfg.cluster, false, nil
	}
	if cfg.snapshot != "" {
		if id, err := readClusterID(cfg.snapshot + clusterIDSuffix); err == nil {
			return id, true, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			log.Warningf("cluster ID remembered in %s is unusable: %v", cfg.snapshot+clusterIDSuffix, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), discoverTimeout)
	defer cancel()
	id, err = discoverClusterID(ctx, client)
	if err != nil {
		return "", false, fmt.Errorf("the cluster ID is not configured (cluster NAME), not remembered beside a snapshot, and the ClusterProperty cluster.clusterset.k8s.io could not be read: %w", err)
	}
	if cfg.snapshot != "" {
		if err := writeClusterID(cfg.snapshot+clusterIDSuffix, id); err != nil {
			log.Warningf("cannot remember the cluster ID beside the snapshot: %v", err)
		}
	}
	return id, false, nil
}

// discoverClusterID reads the ClusterProperty cluster.clusterset.k8s.io.
func discoverClusterID(ctx context.Context, client kubernetes.Interface) (string, error) {
	rc := client.Discovery().RESTClient()
	if rc == nil {
		return "", errors.New("no REST client")
	}
	// A custom resource: JSON, whatever the client prefers.
	raw, err := rc.Get().AbsPath(clusterPropertyPath).SetHeader("Accept", "application/json").DoRaw(ctx)
	if err != nil {
		return "", err
	}
	var prop struct {
		Spec struct {
			Value string `json:"value"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &prop); err != nil {
		return "", fmt.Errorf("ClusterProperty: %w", err)
	}
	if !annotation.ValidClusterID(prop.Spec.Value) {
		return "", fmt.Errorf("ClusterProperty value %q: must be an RFC 1123 subdomain of at most %d characters", prop.Spec.Value, annotation.MaxClusterIDLen)
	}
	return prop.Spec.Value, nil
}

// checkClusterID compares a remembered ID with the ClusterProperty once the
// API answers, and says so loudly when they differ: the running instance
// keeps its ID (records are keyed by it); a restart picks up the new one.
func checkClusterID(ctx context.Context, client kubernetes.Interface, remembered, file string) {
	for delay := time.Second; ; delay = min(2*delay, time.Minute) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		rctx, cancel := context.WithTimeout(ctx, discoverTimeout)
		id, err := discoverClusterID(rctx, client)
		cancel()
		if err != nil {
			continue
		}
		if id != remembered {
			log.Errorf("the ClusterProperty says this cluster is %q, but %q was remembered and is in use: remembering %q for the next start", id, remembered, id)
			if err := writeClusterID(file, id); err != nil {
				log.Warningf("cannot remember the cluster ID: %v", err)
			}
		}
		return
	}
}

func readClusterID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(b))
	if !annotation.ValidClusterID(id) {
		return "", fmt.Errorf("%q is not a valid cluster ID", id)
	}
	return id, nil
}

// writeClusterID replaces the file atomically.
func writeClusterID(path, id string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
