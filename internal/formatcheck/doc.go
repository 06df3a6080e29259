// Package formatcheck holds, in its tests only, a reader of turnsnap's
// stored format written from docs/FORMAT.md alone: it does not import the
// packages that write the format, and decodes the fixture stores committed
// under testdata/ with nothing but the document, BLAKE3, zstd and
// XChaCha20-Poly1305, comparing what it reads with the manifest each
// fixture's writer left beside it. When the document and the bytes
// disagree, its test fails. gen_test.go, the only file that uses
// turnsnap's own code, regenerates the fixtures when given -update.
package formatcheck
