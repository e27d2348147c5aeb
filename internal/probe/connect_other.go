//go:build !linux

package probe

import (
	"context"
	"errors"
	"net/netip"
	"time"
)

// haveConnectAll: elsewhere than on Linux, TCP probes use the dialer.
const haveConnectAll = false

func connectAll(context.Context, []netip.AddrPort, int, time.Duration, func(int, error)) error {
	return errors.ErrUnsupported
}
