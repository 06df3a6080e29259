package proc

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func TestCheckRestore(t *testing.T) {
	here := HostFacts{Kernel: "6.18.44-fc-v769", Arch: "x86_64", CPUFlags: []string{"avx2", "fpu", "sse4_2"}, CRIUVersion: 40201}
	if err := CheckRestore(here, here); err != nil {
		t.Errorf("same host: %v", err)
	}
	older := here
	older.Kernel, older.CRIUVersion, older.CPUFlags = "6.12.1", 40101, []string{"fpu"}
	if err := CheckRestore(older, here); err != nil {
		t.Errorf("image from an older, smaller host: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*HostFacts)
		want []string
	}{
		{"missing CPU flag", func(h *HostFacts) { h.CPUFlags = append(h.CPUFlags, "avx512f", "sha_ni") }, []string{"avx512f sha_ni"}},
		{"newer CRIU", func(h *HostFacts) { h.CRIUVersion = 40300 }, []string{"CRIU 4.2.1 is older than 4.3.0"}},
		{"newer kernel", func(h *HostFacts) { h.Kernel = "6.19.0" }, []string{"kernel 6.18.44-fc-v769 is older"}},
		{"other arch", func(h *HostFacts) { h.Arch = "aarch64" }, []string{"architecture x86_64, not aarch64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := here
			rec.CPUFlags = append([]string(nil), here.CPUFlags...)
			tc.edit(&rec)
			err := CheckRestore(rec, here)
			if !errors.Is(err, errdefs.ErrPrecondition) {
				t.Fatalf("CheckRestore: %v, want ErrPrecondition", err)
			}
			for _, w := range append(tc.want, "filesystem only") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestHostFactsRoundTrip(t *testing.T) {
	h, err := CurrentHost()
	if err != nil {
		t.Fatal(err)
	}
	if h.Kernel == "" || h.Arch == "" || len(h.CPUFlags) == 0 {
		t.Fatalf("facts %+v", h)
	}
	h.CRIUVersion = 40201
	b, err := json.Marshal(h)
	if err != nil || !strings.Contains(string(b), `"criu_version":"4.2.1"`) {
		t.Fatalf("json %s %v", b, err)
	}
	var back HostFacts
	if err := json.Unmarshal(b, &back); err != nil || back.CRIUVersion != h.CRIUVersion || len(back.CPUFlags) != len(h.CPUFlags) {
		t.Errorf("round trip: %+v %v", back, err)
	}
}
