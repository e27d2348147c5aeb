// Command image builds the project's container images without Docker and
// without a base image (go-containerregistry: an empty image, two layers,
// a config), and pushes them. `make image` and `make push` run it.
//
//	image build -out bin/images -registry R -tag T -version V -commit C -source URL \
//	    -ca-bundle /etc/ssl/certs/ca-certificates.crt \
//	    -platform linux/amd64=bin -platform linux/arm64=bin/linux_arm64
//	image build -test-images ... (the same flags): the real-node tests' images
//	image push -registry R -tag T bin/images/*.oci.tar
//
// build writes one OCI archive per image (Images): an index of one image per
// -platform, each holding the static binaries from that platform's folder,
// the CA bundle, /etc/passwd with the non-root user 65532, and OCI labels
// with the version, commit and source.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: image build|push [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	switch os.Args[1] {
	case "build":
		err = build(os.Args[2:])
	case "push":
		err = push(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want build or push", os.Args[1])
	}
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// platforms collects repeated -platform flags.
type platforms []Platform

func (p *platforms) String() string { return fmt.Sprint(*p) }
func (p *platforms) Set(s string) error {
	pl, err := ParsePlatform(s)
	if err == nil {
		*p = append(*p, pl)
	}
	return err
}

func build(args []string) error {
	fs := flag.NewFlagSet("image build", flag.ContinueOnError)
	out := fs.String("out", "bin/images", "folder of the archives")
	registry := fs.String("registry", "localhost/mcsannotations", "registry and path the images are named under")
	tag := fs.String("tag", "", "image tag (default: -version)")
	var b Build
	fs.StringVar(&b.Version, "version", "", "version label (git describe)")
	fs.StringVar(&b.Commit, "commit", "", "revision label (the commit)")
	fs.StringVar(&b.Source, "source", "", "source label (the repository's URL)")
	caBundle := fs.String("ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "CA certificates (Debian's ca-certificates package)")
	fs.Var((*platforms)(&b.Platforms), "platform", "linux/ARCH=FOLDER of that architecture's binaries (repeat)")
	testImages := fs.Bool("test-images", false, "build the real-node tests' workload and pause images instead of the shipped ones")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if b.Version == "" || b.Commit == "" || b.Source == "" || len(b.Platforms) == 0 {
		return errors.New("build needs -version, -commit, -source and at least one -platform")
	}
	if *tag == "" {
		*tag = b.Version
	}
	var err error
	if b.CABundle, err = os.ReadFile(*caBundle); err != nil {
		return fmt.Errorf("%w (apt-get install ca-certificates)", err)
	}
	b.Created = time.Unix(0, 0).UTC()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	images := Images
	if *testImages {
		images = TestImages
	}
	for _, img := range images {
		idx, err := b.Index(img)
		if err != nil {
			return fmt.Errorf("%s: %w", img.Name, err)
		}
		path := filepath.Join(*out, archiveName(img))
		ref := imageRef(*registry, img, *tag)
		if err := WriteArchive(path, idx, ref, *tag); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		d, err := idx.Digest()
		if err != nil {
			return err
		}
		fmt.Printf("%s: %s@%s\n", path, ref, d)
	}
	return nil
}

func push(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("image push", flag.ContinueOnError)
	registry := fs.String("registry", "", "registry and path to push to (registry.example/team)")
	tag := fs.String("tag", "", "tag to push")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *registry == "" || *tag == "" || fs.NArg() == 0 {
		return errors.New("push needs -registry, -tag and the archives")
	}
	if strings.HasPrefix(*registry, "localhost/") {
		return fmt.Errorf("-registry %s is the local name of `make image`; give a registry to push to: make push REGISTRY=registry.example/team", *registry)
	}
	pushed, err := Push(ctx, *registry, *tag, fs.Args())
	for _, p := range pushed {
		fmt.Println("pushed", p)
	}
	return err
}
