package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// want is what an archive must hold.
type want struct {
	version, commit, source string
	ref                     string // the name ctr import gives it
	archs                   []string
}

// image is one platform's image read back from an archive.
type image struct {
	platform v1.Platform
	config   *v1.ConfigFile
	files    map[string][]byte // path in the image -> content (regular files)
	modes    map[string]int64
}

// readIndex reads every platform's image of idx, checks the properties
// every image of ours has, and returns them by architecture.
func readIndex(t *testing.T, idx v1.ImageIndex, img Image, w want) map[string]image {
	t.Helper()
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if !m.MediaType.IsIndex() || m.Annotations["org.opencontainers.image.revision"] != w.commit {
		t.Errorf("%s: index %s, annotations %v", img.Name, m.MediaType, m.Annotations)
	}
	out := map[string]image{}
	for _, d := range m.Manifests {
		if d.Platform == nil {
			t.Fatalf("%s: manifest %s has no platform", img.Name, d.Digest)
		}
		i, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := i.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		got := image{platform: *d.Platform, config: cf, files: map[string][]byte{}, modes: map[string]int64{}}
		layers, err := i.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range layers {
			rc, err := l.Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			tr := tar.NewReader(rc)
			for {
				h, err := tr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if h.Uid != 0 || h.Gid != 0 {
					t.Errorf("%s: %s owned by %d:%d, want root (the user reads, never writes, the image's files)", img.Name, h.Name, h.Uid, h.Gid)
				}
				got.modes["/"+strings.TrimSuffix(h.Name, "/")] = h.Mode
				if h.Typeflag == tar.TypeReg {
					b, err := io.ReadAll(tr)
					if err != nil {
						t.Fatal(err)
					}
					got.files["/"+h.Name] = b
				}
			}
			rc.Close()
		}
		arch := d.Platform.Architecture
		if _, dup := out[arch]; dup {
			t.Errorf("%s: two images for %s", img.Name, arch)
		}
		out[arch] = got

		c := cf.Config
		if d.Platform.OS != "linux" || cf.OS != "linux" || cf.Architecture != arch {
			t.Errorf("%s/%s: platform %+v, config %s/%s", img.Name, arch, d.Platform, cf.OS, cf.Architecture)
		}
		if !slices.Equal(c.Entrypoint, img.Entrypoint) || len(c.Cmd) != 0 {
			t.Errorf("%s/%s: entrypoint %q cmd %q, want %q", img.Name, arch, c.Entrypoint, c.Cmd, img.Entrypoint)
		}
		if c.User != "65532:65532" {
			t.Errorf("%s/%s: user %q, want the numeric non-root 65532:65532", img.Name, arch, c.User)
		}
		for k, v := range map[string]string{
			"org.opencontainers.image.version":  w.version,
			"org.opencontainers.image.revision": w.commit,
			"org.opencontainers.image.source":   w.source,
		} {
			if c.Labels[k] != v {
				t.Errorf("%s/%s: label %s = %q, want %q", img.Name, arch, k, c.Labels[k], v)
			}
		}
		ca := got.files["/etc/ssl/certs/ca-certificates.crt"]
		if !bytes.Contains(ca, []byte("-----BEGIN CERTIFICATE-----")) {
			t.Errorf("%s/%s: no CA bundle (%d bytes)", img.Name, arch, len(ca))
		}
		if !bytes.Contains(got.files["/etc/passwd"], []byte(":65532:65532:")) {
			t.Errorf("%s/%s: /etc/passwd has no user 65532: %q", img.Name, arch, got.files["/etc/passwd"])
		}
		bin := got.files[img.Entrypoint[0]]
		if got.modes[img.Entrypoint[0]]&0o111 == 0 {
			t.Errorf("%s/%s: %s is not executable (mode %o)", img.Name, arch, img.Entrypoint[0], got.modes[img.Entrypoint[0]])
		}
		if err := checkBinary(img.Entrypoint[0], bin, arch); err != nil {
			t.Errorf("%s/%s: %v", img.Name, arch, err)
		}
	}
	var archs []string
	for a := range out {
		archs = append(archs, a)
	}
	slices.Sort(archs)
	if !slices.Equal(archs, w.archs) {
		t.Errorf("%s: architectures %v, want %v", img.Name, archs, w.archs)
	}
	return out
}

// run writes an image's binary out and runs it with args.
func run(t *testing.T, bin []byte, args ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestArchives reads back the archives `make image` wrote (make image-test
// names them in MCS_IMAGES): both images, both architectures, entrypoint,
// user, labels, the CA bundle; and runs the host's binaries from the layer:
// -version prints the stamped version and commit, and CoreDNS's -plugins
// lists mcsannotations.
func TestArchives(t *testing.T) {
	dir := os.Getenv("MCS_IMAGES")
	if dir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("MCS_IMAGES is not set: run make image-test")
		}
		t.Skip("MCS_IMAGES is not set: run make image-test")
	}
	w := want{version: os.Getenv("MCS_IMAGE_VERSION"), commit: os.Getenv("MCS_IMAGE_COMMIT"),
		source: os.Getenv("MCS_IMAGE_SOURCE"), archs: []string{"amd64", "arm64"}}
	for _, img := range Images {
		t.Run(img.Name, func(t *testing.T) {
			idx, ref, cleanup, err := ReadArchive(filepath.Join(dir, archiveName(img)))
			if err != nil {
				t.Fatal(err)
			}
			defer cleanup()
			// MCS_IMAGE_REF is REGISTRY/NAME:TAG as make image names them.
			if want := strings.Replace(os.Getenv("MCS_IMAGE_REF"), "/NAME:", "/"+img.Name+":", 1); ref != want {
				t.Errorf("name in the archive %q, want %q", ref, want)
			}
			images := readIndex(t, idx, img, w)
			host, ok := images[runtime.GOARCH]
			if !ok || runtime.GOOS != "linux" {
				t.Skipf("no image for this host (%s/%s) to run", runtime.GOOS, runtime.GOARCH)
			}
			bin := host.files[img.Entrypoint[0]]
			out := run(t, bin, "-version")
			if !strings.Contains(out, w.version) || !strings.Contains(out, w.commit) {
				t.Errorf("%s -version: %q, want version %s and commit %s", img.Entrypoint[0], out, w.version, w.commit)
			}
			if img.Name == "coredns-mcsannotations" {
				// CoreDNS 1.15 lists one plugin name a line (older versions: dns.<name>).
				if out := run(t, bin, "-plugins"); !hasLine(out, "mcsannotations", "dns.mcsannotations") || !hasLine(out, "kubernetes", "dns.kubernetes") {
					t.Errorf("coredns -plugins does not list mcsannotations and kubernetes:\n%s", out)
				}
			}
		})
	}
}

// testBinaries cross-compiles a tiny static program for each architecture
// into dir/<arch>/ under the names the images want.
func testBinaries(t *testing.T, dir string, archs ...string) {
	t.Helper()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{
		"go.mod":  "module hello\n\ngo 1.26.0\n",
		"main.go": "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello\") }\n",
	} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, arch := range archs {
		for _, img := range Images {
			for _, b := range img.Binaries {
				cmd := exec.Command("go", "build", "-o", filepath.Join(dir, arch, b), ".")
				cmd.Dir = src
				cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("go build %s: %v\n%s", arch, err, out)
				}
			}
		}
	}
}

// binDir holds the tiny binaries of testBuild, built once per run.
var binDir struct {
	once sync.Once
	dir  string
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir.dir != "" {
		os.RemoveAll(binDir.dir)
	}
	os.Exit(code)
}

// testBuild is a Build of tiny binaries for amd64 and arm64.
func testBuild(t *testing.T) (*Build, want) {
	t.Helper()
	binDir.once.Do(func() {
		dir, err := os.MkdirTemp("", "mcs-image-test-")
		if err != nil {
			t.Fatal(err)
		}
		binDir.dir = dir
		testBinaries(t, dir, "amd64", "arm64")
	})
	dir := binDir.dir
	b := &Build{Version: "v1.2.3-4-gabcdef0", Commit: "abcdef0123456789", Source: "https://example.test/src",
		CABundle: []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"), Created: time.Unix(0, 0).UTC()}
	for _, a := range []string{"amd64", "arm64"} {
		p, err := ParsePlatform("linux/" + a + "=" + filepath.Join(dir, a))
		if err != nil {
			t.Fatal(err)
		}
		b.Platforms = append(b.Platforms, p)
	}
	return b, want{version: b.Version, commit: b.Commit, source: b.Source, archs: []string{"amd64", "arm64"}}
}

// TestBuild: the builder on tiny binaries, written to an archive and read
// back; the same input gives the same digest (no time or order leaks in).
func TestBuild(t *testing.T) {
	b, w := testBuild(t)
	img := Images[1]
	idx, err := b.Index(img)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), archiveName(img))
	ref := imageRef("registry.example/team/", img, "v1.2.3")
	if err := WriteArchive(path, idx, ref, "v1.2.3"); err != nil {
		t.Fatal(err)
	}
	back, gotRef, cleanup, err := ReadArchive(path)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	if gotRef != "registry.example/team/mcs-annotator:v1.2.3" {
		t.Errorf("name in the archive %q", gotRef)
	}
	images := readIndex(t, back, img, w)
	if v := images["arm64"].platform.Variant; v != "v8" {
		t.Errorf("arm64 variant %q, want v8", v)
	}
	if out := run(t, images[runtime.GOARCH].files["/mcs-annotator"]); out != "hello\n" {
		t.Errorf("the binary from the layer printed %q", out)
	}
	d1, _ := idx.Digest()
	again, err := b.Index(img)
	if err != nil {
		t.Fatal(err)
	}
	if d2, _ := again.Digest(); d1 != d2 {
		t.Errorf("two builds of the same input: %s and %s", d1, d2)
	}
	if d3, _ := back.Digest(); d3 != d1 {
		t.Errorf("the archive holds %s, built %s", d3, d1)
	}
}

// TestRefusals: a binary of the wrong architecture or a dynamically linked
// one is refused, as are platforms we do not build.
func TestRefusals(t *testing.T) {
	tb, _ := testBuild(t)
	dir := filepath.Dir(tb.Platforms[0].Dir)
	b := &Build{Version: "v", Commit: "c", Source: "s", Platforms: []Platform{{Platform: v1.Platform{OS: "linux", Architecture: "amd64"}, Dir: filepath.Join(dir, "arm64")}}}
	if _, err := b.Index(Images[0]); err == nil || !strings.Contains(err.Error(), "want EM_X86_64") {
		t.Errorf("arm64 binary as amd64: %v", err)
	}
	if runtime.GOOS == "linux" && runtime.GOARCH == "amd64" {
		dyn, err := os.ReadFile("/bin/sh")
		if err != nil {
			t.Fatal(err)
		}
		if f, err := elf.NewFile(bytes.NewReader(dyn)); err == nil && f.Machine == elf.EM_X86_64 {
			if err := checkBinary("/bin/sh", dyn, "amd64"); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
				t.Errorf("/bin/sh: %v, want dynamically linked", err)
			}
		}
	}
	for _, s := range []string{"linux/386=bin", "windows/amd64=bin", "linux/amd64", "linux/arm64="} {
		if _, err := ParsePlatform(s); err == nil {
			t.Errorf("platform %q accepted", s)
		}
	}
}

// TestPush pushes an archive to a registry on 127.0.0.1 (go-containerregistry's
// in-memory one) and reads the index back by tag: same digest, both platforms.
func TestPush(t *testing.T) {
	b, w := testBuild(t)
	img := Images[0]
	idx, err := b.Index(img)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), archiveName(img))
	if err := WriteArchive(path, idx, imageRef("localhost/mcsannotations", img, "v1"), "v1"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	reg := strings.TrimPrefix(srv.URL, "http://") + "/team"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pushed, err := Push(ctx, reg, "v1", []string{path})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := idx.Digest()
	if len(pushed) != 1 || pushed[0] != reg+"/"+img.Name+"@"+d.String() {
		t.Errorf("pushed %v, want %s/%s@%s", pushed, reg, img.Name, d)
	}
	ref, err := name.ParseReference(reg + "/" + img.Name + ":v1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Index(ref, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if gd, _ := got.Digest(); gd != d {
		t.Errorf("the registry holds %s, pushed %s", gd, d)
	}
	readIndex(t, got, img, w)
}

// hasLine reports whether out has a line that is one of names (spaces trimmed).
func hasLine(out string, names ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		for _, n := range names {
			if strings.TrimSpace(l) == n {
				return true
			}
		}
	}
	return false
}
