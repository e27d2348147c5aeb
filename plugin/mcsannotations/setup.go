package mcsannotations

import (
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"
)

const pluginName = "mcsannotations"

func init() { plugin.Register(pluginName, setup) }

func setup(c *caddy.Controller) error { return nil }
