package delta

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestCompressProbe: a large blob whose samples do not compress is stored
// as is without running the encoder over it; a large compressible one, and
// one that is random only at its start, are compressed and decompress to
// themselves.
func TestCompressProbe(t *testing.T) {
	c, err := NewCodec()
	if err != nil {
		t.Fatal(err)
	}
	random := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{1}).Read(random)
	if out, ok := c.Compress([]byte("x"), random); ok || !bytes.Equal(out, []byte("x")) {
		t.Fatalf("random blob: ok=%v, dst grew to %d bytes", ok, len(out))
	}
	text := bytes.Repeat([]byte("func main() { return nil }\n"), 40000)
	mixed := append(bytes.Clone(random[:64<<10]), text...)
	for name, plain := range map[string][]byte{"text": text, "random start": mixed} {
		out, ok := c.Compress(nil, plain)
		if !ok || len(out) >= len(plain)/2 {
			t.Fatalf("%s: ok=%v, %d of %d bytes", name, ok, len(out), len(plain))
		}
		back, err := c.Decompress(out, len(plain))
		if err != nil || !bytes.Equal(back, plain) {
			t.Fatalf("%s: decompress: %v", name, err)
		}
	}
}
