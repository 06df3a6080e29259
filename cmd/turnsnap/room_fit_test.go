package main

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// On a 100 MiB home with 86 MiB free (as df shows it), a turn that wrote
// 10 MiB is checkpointed (issue 24: it was refused as "has 43.5 MiB
// free"); a turn that cannot fit is refused before anything is written,
// and the free space the refusal reports is df's figure.
func TestCLIRoomCheckMatchesDF(t *testing.T) {
	fsDir := smallFS(t, "100m")
	home := filepath.Join(fsDir, "home")
	base := t.TempDir()
	os.WriteFile(filepath.Join(base, "a.txt"), []byte("base\n"), 0o644)
	t.Cleanup(func() { run(t, home, "sandbox", "rm", "s") })
	var created struct{ Root string }
	runJSON(t, home, &created, "sandbox", "create", "s", "--base", base)

	turn := make([]byte, 10<<20)
	rand.Read(turn)
	if err := os.WriteFile(filepath.Join(created.Root, "turn.bin"), turn, 0o644); err != nil {
		t.Fatal(err)
	}
	filler := fill(t, fsDir, 86<<20)
	t.Logf("free before the checkpoint: %.1f MiB (%s)", float64(freeBytes(t, fsDir))/(1<<20), spaceHolders(fsDir))
	if out, code := run(t, home, "checkpoint", "s", "--json"); code != 0 {
		t.Fatalf("10 MiB turn with %.1f MiB free: exit %d: %s (%s)", float64(freeBytes(t, fsDir))/(1<<20), code, out, spaceHolders(fsDir))
	}
	if out, code := run(t, home, "verify", "s@HEAD"); code != 0 {
		t.Fatalf("verify: exit %d: %s", code, out)
	}
	if out, code := run(t, home, "cat", "s@HEAD", "/turn.bin"); code != 0 || out != string(turn) {
		t.Fatalf("cat s@HEAD /turn.bin: exit %d, %d bytes", code, len(out))
	}
	t.Logf("after: %.1f MiB free (%s)", float64(freeBytes(t, fsDir))/(1<<20), spaceHolders(fsDir))

	// A turn that does not fit: 30 MiB with 56 MiB free. Opening the
	// catalog passes (48 MiB), but its log then holds 32 MiB, and the
	// packs do not fit beside the catalog's reserve: refused before the
	// first pack is written, with df's figures.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(created.Root, "turn.bin"))
	big := make([]byte, 30<<20)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(created.Root, "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	fill(t, fsDir, 56<<20)
	if free := freeBytes(t, fsDir); free < 50<<20 || free > 57<<20 {
		t.Fatalf("%.1f MiB free, want 56 (%s)", float64(free)/(1<<20), spaceHolders(fsDir))
	}
	packs := countPacks(t, home)
	free := freeBytes(t, fsDir)
	out, code := run(t, home, "checkpoint", "s")
	t.Log(out)
	if code != exitNoSpace || !strings.Contains(out, "home filesystem is full") {
		t.Fatalf("30 MiB turn with %.1f MiB free: exit %d: %s", float64(free)/(1<<20), code, out)
	}
	if n := countPacks(t, home); n != packs {
		t.Errorf("the refused checkpoint left %d packs", n-packs)
	}
	m := regexp.MustCompile(`has ([0-9.]+) MiB free`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("refusal names no free space: %s", out)
	}
	said, _ := strconv.ParseFloat(m[1], 64)
	if now := float64(freeBytes(t, fsDir)) / (1 << 20); said < now-1 || said > now+1 {
		t.Errorf("refusal says %.1f MiB free, df says %.1f MiB: %s", said, now, out)
	}
}
