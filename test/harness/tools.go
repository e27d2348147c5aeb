package harness

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// Environment variables that name the binaries.
const (
	EnvEtcd      = "MCS_E2E_ETCD"
	EnvAPIServer = "MCS_E2E_APISERVER"
	EnvCoreDNS   = "MCS_E2E_COREDNS"
	EnvAnnotator = "MCS_E2E_ANNOTATOR"
	// EnvKeep, when set, keeps the harness's folders (data, logs, Corefiles,
	// kubeconfigs) under $TMPDIR/mcs-e2e-* after the test instead of removing them.
	EnvKeep = "MCS_E2E_KEEP"
)

// TempDir is t.TempDir, or a folder that outlives the test when MCS_E2E_KEEP is set.
func TempDir(t T) string {
	t.Helper()
	if os.Getenv(EnvKeep) == "" {
		return t.TempDir()
	}
	dir, err := os.MkdirTemp("", "mcs-e2e-*")
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	t.Logf("harness: %s is set: keeping %s", EnvKeep, dir)
	return dir
}

// modulePath is the root module's path, used to find the repository root.
const modulePath = "github.com/mcsannotations/mcsannotations"

// Tools are the paths of the binaries a test runs.
type Tools struct {
	Etcd      string // etcd server
	APIServer string // kube-apiserver
	CoreDNS   string // bin/coredns with mcsannotations compiled in
	Annotator string // bin/mcs-annotator
}

var (
	rootOnce sync.Once
	rootDir  string
	rootErr  error
)

// RepoRoot returns the root of the repository: the nearest parent of the
// working directory whose go.mod declares the root module.
func RepoRoot() (string, error) {
	rootOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			rootErr = err
			return
		}
		for {
			b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
			if err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte("module "+modulePath+"\n")) {
				rootDir = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				rootErr = fmt.Errorf("no go.mod of module %s above the working directory", modulePath)
				return
			}
			dir = parent
		}
	})
	return rootDir, rootErr
}

// FindTools returns the binaries' paths: from the environment variables when
// set, else the defaults (.cache/tools/etcd-*/etcd, .cache/tools/kube-apiserver-*/kube-apiserver,
// bin/coredns under the repository root; the newest version when several are
// cached). It does not check that they exist.
func FindTools() Tools {
	root, _ := RepoRoot()
	return Tools{
		Etcd:      fromEnv(EnvEtcd, func() string { return newest(filepath.Join(root, ".cache/tools/etcd-*/etcd")) }),
		APIServer: fromEnv(EnvAPIServer, func() string { return newest(filepath.Join(root, ".cache/tools/kube-apiserver-*/kube-apiserver")) }),
		CoreDNS:   fromEnv(EnvCoreDNS, func() string { return filepath.Join(root, "bin", "coredns") }),
		Annotator: fromEnv(EnvAnnotator, func() string { return filepath.Join(root, "bin", "mcs-annotator") }),
	}
}

func fromEnv(name string, def func() string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def()
}

// newest returns the last match of a glob in version order, or the pattern
// itself when nothing matches (so that error messages name where we looked).
func newest(pattern string) string {
	m, _ := filepath.Glob(pattern)
	if len(m) == 0 {
		return pattern
	}
	sort.Slice(m, func(i, j int) bool { return versionLess(m[i], m[j]) })
	return m[len(m)-1]
}

// versionLess orders paths that differ in a dotted version, numerically.
func versionLess(a, b string) bool {
	fa := strings.FieldsFunc(a, func(r rune) bool { return r == '.' || r == '-' || r == '/' || r == 'v' })
	fb := strings.FieldsFunc(b, func(r rune) bool { return r == '.' || r == '-' || r == '/' || r == 'v' })
	for i := 0; i < len(fa) && i < len(fb); i++ {
		if fa[i] == fb[i] {
			continue
		}
		var na, nb int
		_, ea := fmt.Sscanf(fa[i], "%d", &na)
		_, eb := fmt.Sscanf(fb[i], "%d", &nb)
		if ea == nil && eb == nil && na != nb {
			return na < nb
		}
		return fa[i] < fb[i]
	}
	return len(fa) < len(fb)
}

// Tool names for RequireTools.
const (
	ToolEtcd      = "etcd"
	ToolAPIServer = "kube-apiserver"
	ToolCoreDNS   = "coredns"
	ToolAnnotator = "mcs-annotator"
)

// RequireTools returns the tools, after checking that the named ones (all when
// none is named) are executable files. When one is missing the test is
// skipped with the reason, or fails when the environment has CI=true: CI must
// never pass by skipping.
func RequireTools(t T, names ...string) Tools {
	t.Helper()
	tools := FindTools()
	if len(names) == 0 {
		names = []string{ToolEtcd, ToolAPIServer, ToolCoreDNS}
	}
	var missing []string
	for _, n := range names {
		var path, env, how string
		switch n {
		case ToolEtcd:
			path, env, how = tools.Etcd, EnvEtcd, "make tools"
		case ToolAPIServer:
			path, env, how = tools.APIServer, EnvAPIServer, "make tools"
		case ToolCoreDNS:
			path, env, how = tools.CoreDNS, EnvCoreDNS, "make build"
		case ToolAnnotator:
			path, env, how = tools.Annotator, EnvAnnotator, "make build"
		default:
			t.Fatalf("harness: unknown tool %q", n)
		}
		if st, err := os.Stat(path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, fmt.Sprintf("%s (%s; run `%s` or set %s)", n, path, how, env))
		}
	}
	if len(missing) > 0 {
		msg := "end-to-end tools missing: " + strings.Join(missing, ", ")
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s; CI=true, so this is a failure, not a skip", msg)
		}
		t.Skip(msg)
	}
	return tools
}
