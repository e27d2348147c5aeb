// Command coredns is stock CoreDNS with every in-tree plugin plus mcsannotations,
// which runs just before the in-tree kubernetes plugin.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/core/plugin" // every in-tree plugin
	"github.com/coredns/coredns/coremain"

	_ "github.com/mcsannotations/mcsannotations/plugin/mcsannotations"
)

// anchor is the in-tree plugin that mcsannotations must run before: queries for
// cluster.local names that are not aliases fall through to it.
const anchor = "kubernetes"

func init() {
	d, err := insertBefore(dnsserver.Directives, "mcsannotations", anchor)
	if err != nil {
		panic(err)
	}
	dnsserver.Directives = d
}

func main() { coremain.Run() }
