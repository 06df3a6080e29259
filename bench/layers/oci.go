package layers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"os"
	"regexp"
	"strings"
)

// The media types the reader follows (OCI and Docker's equivalents).
const (
	mtOCIIndex     = "application/vnd.oci.image.index.v1+json"
	mtOCIManifest  = "application/vnd.oci.image.manifest.v1+json"
	mtDockerList   = "application/vnd.docker.distribution.manifest.list.v2+json"
	mtDockerManif  = "application/vnd.docker.distribution.manifest.v2+json"
	maxIndexDepth  = 4
	maxDescriptors = 1024
)

type descriptor struct {
	MediaType string    `json:"mediaType"`
	Digest    string    `json:"digest"`
	Size      int64     `json:"size"`
	Platform  *platform `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// document is an index or a manifest: the fields the reader needs of each.
type document struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType,omitempty"`
	Manifests     []descriptor `json:"manifests,omitempty"`
	Layers        []descriptor `json:"layers,omitempty"`
}

var digestRE = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)

// UnpackOCI applies the layers of the image in the OCI image layout dir
// (index.json, blobs/sha256/...) in order into dst, which must exist. An
// index with several manifests picks linux/amd64 when platforms are given,
// else the first.
func UnpackOCI(ctx context.Context, dir, dst string, lim Limits) error {
	layout, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer layout.Close()
	fail := func(err error) error { return fmt.Errorf("OCI layout %s: %w", dir, err) }
	var doc document
	if err := readJSON(layout, "index.json", nil, lim.JSONBytes, &doc); err != nil {
		return fail(err)
	}
	for depth := 0; len(doc.Layers) == 0; depth++ {
		if depth >= maxIndexDepth {
			return fail(invalid("indexes nested over %d deep", maxIndexDepth))
		}
		d, err := pick(doc.Manifests)
		if err != nil {
			return fail(err)
		}
		switch d.MediaType {
		case mtOCIIndex, mtOCIManifest, mtDockerList, mtDockerManif, "":
		default:
			return fail(invalid("manifest %s: media type %q", d.Digest, d.MediaType))
		}
		doc = document{}
		if err := readJSON(layout, "", &d, lim.JSONBytes, &doc); err != nil {
			return fail(err)
		}
		if d.MediaType == mtOCIManifest || d.MediaType == mtDockerManif {
			if len(doc.Layers) == 0 {
				return fail(invalid("manifest %s has no layers", d.Digest))
			}
		}
	}
	if len(doc.Layers) > lim.Layers {
		return fail(invalid("%d layers, over %d", len(doc.Layers), lim.Layers))
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	st := &state{lim: lim}
	for i, l := range doc.Layers {
		if !strings.Contains(l.MediaType, "tar") {
			return fail(invalid("layer %d: media type %q is not a tar", i+1, l.MediaType))
		}
		b, err := openBlob(layout, l)
		if err != nil {
			return fail(fmt.Errorf("layer %d: %w", i+1, err))
		}
		err = st.apply(ctx, b, root, true)
		if err == nil {
			err = b.check()
		}
		b.Close()
		if err != nil {
			return fail(fmt.Errorf("layer %d (%s): %w", i+1, l.Digest, err))
		}
	}
	return nil
}

func pick(ds []descriptor) (descriptor, error) {
	if len(ds) == 0 {
		return descriptor{}, invalid("no manifest")
	}
	if len(ds) > maxDescriptors {
		return descriptor{}, invalid("%d manifests, over %d", len(ds), maxDescriptors)
	}
	for _, d := range ds {
		if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == "amd64" {
			return d, nil
		}
	}
	return ds[0], nil
}

// blob is a blob's reader that checks its size and digest.
type blob struct {
	f    *os.File
	r    io.Reader
	h    hash.Hash
	n    int64
	want descriptor
}

func openBlob(layout *os.Root, d descriptor) (*blob, error) {
	if !digestRE.MatchString(d.Digest) {
		return nil, invalid("digest %q is not sha256:<64 hex>", d.Digest)
	}
	if d.Size < 0 {
		return nil, invalid("blob %s: size %d", d.Digest, d.Size)
	}
	f, err := layout.Open("blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:"))
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() != d.Size {
		f.Close()
		return nil, invalid("blob %s: not a regular file of %d bytes", d.Digest, d.Size)
	}
	b := &blob{f: f, h: sha256.New(), want: d}
	b.r = io.TeeReader(io.LimitReader(f, d.Size), b.h)
	return b, nil
}

func (b *blob) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += int64(n)
	return n, err
}

// check reads what the layer's reader left and compares the digest.
func (b *blob) check() error {
	if _, err := io.Copy(io.Discard, b); err != nil {
		return err
	}
	if b.n != b.want.Size || "sha256:"+hex.EncodeToString(b.h.Sum(nil)) != b.want.Digest {
		return invalid("blob %s: digest mismatch", b.want.Digest)
	}
	return nil
}

func (b *blob) Close() error { return b.f.Close() }

// readJSON decodes index.json (name) or the blob d, bounded by max bytes.
func readJSON(layout *os.Root, name string, d *descriptor, max int64, v any) error {
	var data []byte
	if d != nil {
		if d.Size > max {
			return invalid("%s: %d bytes, over %d", d.Digest, d.Size, max)
		}
		b, err := openBlob(layout, *d)
		if err != nil {
			return err
		}
		defer b.Close()
		if data, err = io.ReadAll(b); err != nil {
			return err
		}
		if err := b.check(); err != nil {
			return err
		}
		name = d.Digest
	} else {
		f, err := layout.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		if data, err = io.ReadAll(io.LimitReader(f, max+1)); err != nil {
			return err
		}
		if int64(len(data)) > max {
			return invalid("%s: over %d bytes", name, max)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return invalid("%s: %v", name, err)
	}
	return nil
}
