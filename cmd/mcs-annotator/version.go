package main

import (
	"fmt"
	"runtime"
)

// Our release and commit, set by the Makefile (-ldflags "-X main.version=...
// -X main.commit=...", from git describe and git rev-parse).
var (
	version = "devel"
	commit  = "unknown"
)

// versionString is what -version prints: "mcs-annotator v0.1.0\nlinux/amd64, go1.26.0, <commit>".
func versionString() string {
	return fmt.Sprintf("mcs-annotator %s\n%s/%s, %s, %s\n", version, runtime.GOOS, runtime.GOARCH, runtime.Version(), commit)
}
