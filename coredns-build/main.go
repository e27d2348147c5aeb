// Command coredns is stock CoreDNS with every in-tree plugin plus
// mcsannotations, which runs just before the in-tree kubernetes plugin.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/core/plugin" // every in-tree plugin
	"github.com/coredns/coredns/coremain"

	"github.com/mcsannotations/mcsannotations/plugin/mcsannotations"
)

func init() {
	d, err := mcsannotations.InsertDirective(dnsserver.Directives)
	if err != nil {
		panic(err)
	}
	dnsserver.Directives = d
}

func main() { coremain.Run() }
