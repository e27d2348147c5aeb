package mcsannotations

import (
	"fmt"
	"strings"

	"github.com/go-logr/logr"
)

// klogSink routes client-go's klog output into CoreDNS's log, so that
// informer and reflector errors carry the plugin's prefix.
type klogSink struct{ kv []any }

func (klogSink) Init(logr.RuntimeInfo) {}
func (klogSink) Enabled(int) bool      { return true } // klog applies its own verbosity

func (s klogSink) Info(_ int, msg string, kv ...any) { log.Info(s.render(msg, nil, kv)) }

func (s klogSink) Error(err error, msg string, kv ...any) { log.Error(s.render(msg, err, kv)) }

func (s klogSink) WithValues(kv ...any) logr.LogSink {
	return klogSink{kv: append(append([]any(nil), s.kv...), kv...)}
}

func (s klogSink) WithName(string) logr.LogSink { return s }

func (s klogSink) render(msg string, err error, kv []any) string {
	var b strings.Builder
	b.WriteString(msg)
	if err != nil {
		b.WriteString(": ")
		b.WriteString(err.Error())
	}
	all := append(append([]any(nil), s.kv...), kv...)
	for i := 0; i+1 < len(all); i += 2 {
		fmt.Fprintf(&b, " %v=%q", all[i], fmt.Sprint(all[i+1]))
	}
	return b.String()
}
