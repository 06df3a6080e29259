package delta

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func TestHeadOwnerLine(t *testing.T) {
	id := Hash([]byte("record"))
	home := NewSandboxID()
	for _, o := range []Owner{{}, {Home: home, Epoch: 1}, {Home: home, Epoch: 1 << 40}} {
		data := EncodeHead(id, o)
		got, gotO, err := ParseHead(data)
		if err != nil || got != id || gotO != o {
			t.Fatalf("ParseHead(%q) = %s, %v, %v; want %s, %v", data, got.Short(), gotO, err, id.Short(), o)
		}
		if r, err := ParseRef(data); err != nil || r != id {
			t.Fatalf("ParseRef(%q) = %s, %v", data, r.Short(), err)
		}
	}
	if string(EncodeHead(id, Owner{})) != string(EncodeRef(id)) {
		t.Fatal("a head without owner must equal a plain ref")
	}
	bad := []string{
		"",
		"zz\n",
		id.String() + "\nowner\n",
		id.String() + "\nowner " + home + " 0\n",
		id.String() + "\nowner " + home + " 01\n",
		id.String() + "\nowner " + home + " -1\n",
		id.String() + "\nowner " + home + " 1 extra\n",
		id.String() + "\nowner NOTAHOME 1\n",
		id.String() + "\nholder " + home + " 1\n",
		id.String() + "\n" + strings.Repeat("x", MaxSmallObject),
	}
	for _, b := range bad {
		if _, _, err := ParseHead([]byte(b)); !errors.Is(err, errdefs.ErrCorrupt) {
			t.Fatalf("ParseHead(%.60q) = %v, want ErrCorrupt", b, err)
		}
	}
}

func TestHostLeaseLive(t *testing.T) {
	now := time.Now()
	l := HostLease{Renewed: now.Add(-30 * time.Second), TTLNs: int64(time.Minute)}
	if !l.Live(time.Time{}, now) {
		t.Fatal("lease renewed 30s ago with a 60s TTL is not live")
	}
	if l.Live(time.Time{}, now.Add(31*time.Second)) {
		t.Fatal("lease renewed 61s ago with a 60s TTL is live")
	}
	if !l.Live(now, now.Add(31*time.Second)) {
		t.Fatal("the store's later modification time must count")
	}
	old := HostLease{Renewed: now.Add(-2 * DefaultLeaseTTL)}
	if old.Live(time.Time{}, now) {
		t.Fatal("a lease without TTL uses DefaultLeaseTTL")
	}
}

func FuzzParseHead(f *testing.F) {
	f.Add([]byte(EncodeHead(Hash([]byte("x")), Owner{Home: NewSandboxID(), Epoch: 3})))
	f.Add([]byte("0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		id, o, err := ParseHead(data)
		if err != nil {
			return
		}
		id2, o2, err := ParseHead(EncodeHead(id, o))
		if err != nil || id2 != id || o2 != o {
			t.Fatalf("round trip of %q: %v %v %v", data, id2, o2, err)
		}
	})
}
