package overlay

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// TestLinkMemoWalksOnce: roots asking for the same lower at once (a
// fan-out's branches scanning side by side) share one walk; another
// handle (the lower made again) walks again; a failed walk is not kept;
// a caller appending to the groups it got does not change the memo's.
func TestLinkMemoWalksOnce(t *testing.T) {
	var lm linkMemo
	var walks atomic.Int32
	walk := func() ([]linkGroup, error) {
		walks.Add(1)
		g := make([]linkGroup, 1, 8)
		g[0] = linkGroup{Handle: "h1", Names: []string{"a", "b"}}
		return g, nil
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := lm.groups("/layer", "root1", walk)
			if err != nil || len(g) != 1 {
				t.Errorf("groups: %v, %v", g, err)
			}
		}()
	}
	wg.Wait()
	if n := walks.Load(); n != 1 {
		t.Fatalf("8 concurrent roots walked the lower %d times, want 1", n)
	}
	g, _ := lm.groups("/layer", "root1", walk)
	_ = append(g, linkGroup{Handle: "mine"})
	if g2, _ := lm.groups("/layer", "root1", walk); len(g2) != 1 || cap(g2) != 1 {
		t.Fatalf("the memo's groups are shared with a caller's append: len %d cap %d", len(g2), cap(g2))
	}
	if _, err := lm.groups("/layer", "root2", walk); err != nil || walks.Load() != 2 {
		t.Fatalf("a lower made again (another root handle) was not walked: %d walks, %v", walks.Load(), err)
	}
	boom := errors.New("boom")
	if _, err := lm.groups("/other", "r", func() ([]linkGroup, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("a failed walk returned %v", err)
	}
	if _, err := lm.groups("/other", "r", walk); err != nil || walks.Load() != 3 {
		t.Fatalf("a failed walk was kept: %d walks, %v", walks.Load(), err)
	}
}
