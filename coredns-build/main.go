// Command coredns is stock CoreDNS with every in-tree plugin plus
// mcsannotations, which runs just before the in-tree kubernetes plugin.
package main

import (
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/core/plugin" // every in-tree plugin
	"github.com/coredns/coredns/coremain"

	"github.com/mcsannotations/mcsannotations/plugin/mcsannotations"
)

// Our release and commit, set by the Makefile (-ldflags "-X main.version=...
// -X main.commit=...", from git describe and git rev-parse).
var (
	version = "devel"
	commit  = "unknown"
)

func init() {
	d, err := mcsannotations.InsertDirective(dnsserver.Directives)
	if err != nil {
		panic(err)
	}
	dnsserver.Directives = d
	// coremain's init (it runs first: this package imports it) set the
	// version; -version and the start-up banner print it, then GitCommit.
	caddy.AppVersion = appVersion()
	coremain.GitCommit = commit
}

// appVersion names the CoreDNS release and ours: "1.15.0, mcsannotations v0.1.0".
func appVersion() string { return coremain.CoreVersion + ", mcsannotations " + version }

func main() { coremain.Run() }
