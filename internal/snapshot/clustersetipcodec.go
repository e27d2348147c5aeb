package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/mcsannotations/mcsannotations/internal/clustersetip"
)

// storedClusterSetIP is the snapshot's form of a ClusterSetIP.
type storedClusterSetIP struct {
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	IPs       []netip.Addr `json:"ips"`
	Ports     []storedPort `json:"ports,omitempty"`
}

type storedPort struct {
	Name     string `json:"name,omitempty"`
	Protocol string `json:"protocol"`
	Port     uint16 `json:"port"`
}

// EncodeClusterSetIP encodes ci for the snapshot (JSON: a few per cluster).
func EncodeClusterSetIP(ci clustersetip.ClusterSetIP) ([]byte, error) {
	s := storedClusterSetIP{Namespace: ci.Namespace, Name: ci.Name, IPs: ci.IPs}
	for _, p := range ci.Ports {
		s.Ports = append(s.Ports, storedPort(p))
	}
	return json.Marshal(s)
}

// DecodeClusterSetIP decodes what EncodeClusterSetIP wrote; it fails on
// anything that clustersetip.SetClusterSetIPs could not use.
func DecodeClusterSetIP(b []byte) (clustersetip.ClusterSetIP, error) {
	var s storedClusterSetIP
	if err := json.Unmarshal(b, &s); err != nil {
		return clustersetip.ClusterSetIP{}, err
	}
	if s.Namespace == "" || s.Name == "" || len(s.IPs) == 0 {
		return clustersetip.ClusterSetIP{}, errors.New("ClusterSetIP record without namespace, name or IPs")
	}
	ci := clustersetip.ClusterSetIP{Namespace: s.Namespace, Name: s.Name}
	for _, ip := range s.IPs {
		if !ip.IsValid() || ip.Zone() != "" {
			return clustersetip.ClusterSetIP{}, fmt.Errorf("ClusterSetIP record with a bad IP %v", ip)
		}
		ci.IPs = append(ci.IPs, ip.Unmap())
	}
	for _, p := range s.Ports {
		if p.Port == 0 || (p.Protocol != "TCP" && p.Protocol != "UDP" && p.Protocol != "SCTP") {
			return clustersetip.ClusterSetIP{}, fmt.Errorf("ClusterSetIP record with a bad port %+v", p)
		}
		ci.Ports = append(ci.Ports, clustersetip.ImportPort(p))
	}
	return ci, nil
}
