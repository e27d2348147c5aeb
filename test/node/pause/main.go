// Command pause is the sandbox ("pause") container of the real-node tests'
// Pods (test/node): containerd needs one image to hold each Pod's namespaces,
// and no registry is reachable, so it is built from our own code. It sleeps
// until SIGTERM or SIGINT and reaps any child that ends up under it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
