// Package formatcheck holds, in its tests only, a reader of turnsnap's
// stored format written from docs/FORMAT.md alone: it does not import the
// packages that write the format, and decodes a fixture store committed
// under testdata/ with nothing but the document, BLAKE3 and zstd. When the
// document and the bytes disagree, its test fails.
package formatcheck
