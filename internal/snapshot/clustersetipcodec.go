package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/mcsannotations/mcsannotations/internal/table"
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
func EncodeClusterSetIP(ci table.ClusterSetIP) ([]byte, error) {
	s := storedClusterSetIP{Namespace: ci.Namespace, Name: ci.Name, IPs: ci.IPs}
	for _, p := range ci.Ports {
		s.Ports = append(s.Ports, storedPort(p))
	}
	return json.Marshal(s)
}

// DecodeClusterSetIP decodes what EncodeClusterSetIP wrote; it fails on
// anything that table.SetClusterSetIPs could not use.
func DecodeClusterSetIP(b []byte) (table.ClusterSetIP, error) {
	var s storedClusterSetIP
	if err := json.Unmarshal(b, &s); err != nil {
		return table.ClusterSetIP{}, err
	}
	if s.Namespace == "" || s.Name == "" || len(s.IPs) == 0 {
		return table.ClusterSetIP{}, errors.New("ClusterSetIP record without namespace, name or IPs")
	}
	ci := table.ClusterSetIP{Namespace: s.Namespace, Name: s.Name}
	for _, ip := range s.IPs {
		if !ip.IsValid() || ip.Zone() != "" {
			return table.ClusterSetIP{}, fmt.Errorf("ClusterSetIP record with a bad IP %v", ip)
		}
		ci.IPs = append(ci.IPs, ip.Unmap())
	}
	for _, p := range s.Ports {
		if p.Port == 0 || (p.Protocol != "TCP" && p.Protocol != "UDP" && p.Protocol != "SCTP") {
			return table.ClusterSetIP{}, fmt.Errorf("ClusterSetIP record with a bad port %+v", p)
		}
		ci.Ports = append(ci.Ports, table.ImportPort(p))
	}
	return ci, nil
}
