package mcsannotations

import "fmt"

// Anchor is the in-tree plugin that mcsannotations runs just before:
// cluster.local queries that are not aliases fall through to it.
const Anchor = "kubernetes"

// InsertDirective returns a copy of directives (CoreDNS's plugin order,
// dnsserver.Directives) with mcsannotations placed just before Anchor. It
// fails when Anchor is missing, so that a CoreDNS upgrade that renames or
// drops the anchor breaks the build loudly instead of misordering the chain.
func InsertDirective(directives []string) ([]string, error) {
	out := make([]string, 0, len(directives)+1)
	found := false
	for _, d := range directives {
		if d == pluginName {
			return nil, fmt.Errorf("directive %q is already registered", pluginName)
		}
		if d == Anchor {
			out = append(out, pluginName)
			found = true
		}
		out = append(out, d)
	}
	if !found {
		return nil, fmt.Errorf("anchor directive %q not found: cannot place %q", Anchor, pluginName)
	}
	return out, nil
}
