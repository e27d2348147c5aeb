package annotation

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Signatures (docs/DESIGN.md#security). The annotator signs the export
// annotation it writes with its cluster's ed25519 key, into
// SignatureAnnotation; a plugin given the clusters' public keys ignores export
// annotations that are not signed by the key of the cluster they were read
// from.
//
// The signature covers the cluster ID, the Pod's namespace, name and UID and
// the annotation's bytes, so that a signed annotation copied to another Pod,
// another namespace or another cluster does not verify. The signed message
// is SignatureContext followed by each of those five, each preceded by its
// length as 4 bytes, big-endian. The annotation's value is
// SignaturePrefix + base64 (standard, padded) of the 64-byte signature.
const (
	SignatureContext = "mcsannotations export-services signature v1\n"
	SignaturePrefix  = "ed25519:"

	// KeySuffix names a cluster's public key file in a verify folder:
	// <cluster ID>.pub, PEM "PUBLIC KEY" (PKIX), as
	// `openssl pkey -in key.pem -pubout` writes it.
	KeySuffix = ".pub"
)

// SignedMessage is the message a signature covers.
func SignedMessage(cluster, namespace, name, uid, value string) []byte {
	return signedMessage(SignatureContext, cluster, namespace, name, uid, value)
}

// signedMessage is context followed by each part, each preceded by its
// length as 4 bytes, big-endian.
func signedMessage(context string, parts ...string) []byte {
	n := len(context)
	for _, p := range parts {
		n += 4 + len(p)
	}
	b := make([]byte, 0, n)
	b = append(b, context...)
	for _, p := range parts {
		l := len(p)
		b = append(b, byte(l>>24), byte(l>>16), byte(l>>8), byte(l))
		b = append(b, p...)
	}
	return b
}

// Sign returns the signature annotation's value for an export annotation
// value on the Pod namespace/name (uid) in cluster.
func Sign(key ed25519.PrivateKey, cluster, namespace, name, uid, value string) string {
	return signature(key, SignedMessage(cluster, namespace, name, uid, value))
}

// signature is a signature annotation's value: SignaturePrefix and the
// signature of msg in base64.
func signature(key ed25519.PrivateKey, msg []byte) string {
	return SignaturePrefix + base64.StdEncoding.EncodeToString(ed25519.Sign(key, msg))
}

// Verify checks a signature annotation's value; the Rejection says why it
// fails (Index -1: it is about the annotation as a whole).
func Verify(key ed25519.PublicKey, sig, cluster, namespace, name, uid, value string) (Rejection, bool) {
	return verify(key, sig, SignedMessage(cluster, namespace, name, uid, value),
		"no "+SignatureAnnotation+" annotation: the export annotation is ignored",
		"does not verify with cluster "+cluster+"'s key: the export annotation is ignored")
}

// verify checks sig, a signature annotation's value, over msg; unsigned and
// wrong are the details of a missing and a failing signature.
func verify(key ed25519.PublicKey, sig string, msg []byte, unsigned, wrong string) (Rejection, bool) {
	if sig == "" {
		return Rejection{-1, ReasonUnsigned, unsigned}, false
	}
	b64, ok := strings.CutPrefix(sig, SignaturePrefix)
	if !ok {
		return Rejection{-1, ReasonBadSignature, fmt.Sprintf("%q: not %s<base64>", Clip(sig), SignaturePrefix)}, false
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != ed25519.SignatureSize {
		return Rejection{-1, ReasonBadSignature, fmt.Sprintf("%q: not a base64 ed25519 signature", Clip(sig))}, false
	}
	if !ed25519.Verify(key, msg, raw) {
		return Rejection{-1, ReasonBadSignature, wrong}, false
	}
	return Rejection{}, true
}

// ReadPrivateKey reads an ed25519 private key: PEM "PRIVATE KEY" (PKCS #8),
// as `openssl genpkey -algorithm ed25519` writes it.
func ReadPrivateKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: no PEM \"PRIVATE KEY\" block (want an ed25519 key in PKCS #8, as openssl genpkey -algorithm ed25519 writes)", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: a %T, want ed25519", path, k)
	}
	return ek, nil
}

// ParsePublicKey reads an ed25519 public key: PEM "PUBLIC KEY" (PKIX).
func ParsePublicKey(b []byte) (ed25519.PublicKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PUBLIC KEY" {
		return nil, errors.New(`no PEM "PUBLIC KEY" block (want an ed25519 key in PKIX, as openssl pkey -pubout writes)`)
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("a %T, want ed25519", k)
	}
	return ek, nil
}

// ReadPublicKeys reads every <cluster ID>.pub in dir, by cluster ID. A file
// that does not parse, or whose name is no valid cluster ID, is an error:
// a key an operator put there and the plugin ignored would fail open.
func ReadPublicKeys(dir string) (map[string]ed25519.PublicKey, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	keys := map[string]ed25519.PublicKey{}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), KeySuffix)
		if !ok || e.IsDir() {
			continue
		}
		if !ValidClusterID(id) {
			return nil, fmt.Errorf("%s: %q is not a cluster ID", filepath.Join(dir, e.Name()), id)
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		k, err := ParsePublicKey(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, e.Name()), err)
		}
		keys[id] = k
	}
	return keys, nil
}

// RequireKey says whether keys, read from the verify folder dir, hold the
// public key of cluster, which is what (the local cluster, a peer): a
// watched cluster without a key would have all its exports refused.
func RequireKey(keys map[string]ed25519.PublicKey, dir, cluster, what string) error {
	if keys[cluster] != nil {
		return nil
	}
	return fmt.Errorf("verify %s: no public key for %s %s: %s is missing", dir, what, cluster,
		filepath.Join(dir, cluster+KeySuffix))
}
