package delta

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// The plain scheme is BLAKE3-256, byte for byte as before keyed IDs: the
// official test vector, and the empty tree's ID every plaintext home holds.
func TestIDsPlainGolden(t *testing.T) {
	const abc = "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85" // BLAKE3("abc")
	if got := (IDs{}).Hash([]byte("abc")).String(); got != abc {
		t.Fatalf("plain ID of abc: %s, want %s", got, abc)
	}
	if (IDs{}).EmptyTree() != EmptyTree() || (*Keys)(nil).IDs() != (IDs{}) {
		t.Fatal("the plain scheme's empty tree or a nil Keys' scheme differs from plain BLAKE3")
	}
	if (IDs{}).Scheme() != SchemePlain || (IDs{}).Keyed() {
		t.Fatal("zero IDs is not the plain scheme")
	}
}

// Keyed IDs depend on the data key only: equal under one key (dedup),
// unrelated under two, unchanged by rewrapping under a new master key.
func TestKeyedIDsPerDataKey(t *testing.T) {
	data := bytes.Repeat([]byte("same plaintext in two tenants "), 1000)
	k1, k2 := NewDataKey(), NewDataKey()
	a, b := k1.IDs(), k2.IDs()
	if !a.Keyed() || a.Scheme() != SchemeKeyed {
		t.Fatalf("a new data key's scheme is %s", a.Scheme())
	}
	if h1, h2 := a.Hash(data), a.Hash(append([]byte(nil), data...)); h1 != h2 {
		t.Fatal("keyed IDs are not deterministic")
	}
	if a.Hash(data) == b.Hash(data) || a.Hash(data) == Hash(data) || b.Hash(data) == Hash(data) {
		t.Fatal("equal plaintext has equal IDs under different keys, or a keyed ID equals the plain one")
	}
	if a.EmptyTree() == b.EmptyTree() || a.EmptyTree() == EmptyTree() {
		t.Fatal("the empty tree has the same ID under two schemes")
	}
	if p := fmt.Sprintf("%v %+v %#v %s", a, struct{ IDs IDs }{a}, a, a); strings.Contains(p, hex.EncodeToString(a.key[:])) || !strings.Contains(p, SchemeKeyed) {
		t.Fatalf("printing keyed IDs shows the key or hides the scheme: %s", p)
	}
	h := a.New()
	h.Write(data[:100])
	h.Write(data[100:])
	if ID(h.Sum(nil)) != a.Hash(data) {
		t.Fatal("the streaming hasher and Hash disagree")
	}
	// Rotation: m1 wraps k1, m2 rewraps what m1 opened.
	m1, m2 := GenerateMasterKey(), GenerateMasterKey()
	o1 := mustUnwrap(t, m1, m1.WrapKeys(k1))
	o2 := mustUnwrap(t, m2, m2.WrapKeys(o1))
	if o1.IDs() != a || o2.IDs() != a {
		t.Fatal("unwrapping or rewrapping the data key changed its content IDs")
	}
}

// The scheme recorded in a key object is authenticated: stripping it (a
// downgrade to plain IDs) or changing it fails, and a key object of a
// store made before keyed IDs still opens, as plain.
func TestKeyObjectScheme(t *testing.T) {
	m := GenerateMasterKey()
	obj := m.WrapKeys(NewDataKey())
	var o map[string]any
	if err := json.Unmarshal(obj, &o); err != nil {
		t.Fatal(err)
	}
	if o["ids"] != SchemeKeyed {
		t.Fatalf("key object's ids: %v, want %q", o["ids"], SchemeKeyed)
	}
	delete(o, "ids")
	stripped, _ := json.Marshal(o)
	if _, err := m.UnwrapKeys(stripped); !errors.Is(err, errdefs.ErrKey) {
		t.Fatalf("key object with its scheme stripped: %v, want ErrKey", err)
	}
	o["ids"] = "md5"
	bogus, _ := json.Marshal(o)
	if _, err := m.UnwrapKeys(bogus); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("key object with an unknown scheme: %v, want ErrCorrupt", err)
	}
	legacy := m.WrapKeys(newKeys([KeySize]byte{7}, false))
	if bytes.Contains(legacy, []byte(`"ids"`)) {
		t.Fatalf("a plain-ID key object names a scheme: %s", legacy)
	}
	if k := mustUnwrap(t, m, legacy); k.IDs() != (IDs{}) {
		t.Fatal("a key object without a scheme opened with keyed IDs")
	}
}

// A blob checked under the wrong scheme fails as corrupt, never passes.
func TestDecodeBlobWrongScheme(t *testing.T) {
	codec, err := NewCodec()
	if err != nil {
		t.Fatal(err)
	}
	defer codec.Close()
	data := []byte("chunk")
	keyed := NewDataKey().IDs()
	if _, err := codec.DecodeBlob(keyed, BlobData, keyed.Hash(data), false, uint64(len(data)), data); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		ids IDs
		id  ID
	}{
		"plain ID, keyed check":     {keyed, Hash(data)},
		"keyed ID, plain check":     {IDs{}, keyed.Hash(data)},
		"keyed ID, other key check": {NewDataKey().IDs(), keyed.Hash(data)},
	} {
		if _, err := codec.DecodeBlob(c.ids, BlobData, c.id, false, uint64(len(data)), data); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}
