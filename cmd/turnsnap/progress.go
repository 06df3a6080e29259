package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/turnsnap/turnsnap/engine"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/sys/unix"
)

// progressDelay keeps quick commands silent: a spinner that flashes for a
// few milliseconds is noise.
const progressDelay = time.Second

// progress shows a long operation's work on stderr, but only for a person:
// never with --json, and never when stderr is not a terminal (scripts, CI).
type progress struct {
	ctx  context.Context
	p    *mpb.Progress
	bar  *mpb.Bar
	last engine.Progress
}

func (a *app) newProgress(ctx context.Context) *progress {
	if a.json || !isTerminal(os.Stderr) {
		return nil
	}
	return &progress{ctx: ctx}
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// update is engine.Options.Progress. The engine calls it from the goroutine
// doing the work; mpb renders from its own.
func (pr *progress) update(p engine.Progress) {
	if p.Elapsed < progressDelay {
		return
	}
	if pr.p == nil {
		pr.p = mpb.NewWithContext(pr.ctx, mpb.WithOutput(os.Stderr), mpb.WithWidth(1))
		pr.bar = pr.p.New(0, mpb.SpinnerStyle(),
			mpb.PrependDecorators(decor.Any(func(decor.Statistics) string { return pr.describe() })),
			mpb.BarRemoveOnComplete())
	}
	pr.last = p
	pr.bar.SetCurrent(p.Blobs)
}

func (pr *progress) describe() string {
	p := pr.last
	rate := float64(p.Bytes) / max(p.Elapsed.Seconds(), 0.001)
	return fmt.Sprintf("working: %d chunks, %s (%s/s) ", p.Blobs, bytesStr(p.Bytes), bytesStr(int64(rate)))
}

// done removes the spinner; it is safe to call more than once.
func (pr *progress) done() {
	if pr == nil || pr.p == nil {
		return
	}
	pr.bar.SetTotal(-1, true)
	pr.p.Wait()
	pr.p = nil
}

// afterProgress clears the spinner before the first result line, so results
// never interleave with its redraws.
type afterProgress struct {
	w  io.Writer
	pr *progress
}

func (a *afterProgress) Write(b []byte) (int, error) {
	a.pr.done()
	return a.w.Write(b)
}
