package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writePub(t *testing.T, dir, cluster string) ed25519.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, cluster+".pub"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return pub
}

// -verify gives the controller's sources the keys of every cluster they
// read (the same check CoreDNS's verify makes), and refuses to start when a
// watched cluster has no key: its exports would all be refused.
func TestVerifyFlag(t *testing.T) {
	dir := t.TempDir()
	a := writePub(t, dir, "edge-a")
	b := writePub(t, dir, "edge-b")
	o, err := parseFlags([]string{"--cluster", "edge-a", "--mcs-controller", "--peer", "edge-b=/x", "--verify", dir})
	if err != nil {
		t.Fatal(err)
	}
	if !o.keys["edge-a"].Equal(a) || !o.keys["edge-b"].Equal(b) {
		t.Errorf("keys %v, want edge-a's and edge-b's", o.keys)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cluster", "edge-a", "--mcs-controller", "--peer", "edge-c=/x", "--verify", dir}, "no public key for peer edge-c: " + filepath.Join(dir, "edge-c.pub") + " is missing"},
		{[]string{"--cluster", "edge-z", "--mcs-controller", "--verify", dir}, "no public key for the local cluster edge-z"},
		{[]string{"--cluster", "edge-a", "--verify", dir}, "-verify needs -mcs-controller"},
		{[]string{"--cluster", "edge-a", "--mcs-controller", "--verify", filepath.Join(dir, "none")}, "cannot read the public keys"},
	} {
		if _, err := parseFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
	if o, err := parseFlags([]string{"--cluster", "edge-a", "--mcs-controller"}); err != nil || o.keys != nil {
		t.Errorf("no -verify: keys %v, error %v; want none", o.keys, err)
	}
}
