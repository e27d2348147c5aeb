package mcsannotations

import (
	"cmp"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"

	"github.com/mcsannotations/mcsannotations/annotation"
	"github.com/mcsannotations/mcsannotations/internal/relay"
	"github.com/mcsannotations/mcsannotations/internal/table"
)

func TestParse(t *testing.T) {
	tests := []struct {
		input    string
		err      string // substring of the error; "" for success
		zones    []string
		cluster  string
		kcfg     string
		kctx     string
		ttl      uint32
		loc      table.Locality
		fallQ    string // a name fallthrough must cover, if set
		snapshot string
		peers    []peerConfig
		hubs     []peerConfig
		hubNS    []string
		expire   time.Duration
		enforce  bool
		allow    []netip.Prefix
		records  int // records_per_namespace; 0: the default
	}{
		{input: "mcsannotations {\n cluster edge-a\n}", zones: []string{"clusterset.local."}, cluster: "edge-a", ttl: 5},
		{input: "mcsannotations clusterset.local cluster.local {\n cluster edge-a\n kubeconfig /k.yaml ctx-a\n ttl 30\n locality any\n fallthrough clusterset.local\n}",
			zones: []string{"clusterset.local.", "cluster.local."}, cluster: "edge-a", kcfg: "/k.yaml", kctx: "ctx-a", ttl: 30, loc: table.Any, fallQ: "x.clusterset.local."},
		{input: "mcsannotations {\n cluster edge-a\n snapshot /var/lib/mcs/table.db\n}", zones: []string{"clusterset.local."}, cluster: "edge-a", ttl: 5, snapshot: "/var/lib/mcs/table.db"},
		{input: "mcsannotations {\n cluster edge-a\n peer edge-b /b.yaml\n peer edge-c /c.yaml ctx-c\n expire 24h\n}", zones: []string{"clusterset.local."}, cluster: "edge-a", ttl: 5,
			peers: []peerConfig{{"edge-b", "/b.yaml", ""}, {"edge-c", "/c.yaml", "ctx-c"}}, expire: 24 * time.Hour},
		{input: "mcsannotations {\n cluster edge-a\n peer edge-b /b.yaml\n hub hub-1 /h1.yaml\n hub hub-2 /h2.yaml ctx-2\n}", zones: []string{"clusterset.local."}, cluster: "edge-a", ttl: 5,
			peers: []peerConfig{{"edge-b", "/b.yaml", ""}}, hubs: []peerConfig{{"hub-1", "/h1.yaml", ""}, {"hub-2", "/h2.yaml", "ctx-2"}}},
		{input: "mcsannotations {\n cluster edge-a\n hub hub-1 /h1.yaml\n hub_namespaces prod shop\n}", zones: []string{"clusterset.local."}, cluster: "edge-a", ttl: 5,
			hubs: []peerConfig{{"hub-1", "/h1.yaml", ""}}, hubNS: []string{"prod", "shop"}},
		{input: "mcsannotations {\n cluster edge-a\n imports enforce\n}", zones: []string{"clusterset.local."}, cluster: "edge-a", ttl: 5, enforce: true},
		{input: "mcsannotations {\n cluster edge-a\n imports enforce allow 10.1.2.3/8 fd00::/8\n}", zones: []string{"clusterset.local."}, cluster: "edge-a", ttl: 5, enforce: true,
			allow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}},
		{input: "mcsannotations example.org {\n cluster a.b.c\n kubeconfig /k.yaml\n ttl 0\n locality prefer-local\n fallthrough\n}",
			zones: []string{"example.org."}, cluster: "a.b.c", kcfg: "/k.yaml", ttl: 0, fallQ: "anything.org."},
		{input: "mcsannotations {\n cluster edge-a\n records_per_namespace 2000\n}", zones: []string{"clusterset.local."}, cluster: "edge-a", ttl: 5, records: 2000},
		// Errors.
		{input: "mcsannotations {\n cluster a\n records_per_namespace 0\n}", err: `records_per_namespace "0": must be a whole number from 1 to 10000000`},
		{input: "mcsannotations {\n cluster a\n records_per_namespace many\n}", err: `records_per_namespace "many": must be a whole number from 1 to 10000000`},
		{input: "mcsannotations {\n cluster a\n records_per_namespace\n}", err: "records_per_namespace takes exactly one argument, got 0"},
		{input: "mcsannotations", zones: []string{"clusterset.local."}, ttl: 5},
		{input: "mcsannotations {\n}", zones: []string{"clusterset.local."}, ttl: 5},
		{input: "mcsannotations {\n cluster\n}", err: "cluster takes exactly one argument, got 0"},
		{input: "mcsannotations {\n cluster a b\n}", err: "cluster takes exactly one argument, got 2"},
		{input: "mcsannotations {\n cluster Edge_A\n}", err: `cluster "Edge_A": must be an RFC 1123 subdomain`},
		{input: "mcsannotations {\n cluster " + strings.Repeat("a", 128) + "\n}", err: "must be an RFC 1123 subdomain of at most 127 characters"},
		{input: "mcsannotations {\n cluster a\n kubeconfig\n}", err: "kubeconfig takes PATH [CONTEXT], got 0 arguments"},
		{input: "mcsannotations {\n cluster a\n kubeconfig a b c\n}", err: "kubeconfig takes PATH [CONTEXT], got 3 arguments"},
		{input: "mcsannotations {\n cluster a\n ttl x\n}", err: `ttl "x": must be a whole number of seconds from 0 to 3600`},
		{input: "mcsannotations {\n cluster a\n ttl -1\n}", err: `ttl "-1": must be a whole number`},
		{input: "mcsannotations {\n cluster a\n ttl 3601\n}", err: `ttl "3601": must be a whole number`},
		{input: "mcsannotations {\n cluster a\n ttl\n}", err: "ttl takes exactly one argument, got 0"},
		{input: "mcsannotations {\n cluster a\n locality nearest\n}", err: `locality "nearest": must be prefer-local or any`},
		{input: "mcsannotations {\n cluster a\n bogus 1\n}", err: `unknown property "bogus"`},
		{input: "mcsannotations {\n cluster a\n snapshot\n}", err: "snapshot takes exactly one argument, got 0"},
		{input: "mcsannotations {\n cluster a\n peer b\n}", err: "peer takes NAME KUBECONFIG [CONTEXT], got 1 arguments"},
		{input: "mcsannotations {\n cluster a\n peer b /k c d\n}", err: "peer takes NAME KUBECONFIG [CONTEXT], got 4 arguments"},
		{input: "mcsannotations {\n cluster a\n peer B_ /k\n}", err: `peer "B_": the name must be an RFC 1123 subdomain`},
		{input: "mcsannotations {\n cluster a\n peer b /k\n peer b /k2\n}", err: `peer "b" is listed twice`},
		{input: "mcsannotations {\n peer a /k\n cluster a\n}", err: `peer "a" has the name of the local cluster`},
		{input: "mcsannotations {\n cluster a\n hub h\n}", err: "hub takes NAME KUBECONFIG [CONTEXT], got 1 arguments"},
		{input: "mcsannotations {\n cluster a\n hub h /k c d\n}", err: "hub takes NAME KUBECONFIG [CONTEXT], got 4 arguments"},
		{input: "mcsannotations {\n cluster a\n hub H_ /k\n}", err: `hub "H_": the name must be an RFC 1123 subdomain`},
		{input: "mcsannotations {\n cluster a\n hub h /k\n hub h /k2\n}", err: `hub "h" is listed twice`},
		{input: "mcsannotations {\n hub a /k\n cluster a\n}", err: `hub "a" has the name of the local cluster`},
		{input: "mcsannotations {\n cluster a\n hub h /k\n hub_namespaces\n}", err: "hub_namespaces takes one or more namespace names"},
		{input: "mcsannotations {\n cluster a\n hub h /k\n hub_namespaces prod Shop\n}", err: `hub_namespaces: namespace "Shop": a lowercase RFC 1123 label`},
		{input: "mcsannotations {\n cluster a\n hub h /k\n hub_namespaces prod prod\n}", err: `hub_namespaces: namespace "prod" named twice`},
		{input: "mcsannotations {\n cluster a\n hub h /k\n hub_namespaces " + strings.TrimSpace(strings.Repeat("n ", relay.MaxNamespaces+1)) + "\n}", err: "hub_namespaces: 1001 namespaces, more than 1000"},
		{input: "mcsannotations {\n cluster a\n hub h /k\n hub_namespaces a\n hub_namespaces b\n}", err: "hub_namespaces is given twice"},
		{input: "mcsannotations {\n cluster a\n hub_namespaces prod\n}", err: "hub_namespaces without a hub"},
		{input: "mcsannotations {\n cluster a\n expire\n}", err: "expire takes exactly one argument, got 0"},
		{input: "mcsannotations {\n cluster a\n imports\n}", err: "imports takes enforce [allow CIDR...]"},
		{input: "mcsannotations {\n cluster a\n imports allow 10.0.0.0/8\n}", err: "imports takes enforce [allow CIDR...]"},
		{input: "mcsannotations {\n cluster a\n imports enforce allow\n}", err: `imports enforce takes allow CIDR... after it, got "allow"`},
		{input: "mcsannotations {\n cluster a\n imports enforce 10.0.0.0/8\n}", err: `imports enforce takes allow CIDR... after it, got "10.0.0.0/8"`},
		{input: "mcsannotations {\n cluster a\n imports enforce allow 10.0.0.1\n}", err: `imports enforce allow "10.0.0.1": not a CIDR`},
		{input: "mcsannotations {\n cluster a\n expire 10\n}", err: `expire "10": must be a positive duration such as 30m or 24h`},
		{input: "mcsannotations {\n cluster a\n expire -1h\n}", err: `expire "-1h": must be a positive duration`},
		{input: "mcsannotations {\n cluster a\n snapshot /a /b\n}", err: "snapshot takes exactly one argument, got 2"},
		{input: "mcsannotations a.local a.local {\n cluster a\n}", err: `zone "a.local." is listed twice`},
		{input: "mcsannotations {\n cluster a\n}\nmcsannotations {\n cluster b\n}", err: "this plugin can only be used once per Server Block"},
	}
	for _, tc := range tests {
		t.Run(tc.input, func(t *testing.T) {
			cfg, ok := parseCase(t, tc.input, tc.err)
			if !ok {
				return
			}
			if strings.Join(cfg.zones, ",") != strings.Join(tc.zones, ",") || cfg.cluster != tc.cluster ||
				cfg.kubeconfig != tc.kcfg || cfg.kubecontext != tc.kctx || cfg.ttl != tc.ttl || cfg.locality != tc.loc || cfg.snapshot != tc.snapshot ||
				!slices.Equal(cfg.peers, tc.peers) || !slices.Equal(cfg.hubs, tc.hubs) || !slices.Equal(cfg.hubNS, tc.hubNS) || cfg.expire != tc.expire ||
				cfg.enforce != tc.enforce || !slices.Equal(cfg.allow, tc.allow) || cfg.nsRecords != cmp.Or(tc.records, defaultNamespaceRecords) {
				t.Errorf("got %+v", cfg)
			}
			if got := cfg.fall.Through(tc.fallQ); got != (tc.fallQ != "") {
				t.Errorf("fallthrough(%q) = %v", tc.fallQ, got)
			}
		})
	}
}

// Errors from the parser name the Corefile line.
func TestParseErrorNamesLine(t *testing.T) {
	c := caddy.NewTestController("dns", "mcsannotations {\n cluster a\n ttl nope\n}")
	_, err := parse(c)
	if err == nil || !strings.Contains(err.Error(), ":3 -") {
		t.Fatalf("error %v does not name line 3", err)
	}
}

func TestSetupKubeconfigMissing(t *testing.T) {
	c := caddy.NewTestController("dns", "mcsannotations {\n cluster edge-a\n kubeconfig /nonexistent/kubeconfig\n}")
	err := setup(c)
	if err == nil || !strings.Contains(err.Error(), "kubeconfig /nonexistent/kubeconfig") {
		t.Fatalf("error %v, want one naming the kubeconfig", err)
	}
}

// writeKey writes cluster's public key into dir as the verify word reads it
// (<cluster>.pub, PEM PKIX) and returns the private key.
func writeKey(t *testing.T, dir, cluster string) ed25519.PrivateKey {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, cluster+annotation.KeySuffix), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return priv
}

func TestParseVerify(t *testing.T) {
	keys := t.TempDir()
	writeKey(t, keys, "edge-a")
	writeKey(t, keys, "edge-b")
	garbage := t.TempDir()
	writeKey(t, garbage, "edge-a")
	os.WriteFile(filepath.Join(garbage, "edge-b.pub"), []byte("not a key"), 0o644)
	badName := t.TempDir()
	writeKey(t, badName, "Edge_A")
	notDir := filepath.Join(keys, "edge-a.pub")

	tests := []struct {
		input string
		err   string // substring of the error; "" for success
		keys  []string
	}{
		{input: "mcsannotations {\n cluster edge-a\n peer edge-b /b\n verify " + keys + "\n}", keys: []string{"edge-a", "edge-b"}},
		// Peers listed after verify are checked too; unused keys are fine.
		{input: "mcsannotations {\n verify " + keys + "\n cluster edge-a\n}", keys: []string{"edge-a", "edge-b"}},
		// No cluster word: the local key is checked once the ID is known.
		{input: "mcsannotations {\n verify " + keys + "\n}", keys: []string{"edge-a", "edge-b"}},
		{input: "mcsannotations {\n cluster edge-a\n}"},
		{input: "mcsannotations {\n cluster edge-a\n verify\n}", err: "verify takes exactly one argument, got 0"},
		{input: "mcsannotations {\n cluster edge-a\n verify a b\n}", err: "verify takes exactly one argument, got 2"},
		{input: "mcsannotations {\n cluster edge-a\n verify " + keys + "\n verify " + keys + "\n}", err: ":4 - Error during parsing: verify is given twice"},
		{input: "mcsannotations {\n cluster edge-a\n verify /nonexistent/keys\n}",
			err: "verify /nonexistent/keys: cannot read the public keys: open /nonexistent/keys: no such file or directory"},
		{input: "mcsannotations {\n cluster edge-a\n verify " + notDir + "\n}", err: "cannot read the public keys: open " + notDir + ": not a directory"},
		{input: "mcsannotations {\n cluster edge-a\n verify " + garbage + "\n}",
			err: "verify " + garbage + ": cannot read the public keys: " + filepath.Join(garbage, "edge-b.pub") + `: no PEM "PUBLIC KEY" block`},
		{input: "mcsannotations {\n cluster edge-a\n verify " + badName + "\n}", err: filepath.Join(badName, "Edge_A.pub") + `: "Edge_A" is not a cluster ID`},
		{input: "mcsannotations {\n cluster edge-x\n verify " + keys + "\n}",
			err: ":3 - Error during parsing: verify " + keys + ": no public key for the local cluster edge-x: " + filepath.Join(keys, "edge-x.pub") + " is missing"},
		{input: "mcsannotations {\n cluster edge-a\n verify " + keys + "\n peer edge-b /b\n peer edge-c /c\n}",
			err: ":3 - Error during parsing: verify " + keys + ": no public key for peer edge-c: " + filepath.Join(keys, "edge-c.pub") + " is missing"},
		{input: "mcsannotations {\n verify " + keys + "\n peer edge-c /c\n}", err: "no public key for peer edge-c: " + filepath.Join(keys, "edge-c.pub") + " is missing"},
	}
	for _, tc := range tests {
		t.Run(tc.input, func(t *testing.T) {
			cfg, ok := parseCase(t, tc.input, tc.err)
			if !ok {
				return
			}
			got := slices.Sorted(maps.Keys(cfg.keys))
			if !slices.Equal(got, tc.keys) || (cfg.verify != "") != (tc.keys != nil) {
				t.Errorf("verify %q, keys %v, want %v", cfg.verify, got, tc.keys)
			}
		})
	}
}

// parseCase parses input as a test case: when wantErr is set, the error must
// contain it (and ok is false); otherwise there must be none.
func parseCase(t *testing.T, input, wantErr string) (cfg config, ok bool) {
	t.Helper()
	cfg, err := parse(caddy.NewTestController("dns", input))
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("error %v, want one containing %q", err, wantErr)
		}
		return cfg, false
	}
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	return cfg, true
}
