package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/engine"
	"github.com/vbauerster/cupwriter"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/sys/unix"
)

// progressDelay keeps quick commands silent: a spinner that flashes for a
// few milliseconds is noise.
const progressDelay = time.Second

// progress shows a long operation's work on stderr, but only for a person:
// never with --json, and never when stderr is not a terminal (scripts, CI).
// It appears once the operation has run for progressDelay, even if the
// engine reported nothing since (a phase that stalls still shows).
type progress struct {
	ctx   context.Context
	mu    sync.Mutex
	p     *mpb.Progress
	bar   *mpb.Bar
	timer *time.Timer
	last  engine.Progress
	ended bool
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
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.last = p
	switch {
	case pr.ended:
	case pr.bar != nil:
		pr.bar.SetCurrent(p.Blobs)
	case pr.timer == nil:
		pr.timer = time.AfterFunc(max(progressDelay-p.Elapsed, 0), pr.show)
	}
}

func (pr *progress) show() {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.ended || pr.p != nil {
		return
	}
	pr.p = mpb.NewWithContext(pr.ctx, mpb.WithConsoleWriter(sizedWriter{cupwriter.New(os.Stderr, false)}), mpb.WithWidth(1))
	pr.bar = pr.p.New(0, mpb.SpinnerStyle(),
		mpb.PrependDecorators(decor.Any(func(decor.Statistics) string { return pr.describe() })),
		mpb.BarRemoveOnComplete())
	pr.bar.SetCurrent(pr.last.Blobs)
}

// describe is the progress line: the phase when known, the work so far, and
// the total with a percentage when the phase knows its size.
func (pr *progress) describe() string {
	pr.mu.Lock()
	p := pr.last
	pr.mu.Unlock()
	return progressLine(p)
}

func progressLine(p engine.Progress) string {
	var b strings.Builder
	phase := p.Phase
	if phase == "" {
		phase = "working"
	}
	fmt.Fprintf(&b, "%s: %d chunks, ", phase, p.Blobs)
	if p.Total > 0 {
		// Reads count trees too, so Done can pass a total of file bytes.
		pct := min(100*p.Done/p.Total, 99)
		fmt.Fprintf(&b, "%s of %s (%d%%)", bytesStr(min(p.Done, p.Total)), bytesStr(p.Total), pct)
	} else {
		b.WriteString(bytesStr(p.Bytes))
	}
	rate := float64(p.Bytes) / max(p.Elapsed.Seconds(), 0.001)
	fmt.Fprintf(&b, " (%s/s) ", bytesStr(int64(rate)))
	return b.String()
}

// done removes the spinner; it is safe to call more than once.
func (pr *progress) done() {
	if pr == nil {
		return
	}
	pr.mu.Lock()
	pr.ended = true
	if pr.timer != nil {
		pr.timer.Stop()
	}
	p, bar := pr.p, pr.bar
	pr.p, pr.bar = nil, nil
	pr.mu.Unlock()
	if p == nil {
		return
	}
	bar.SetTotal(-1, true)
	p.Wait()
}

// sizedWriter is mpb's terminal writer for a terminal that reports no
// window size (a serial console, some CI and container ptys: 0x0): mpb would
// draw nothing in 0 rows, so it gets 80x24 instead.
type sizedWriter struct{ *cupwriter.Writer }

func (w sizedWriter) GetTermSize() (int, int, error) {
	width, height, err := w.Writer.GetTermSize()
	if err != nil || width <= 0 || height <= 0 {
		return 80, 24, nil
	}
	return width, height, nil
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
