package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The numeric user both images run as (distroless's "nonroot"): no name
// lookup is needed, and runAsNonRoot can check it.
const (
	nonRootUID = 65532
	userSpec   = "65532:65532"
)

// Image is one image this project ships.
type Image struct {
	Name        string   // repository name under the registry: coredns-mcsannotations
	Title       string   // org.opencontainers.image.title
	Description string   // org.opencontainers.image.description
	Binaries    []string // file names in each platform's binary folder, copied to /<name>
	Entrypoint  []string
	Ports       []string // exposed ports, "53/udp"
}

// Images are the two images: our CoreDNS and the annotator.
var Images = []Image{
	{
		Name:        "coredns-mcsannotations",
		Title:       "CoreDNS with mcsannotations",
		Description: "CoreDNS with the mcsannotations plugin (multi-cluster services from Pod annotations, offline-first)",
		// mcs-snapshot-dir: the init step that gives the hostPath snapshot
		// folder to the non-root user (manifests/coredns/deployment.yaml).
		Binaries:   []string{"coredns", "mcs-snapshot-dir"},
		Entrypoint: []string{"/coredns"},
		Ports:      []string{"53/udp", "53/tcp", "9153/tcp"},
	},
	{
		Name:        "mcs-annotator",
		Title:       "mcs-annotator",
		Description: "Writes the export annotations of multi-cluster services onto the Pods that back them",
		Binaries:    []string{"mcs-annotator"},
		Entrypoint:  []string{"/mcs-annotator"},
		Ports:       []string{"9090/tcp"},
	},
}

// TestImages are not shipped: the real-node tests' (test/node) workload and
// the sandbox image their containerd runs each Pod in (no registry to pull
// one from). `image build -test-images` builds them instead of Images.
var TestImages = []Image{
	{
		Name:        "workload",
		Title:       "mcsannotations test workload",
		Description: "HTTP echo with the cluster and Pod name, a DNS lookup and an HTTP client (test/node/workload)",
		Binaries:    []string{"workload"},
		Entrypoint:  []string{"/workload", "serve"},
		Ports:       []string{"8080/tcp"},
	},
	{
		Name:        "pause",
		Title:       "mcsannotations test pause",
		Description: "The Pod sandbox of the real-node tests: sleeps until stopped (test/node/pause)",
		Binaries:    []string{"pause"},
		Entrypoint:  []string{"/pause"},
	},
}

// Platform is one architecture and the folder holding its binaries.
type Platform struct {
	v1.Platform
	Dir string
}

// ParsePlatform reads "linux/arm64=bin/linux_arm64".
func ParsePlatform(s string) (Platform, error) {
	plat, dir, ok := strings.Cut(s, "=")
	osName, arch, ok2 := strings.Cut(plat, "/")
	if !ok || !ok2 || dir == "" || osName != "linux" || (arch != "amd64" && arch != "arm64") {
		return Platform{}, fmt.Errorf("platform %q: want linux/amd64=DIR or linux/arm64=DIR", s)
	}
	p := Platform{Platform: v1.Platform{OS: osName, Architecture: arch}, Dir: dir}
	if arch == "arm64" {
		p.Variant = "v8"
	}
	return p, nil
}

// Build describes one run: what goes into every image.
type Build struct {
	Version   string    // org.opencontainers.image.version, and what -version prints
	Commit    string    // org.opencontainers.image.revision
	Source    string    // org.opencontainers.image.source
	CABundle  []byte    // /etc/ssl/certs/ca-certificates.crt
	Created   time.Time // every file's and the config's time: fixed, so that builds repeat
	Platforms []Platform
}

// labels are the OCI annotations of the image config, the manifests and the index.
func (b *Build) labels(img Image) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       img.Title,
		"org.opencontainers.image.description": img.Description,
		"org.opencontainers.image.version":     b.Version,
		"org.opencontainers.image.revision":    b.Commit,
		"org.opencontainers.image.source":      b.Source,
		"org.opencontainers.image.created":     b.Created.UTC().Format(time.RFC3339),
	}
}

// Index builds the multi-platform index of img.
func (b *Build) Index(img Image) (v1.ImageIndex, error) {
	base, err := b.baseLayer()
	if err != nil {
		return nil, err
	}
	var idx v1.ImageIndex = empty.Index
	idx = mutate.IndexMediaType(idx, types.OCIImageIndex)
	for _, p := range b.Platforms {
		i, err := b.image(img, base, p)
		if err != nil {
			return nil, err
		}
		plat := p.Platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: i, Descriptor: v1.Descriptor{Platform: &plat}})
	}
	return mutate.Annotations(idx, b.labels(img)).(v1.ImageIndex), nil
}

// image builds img for one platform: the shared base layer, then a layer
// with the binaries.
func (b *Build) image(img Image, base v1.Layer, p Platform) (v1.Image, error) {
	var files []file
	for _, name := range img.Binaries {
		path := filepath.Join(p.Dir, name)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if err := checkBinary(path, data, p.Architecture); err != nil {
			return nil, err
		}
		files = append(files, file{name: name, mode: 0o755, data: data})
	}
	bin, err := b.layer(files)
	if err != nil {
		return nil, err
	}
	i, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), base, bin)
	if err != nil {
		return nil, err
	}
	i = mutate.ConfigMediaType(i, types.OCIConfigJSON)
	cf, err := i.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = v1.Time{Time: b.Created}
	cf.Author = b.Source
	cf.Config.User = userSpec
	cf.Config.Entrypoint = img.Entrypoint
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=/", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}
	cf.Config.Labels = b.labels(img)
	cf.Config.ExposedPorts = map[string]struct{}{}
	for _, port := range img.Ports {
		cf.Config.ExposedPorts[port] = struct{}{}
	}
	i, err = mutate.ConfigFile(i, cf)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(i, b.labels(img)).(v1.Image), nil
}

// checkBinary refuses a binary for the wrong architecture, or one that
// needs a dynamic loader: the image has no libc.
func checkBinary(path string, data []byte, arch string) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%s: not an ELF binary: %w", path, err)
	}
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	if f.Machine != want {
		return fmt.Errorf("%s: built for %s, want %s (%s)", path, f.Machine, want, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s: dynamically linked (build it with CGO_ENABLED=0)", path)
		}
	}
	return nil
}

// baseLayer holds what every image shares: the CA bundle and the user.
func (b *Build) baseLayer() (v1.Layer, error) {
	return b.layer([]file{
		{name: "etc/", mode: 0o755},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: b.CABundle},
		{name: "tmp/", mode: 0o1777},
	})
}

// file is one entry of a layer; a name ending in / is a folder.
type file struct {
	name string
	mode int64
	data []byte
}

// layer writes files into a gzipped tar layer, owned by root, with fixed times.
func (b *Build) layer(files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: b.Created, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		if strings.HasSuffix(f.name, "/") {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}
