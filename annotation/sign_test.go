package annotation

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

func newKey(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

func TestSignVerify(t *testing.T) {
	pub, priv := newKey(t)
	otherPub, _ := newKey(t)
	const value = `{"services":[{"name":"backend"}]}`
	sig := Sign(priv, "edge-a", "ns", "p", "uid-1", value)
	if !strings.HasPrefix(sig, SignaturePrefix) {
		t.Fatalf("signature %q lacks its prefix", sig)
	}
	if r, ok := Verify(pub, sig, "edge-a", "ns", "p", "uid-1", value); !ok {
		t.Fatalf("own signature refused: %v", r)
	}
	// Anything the signature covers, changed, fails; so does another key.
	for _, tc := range []struct {
		name                              string
		key                               ed25519.PublicKey
		sig, cluster, ns, pod, uid, value string
		reason                            Reason
	}{
		{"another cluster", pub, sig, "edge-b", "ns", "p", "uid-1", value, ReasonBadSignature},
		{"another namespace", pub, sig, "edge-a", "ns2", "p", "uid-1", value, ReasonBadSignature},
		{"another Pod", pub, sig, "edge-a", "ns", "q", "uid-1", value, ReasonBadSignature},
		{"the Pod recreated", pub, sig, "edge-a", "ns", "p", "uid-2", value, ReasonBadSignature},
		{"another value", pub, sig, "edge-a", "ns", "p", "uid-1", value + " ", ReasonBadSignature},
		{"fields shifted across the separators", pub, sig, "edge-an", "s", "p", "uid-1", value, ReasonBadSignature},
		{"another key", otherPub, sig, "edge-a", "ns", "p", "uid-1", value, ReasonBadSignature},
		{"unsigned", pub, "", "edge-a", "ns", "p", "uid-1", value, ReasonUnsigned},
		{"no prefix", pub, strings.TrimPrefix(sig, SignaturePrefix), "edge-a", "ns", "p", "uid-1", value, ReasonBadSignature},
		{"not base64", pub, SignaturePrefix + "!!!", "edge-a", "ns", "p", "uid-1", value, ReasonBadSignature},
		{"too short", pub, SignaturePrefix + "AAAA", "edge-a", "ns", "p", "uid-1", value, ReasonBadSignature},
		{"hostile length", pub, SignaturePrefix + strings.Repeat("A", 1<<16), "edge-a", "ns", "p", "uid-1", value, ReasonBadSignature},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := Verify(tc.key, tc.sig, tc.cluster, tc.ns, tc.pod, tc.uid, tc.value)
			if ok || r.Reason != tc.reason || r.Detail == "" || len(r.String()) > 300 {
				t.Errorf("Verify = %v, %v; want a short refusal with reason %s", r, ok, tc.reason)
			}
		})
	}
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	pub, priv := newKey(t)
	der, _ := x509.MarshalPKCS8PrivateKey(priv)
	writePEM(t, filepath.Join(dir, "key.pem"), "PRIVATE KEY", der)
	pder, _ := x509.MarshalPKIXPublicKey(pub)
	keys := filepath.Join(dir, "keys")
	os.Mkdir(keys, 0o755)
	writePEM(t, filepath.Join(keys, "edge-a.pub"), "PUBLIC KEY", pder)
	os.WriteFile(filepath.Join(keys, "README"), []byte("not a key"), 0o644) // other files are passed over

	k, err := ReadPrivateKey(filepath.Join(dir, "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadPublicKeys(keys)
	if err != nil || len(got) != 1 {
		t.Fatalf("keys %v, %v; want edge-a's", got, err)
	}
	sig := Sign(k, "edge-a", "ns", "p", "u", "v")
	if _, ok := Verify(got["edge-a"], sig, "edge-a", "ns", "p", "u", "v"); !ok {
		t.Error("a key pair read from files does not verify")
	}

	// Wrong files are errors that name the file.
	bad := map[string]func(string){
		"Bad_ID.pub":   func(p string) { writePEM(t, p, "PUBLIC KEY", pder) },
		"garbage.pub":  func(p string) { os.WriteFile(p, []byte("garbage"), 0o644) },
		"private.pub":  func(p string) { writePEM(t, p, "PRIVATE KEY", der) },
		"rsa-ish.pub":  func(p string) { writePEM(t, p, "PUBLIC KEY", []byte{0x30, 0x03, 0x02, 0x01, 0x01}) },
		"truncate.pub": func(p string) { writePEM(t, p, "PUBLIC KEY", pder[:10]) },
	}
	for name, write := range bad {
		d := t.TempDir()
		write(filepath.Join(d, name))
		if _, err := ReadPublicKeys(d); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %v, want one naming the file", name, err)
		}
	}
	writePEM(t, filepath.Join(dir, "pub-as-private.pem"), "PUBLIC KEY", pder)
	if _, err := ReadPrivateKey(filepath.Join(dir, "pub-as-private.pem")); err == nil {
		t.Error("a public key read as a private key")
	}
	if _, err := ReadPublicKeys(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing folder read without error")
	}
}

// BenchmarkVerify is the cost `verify` adds to each Pod the informer
// transforms (not to DNS answers): one ed25519 verification of a typical
// annotation. BenchmarkParseExports beside it is the parse every Pod costs
// anyway (once per distinct annotation, through the plugin's parse cache).
func BenchmarkVerify(b *testing.B) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	const value = `{"services":[{"name":"backend","namespace":"demo","cluster":"edge-a","ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}]}]}`
	sig := Sign(priv, "edge-a", "demo", "backend-7d9f8c6b5-x2k4q", "0b7d1c52-8f3e-4a8e-9c1d-2f6b7e9a1c3d", value)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := Verify(pub, sig, "edge-a", "demo", "backend-7d9f8c6b5-x2k4q", "0b7d1c52-8f3e-4a8e-9c1d-2f6b7e9a1c3d", value); !ok {
			b.Fatal("refused")
		}
	}
}

func BenchmarkParseExports(b *testing.B) {
	const value = `{"services":[{"name":"backend","namespace":"demo","cluster":"edge-a","ports":[{"name":"http","port":80,"targetPort":8080,"protocol":"TCP"}]}]}`
	b.ReportAllocs()
	for b.Loop() {
		if _, rej := ParseExports(value, "demo", "edge-a"); len(rej) > 0 {
			b.Fatal(rej)
		}
	}
}
