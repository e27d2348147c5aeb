package main

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// Annotations of the index's entry in the archive's index.json: the name
// `ctr -n k8s.io images import` gives the image (containerd reads its own
// annotation first), and the tag by the OCI layout convention.
const (
	containerdImageName = "io.containerd.image.name"
	ociRefName          = "org.opencontainers.image.ref.name"
)

// WriteArchive writes idx as an OCI image layout in a tar file at path,
// named ref (registry/name:tag). It writes path.tmp and renames it, so an
// interrupted build leaves no archive that looks complete.
func WriteArchive(path string, idx v1.ImageIndex, ref, tag string) error {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	l, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := l.AppendIndex(idx, layout.WithAnnotations(map[string]string{containerdImageName: ref, ociRefName: tag})); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := tarDir(dir, tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// tarDir writes the files under dir into a tar at out, in a fixed order
// with fixed times and owners.
func tarDir(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if d.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			return tw.WriteHeader(h)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, info.Size()
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// ReadArchive unpacks an archive that WriteArchive wrote into a temporary
// folder and returns its index and the name it carries. cleanup removes
// the folder; the index reads from it until then.
func ReadArchive(path string) (idx v1.ImageIndex, ref string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "mcs-image-")
	if err != nil {
		return nil, "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	if err := untar(path, dir); err != nil {
		return nil, "", nil, err
	}
	l, err := layout.FromPath(dir)
	if err != nil {
		return nil, "", nil, err
	}
	top, err := l.ImageIndex()
	if err != nil {
		return nil, "", nil, err
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, "", nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, "", nil, fmt.Errorf("%s: %d entries in index.json, want one image index", path, len(m.Manifests))
	}
	d := m.Manifests[0]
	if !d.MediaType.IsIndex() {
		return nil, "", nil, fmt.Errorf("%s: index.json holds a %s, want an image index", path, d.MediaType)
	}
	idx, err = top.ImageIndex(d.Digest)
	if err != nil {
		return nil, "", nil, err
	}
	return idx, d.Annotations[containerdImageName], cleanup, nil
}

// untar unpacks the regular files and folders of a tar into dir; any other
// entry, or a path that leaves dir, is an error.
func untar(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		name := filepath.FromSlash(h.Name)
		if !filepath.IsLocal(name) {
			return fmt.Errorf("%s: entry %q leaves the archive's folder", path, h.Name)
		}
		dst := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: entry %q is not a file or folder", path, h.Name)
		}
	}
}

// archiveName is the file an image's archive is written to.
func archiveName(img Image) string { return img.Name + ".oci.tar" }

// imageRef is registry/name:tag, trimmed of a trailing slash.
func imageRef(registry string, img Image, tag string) string {
	return strings.TrimSuffix(registry, "/") + "/" + img.Name + ":" + tag
}
