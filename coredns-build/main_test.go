package main

import (
	"slices"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
)

// The chain order comes from dnsserver.Directives: mcsannotations must sit
// just before kubernetes, and be registered as a plugin.
func TestDirectivePosition(t *testing.T) {
	i := slices.Index(dnsserver.Directives, "mcsannotations")
	if i < 0 || i+1 >= len(dnsserver.Directives) || dnsserver.Directives[i+1] != "kubernetes" {
		t.Fatalf("mcsannotations at %d, followed by %v", i, dnsserver.Directives[i+1:min(i+2, len(dnsserver.Directives))])
	}
	if n := len(slices.Compact(slices.Clone(dnsserver.Directives))); n != len(dnsserver.Directives) {
		t.Fatal("duplicate directives")
	}
	if !slices.Contains(caddy.ListPlugins()["others"], "dns.mcsannotations") {
		t.Fatal("mcsannotations is not registered")
	}
}
