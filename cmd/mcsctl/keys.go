package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// runKeys writes DIR/ID.key (the private key, PEM PKCS #8, mode 0600: what
// mcs-annotator --sign-key reads) and DIR/ID.pub (the public key, PEM PKIX:
// what the plugin's `verify DIR` reads by its name). It never overwrites a
// file, and reads both back with the readers the binaries use.
func runKeys(args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := flags("keys", stderr)
	cluster := fs.String("cluster", "", "cluster ID the key pair signs for (required)")
	out := fs.String("out", ".", "folder to write ID.key and ID.pub into")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 || *cluster == "" {
		fmt.Fprintln(stderr, "usage: mcsctl keys --cluster ID [--out DIR]")
		return errUsage
	}
	if !annotation.ValidClusterID(*cluster) {
		return fmt.Errorf("cluster %q: must be an RFC 1123 subdomain of at most %d characters", *cluster, annotation.MaxClusterIDLen)
	}
	priv, pub, err := writeKeys(*out, *cluster)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (private: mcs-annotator --cluster %s --sign-key %s)\n", priv, *cluster, priv)
	fmt.Fprintf(stdout, "wrote %s (public: copy it into the verify folder of every CoreDNS that reads cluster %s)\n", pub, *cluster)
	return nil
}

func writeKeys(dir, cluster string) (privPath, pubPath string, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", err
	}
	p8, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", "", err
	}
	pkix, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	privPath = filepath.Join(dir, cluster+".key")
	pubPath = filepath.Join(dir, cluster+annotation.KeySuffix)
	for _, p := range []string{privPath, pubPath} {
		if _, err := os.Lstat(p); err == nil {
			return "", "", fmt.Errorf("%s exists: not overwriting a key (move it away first)", p)
		}
	}
	if err := writeNew(privPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}), 0o600); err != nil {
		return "", "", err
	}
	if err := writeNew(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pkix}), 0o644); err != nil {
		return "", "", errors.Join(err, os.Remove(privPath))
	}
	// Read both back as the binaries will.
	rp, err := annotation.ReadPrivateKey(privPath)
	if err != nil {
		return "", "", err
	}
	pb, err := os.ReadFile(pubPath)
	if err != nil {
		return "", "", err
	}
	rpub, err := annotation.ParsePublicKey(pb)
	if err != nil {
		return "", "", err
	}
	if !rpub.Equal(rp.Public()) {
		return "", "", errors.New("the written keys do not read back as a pair")
	}
	return privPath, pubPath, nil
}

// writeNew creates path (failing if it exists) with data and mode.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Sync(), f.Close())
}
