package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Push pushes the index of each archive to registry/<image name>:tag, with
// the credentials of docker or podman (~/.docker/config.json,
// $REGISTRY_AUTH_FILE) when there are any. It returns the references pushed,
// by digest.
func Push(ctx context.Context, registry, tag string, archives []string, opts ...remote.Option) ([]string, error) {
	var pushed []string
	for _, path := range archives {
		idx, _, cleanup, err := ReadArchive(path)
		if err != nil {
			return pushed, err
		}
		err = func() error {
			defer cleanup()
			base := strings.TrimSuffix(filepath.Base(path), ".oci.tar")
			ref, err := name.ParseReference(strings.TrimSuffix(registry, "/") + "/" + base + ":" + tag)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			o := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts...)
			if err := remote.WriteIndex(ref, idx, o...); err != nil {
				return fmt.Errorf("push %s: %w", ref, err)
			}
			d, err := idx.Digest()
			if err != nil {
				return err
			}
			pushed = append(pushed, ref.Context().Digest(d.String()).String())
			return nil
		}()
		if err != nil {
			return pushed, err
		}
	}
	return pushed, nil
}
