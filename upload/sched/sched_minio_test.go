package sched_test

// The scheduler in front of the S3 store on a real MinIO server on
// 127.0.0.1 (internal/miniotest).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/turnsnap/turnsnap/internal/miniotest"
	"github.com/turnsnap/turnsnap/upload"
	"github.com/turnsnap/turnsnap/upload/sched"
)

// TestHeavyAndLightOnMinIO: one sandbox queues ~200 MB in 4 MiB objects;
// a second later, while it is uploading, thirty sandboxes queue three small
// objects each; all go through one scheduler capped at 16 MiB/s. Every
// light sandbox must be remotely durable long before the heavy one (in
// FIFO order they would wait for the heavy queue, about 11 s), and the
// measured rate must stay within 10% of the cap.
func TestHeavyAndLightOnMinIO(t *testing.T) {
	const (
		capBps      = 16 << 20
		heavyN      = 48 // x 4 MiB = 192 MiB = 201 MB: 12 s at the cap
		heavySize   = 4 << 20
		lights      = 30
		lightN      = 3
		concurrency = 4
	)
	srv := miniotest.Start(t)
	s3, err := upload.NewS3(t.Context(), upload.S3Config{
		Endpoint: srv.Endpoint, Bucket: "sched-test", Insecure: true, Region: "us-east-1",
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, CreateBucket: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := newSched(t, sched.Config{Store: upload.WithRetry(s3, upload.RetryPolicy{}), Concurrency: concurrency, BytesPerSec: capBps})

	rng := rand.New(rand.NewPCG(1, 2))
	heavy := make([]byte, heavySize)
	for i := range heavy {
		heavy[i] = byte(rng.Uint32())
	}

	var (
		mu       sync.Mutex
		finished = map[string]time.Duration{} // sandbox -> from its submission to its last upload's end
		total    int64
		wg       sync.WaitGroup
	)
	start := time.Now()
	track := func(sandbox string, tickets []*sched.Ticket) {
		submitted := time.Now()
		wg.Go(func() {
			if err := sched.Wait(context.Background(), tickets...); err != nil {
				t.Errorf("sandbox %s: %v", sandbox, err)
			}
			mu.Lock()
			finished[sandbox] = time.Since(submitted)
			mu.Unlock()
		})
	}
	var tickets []*sched.Ticket
	for i := range heavyN {
		tickets = append(tickets, submit(t, s, upl("heavy", fmt.Sprintf("heavy/%02d", i), heavy)))
		total += heavySize
	}
	track("heavy", tickets)
	time.Sleep(time.Second)
	for l := range lights {
		sb := fmt.Sprintf("light%02d", l)
		var tks []*sched.Ticket
		for j := range lightN {
			data := make([]byte, 16<<10+rng.IntN(48<<10))
			tks = append(tks, submit(t, s, upl(sb, fmt.Sprintf("%s/%d", sb, j), data)))
			total += int64(len(data))
		}
		track(sb, tks)
	}

	// Sample the scheduler's own rate once it has run for a while.
	time.Sleep(6 * time.Second)
	mid := s.Stats()
	wg.Wait()
	elapsed := time.Since(start)

	var lightTimes []time.Duration
	for sb, d := range finished {
		if sb != "heavy" {
			lightTimes = append(lightTimes, d)
		}
	}
	slices.Sort(lightTimes)
	heavyDone := finished["heavy"]
	rate := float64(total) / elapsed.Seconds()
	t.Logf("heavy sandbox: %d MB in %d objects, remotely durable after %s", heavyN*heavySize/1_000_000, heavyN, heavyDone.Round(time.Millisecond))
	t.Logf("light sandboxes (%d x %d objects, queued 1 s later): durable after first %s, median %s, last %s",
		lights, lightN, lightTimes[0].Round(time.Millisecond), lightTimes[len(lightTimes)/2].Round(time.Millisecond),
		lightTimes[len(lightTimes)-1].Round(time.Millisecond))
	t.Logf("throughput: %.2f MiB/s overall (%d bytes in %s), %.2f MiB/s by Stats at 7 s; cap %d MiB/s",
		rate/(1<<20), total, elapsed.Round(time.Millisecond), mid.BytesPerSec/(1<<20), capBps>>20)

	if len(lightTimes) != lights {
		t.Fatalf("%d light sandboxes finished, want %d", len(lightTimes), lights)
	}
	if last := lightTimes[len(lightTimes)-1]; last >= heavyDone/4 {
		t.Errorf("the last light sandbox finished after %s, not well before the heavy one (%s)", last, heavyDone)
	}
	for name, r := range map[string]float64{"overall": rate, "Stats().BytesPerSec": mid.BytesPerSec} {
		if r < capBps*0.9 || r > capBps*1.1 {
			t.Errorf("%s rate %.2f MiB/s is not within 10%% of the %d MiB/s cap", name, r/(1<<20), capBps>>20)
		}
	}
}
