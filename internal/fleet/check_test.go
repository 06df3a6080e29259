package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/turnsnap/turnsnap/api"
	"github.com/turnsnap/turnsnap/delta"
	"github.com/turnsnap/turnsnap/internal/fleethost"
	"github.com/turnsnap/turnsnap/internal/miniotest"
)

func syncReq() api.SyncRequest { return api.SyncRequest{} }

// report gathers the checker's findings by assertion, so that a failing
// run says which assertion failed and how often, not only the first case.
type report struct {
	t        *testing.T
	mu       sync.Mutex
	failures map[string][]string
	order    []string

	restoresChecked, lost, mismatched int
	heads, headsUnresolved            int
	twoWriters, lateWrites            int
	releasedUnreported                int
	staleLocks, locksLeft             int
}

func (r *report) fail(assertion, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failures == nil {
		r.failures = map[string][]string{}
	}
	if _, ok := r.failures[assertion]; !ok {
		r.order = append(r.order, assertion)
	}
	r.failures[assertion] = append(r.failures[assertion], fmt.Sprintf(format, args...))
}

// flush reports each failed assertion with its first cases.
func (r *report) flush() {
	r.t.Helper()
	for _, a := range r.order {
		cases := r.failures[a]
		shown := cases
		if len(shown) > 15 {
			shown = shown[:15]
		}
		r.t.Errorf("fleet assertion %q failed %d times:\n  %s", a, len(cases), strings.Join(shown, "\n  "))
	}
}

// lockWatch samples the bucket's locks/ while the fleet runs and keeps,
// per lock object, the oldest age it was seen at.
type lockWatch struct {
	mc   *minio.Client
	mu   sync.Mutex
	seen map[string]*lockSeen
}

type lockSeen struct {
	lock        delta.Lock
	window      time.Duration
	maxAge      time.Duration
	first, last time.Time
}

func newLockWatch(mc *minio.Client) *lockWatch {
	return &lockWatch{mc: mc, seen: map[string]*lockSeen{}}
}

func (lw *lockWatch) run(ctx context.Context, stop <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			lw.sample(ctx, now)
		}
	}
}

// sample lists the locks once (MinIO may be down: then nothing is seen)
// and returns the names present.
func (lw *lockWatch) sample(ctx context.Context, now time.Time) []string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var names []string
	for obj := range lw.mc.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: delta.LockPrefix, Recursive: true}) {
		if obj.Err != nil {
			return names
		}
		o, err := lw.mc.GetObject(ctx, bucket, obj.Key, minio.GetObjectOptions{})
		if err != nil {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(o, delta.MaxSmallObject))
		o.Close()
		if err != nil {
			continue // deleted since the listing
		}
		var l delta.Lock
		if json.Unmarshal(b, &l) != nil {
			continue
		}
		names = append(names, obj.Key)
		last := l.Refreshed
		if obj.LastModified.After(last) {
			last = obj.LastModified
		}
		window := time.Duration(l.StaleAfterNs)
		if window <= 0 {
			window = delta.DefaultLockStaleAfter
		}
		lw.mu.Lock()
		s := lw.seen[obj.Key]
		if s == nil {
			s = &lockSeen{first: now}
			lw.seen[obj.Key] = s
		}
		s.lock, s.window, s.last = l, window, now
		if age := now.Sub(last); age > s.maxAge {
			s.maxAge = age
		}
		lw.mu.Unlock()
	}
	return names
}

// checkLocks: no lock was seen older than its window (plus the sampler's
// slack), and none remains once every daemon has stopped.
func checkLocks(r *report, lw *lockWatch) {
	left := lw.sample(context.Background(), time.Now())
	lw.mu.Lock()
	defer lw.mu.Unlock()
	var keys []string
	for k := range lw.seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s := lw.seen[k]
		if s.maxAge > s.window+lockSlack {
			r.staleLocks++
			r.fail("(d) no lock outlived its interval", "%s (%s, %s pid %d, home %.8s) was seen %s after its last refresh, window %s (seen from %s to %s)",
				k, s.lock.Kind, s.lock.Host, s.lock.PID, s.lock.Home, s.maxAge.Round(time.Second), s.window,
				s.first.Format("15:04:05"), s.last.Format("15:04:05"))
		}
	}
	for _, k := range left {
		r.locksLeft++
		s := lw.seen[k]
		r.fail("(d) no lock remains", "%s (%s, home %.8s) is still in the bucket after every daemon stopped", k, s.lock.Kind, s.lock.Home)
	}
}

// checkHostHeads: every head each host's catalog holds resolves to a
// checkpoint that verifies there.
func checkHostHeads(ctx context.Context, r *report, hosts map[int]*host) {
	for i := 1; i <= nHosts; i++ {
		h := hosts[i]
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		sbs, err := h.C.ListSandboxes(lctx)
		cancel()
		if err != nil {
			r.fail("(b) every host's heads resolve", "%s: listing sandboxes: %v", h.Name, err)
			continue
		}
		for _, sb := range sbs {
			if sb.Head == nil {
				continue
			}
			r.heads++
			vctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			_, err := h.C.Verify(vctx, sb.Head.String())
			cancel()
			if err != nil {
				r.headsUnresolved++
				r.fail("(b) every host's heads resolve", "%s: sandbox %s's head %s: %v", h.Name, sb.Name, sb.Head.Short(), err)
			}
		}
	}
}

// headViolations checks one head's versions, oldest first: the epoch never
// goes down, and within an epoch one host wrote every version that
// writersOf can attribute (it returns the hosts that may have written a
// version, none when it cannot tell). It stops at the first of each.
func headViolations(vs []headVersion, writersOf func(headVersion) map[int]bool) []string {
	var out []string
	// writers[epoch] narrows to the hosts that could have written every
	// version of that epoch seen so far.
	writers := map[uint64]map[int]bool{}
	var lastEpoch uint64
	down, two := false, false
	for n, v := range vs {
		if v.owner.Epoch < lastEpoch && !down {
			out = append(out, fmt.Sprintf("head version %d (%s) has epoch %d after epoch %d", n, v.at.Format("15:04:05.000"), v.owner.Epoch, lastEpoch))
			down = true
		}
		lastEpoch = max(lastEpoch, v.owner.Epoch)
		cand := writersOf(v)
		if len(cand) == 0 {
			continue // a success this test never heard of (its answer was lost to a kill)
		}
		prev, ok := writers[v.owner.Epoch]
		if !ok {
			writers[v.owner.Epoch] = copySet(cand)
			continue
		}
		both := map[int]bool{}
		for h := range prev {
			if cand[h] {
				both[h] = true
			}
		}
		if len(both) == 0 {
			if !two {
				out = append(out, fmt.Sprintf("at epoch %d its head was written by %s and, at %s (%s), by %s",
					v.owner.Epoch, setString(prev), v.at.Format("15:04:05.000"), v.id.Short(), setString(cand)))
				two = true
			}
			continue
		}
		writers[v.owner.Epoch] = both
	}
	return out
}

// headVersion is one version of a head object in the bucket.
type headVersion struct {
	at    time.Time
	id    delta.ID
	owner delta.Owner
}

// checkWriters: for each sandbox key, the writers of its head's versions
// (the owner line's home, or for a head without one the hosts whose
// reported successes, begun before that version, could have written that
// checkpoint there) never
// differ at one epoch, and the epoch never goes down; and no write was
// accepted from a host that did not own the sandbox (the workload's own
// log against its adoptions).
func checkWriters(ctx context.Context, r *report, mc *minio.Client, w *world, homeIDs map[string]int) map[string]string {
	const a = "(c) no sandbox id ever had two accepted writers"
	names := map[string]string{} // key -> name
	for obj := range mc.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: delta.SandboxPrefix, Recursive: true, WithVersions: true}) {
		if obj.Err != nil {
			r.fail(a, "listing sandbox descriptions: %v", obj.Err)
			return names
		}
		if obj.IsDeleteMarker {
			continue
		}
		b, err := getVersion(ctx, mc, obj)
		if err != nil {
			r.fail(a, "reading %s: %v", obj.Key, err)
			continue
		}
		var sb delta.Sandbox
		if json.Unmarshal(b, &sb) == nil {
			names[strings.TrimPrefix(obj.Key, delta.SandboxPrefix)] = string(sb.Name)
		}
	}
	versions := map[string][]headVersion{}
	for obj := range mc.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: delta.HeadPrefix, Recursive: true, WithVersions: true}) {
		if obj.Err != nil {
			r.fail(a, "listing head versions: %v", obj.Err)
			return names
		}
		if obj.IsDeleteMarker {
			continue
		}
		b, err := getVersion(ctx, mc, obj)
		if err != nil {
			r.fail(a, "reading %s version %s: %v", obj.Key, obj.VersionID, err)
			continue
		}
		id, owner, err := delta.ParseHead(b)
		if err != nil {
			r.fail(a, "%s version %s: %v", obj.Key, obj.VersionID, err)
			continue
		}
		key := strings.TrimPrefix(obj.Key, delta.HeadPrefix)
		versions[key] = append(versions[key], headVersion{at: obj.LastModified, id: id, owner: owner})
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	keys := make([]string, 0, len(versions))
	for k := range versions {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		vs := versions[key]
		sort.SliceStable(vs, func(i, j int) bool { return vs[i].at.Before(vs[j].at) })
		name := names[key]
		problems := headViolations(vs, func(v headVersion) map[int]bool {
			if !v.owner.IsZero() {
				return map[int]bool{homeIDs[v.owner.Home]: true}
			}
			return w.writersOfLocked(name, v.id, v.at)
		})
		for _, p := range problems {
			r.fail(a, "sandbox %s (key %.8s): %s", name, key, p)
		}
		if len(problems) > 0 {
			r.twoWriters++
		}
	}
	keyOf := map[string]string{}
	for k, n := range names {
		keyOf[n] = k
	}
	inBucket := func(sandbox string, id delta.ID) bool {
		for _, v := range versions[keyOf[sandbox]] {
			if v.id == id {
				return true
			}
		}
		return false
	}
	for _, v := range w.writerViolationsLocked(inBucket) {
		r.lateWrites++
		r.fail(a, "%s", v)
	}
	// The head history of every sandbox another host wrote, for the log.
	for _, wr := range w.writes {
		if sb := w.sandboxes[wr.sandbox]; sb == nil || sb.creator == wr.host {
			continue
		}
		var b strings.Builder
		for n, v := range versions[keyOf[wr.sandbox]] {
			if n == 40 {
				b.WriteString(" ...")
				break
			}
			fmt.Fprintf(&b, " %s:%s[%s]", v.at.Format("05.000"), v.id.Short()[:6], setString(w.writersOfLocked(wr.sandbox, v.id, v.at)))
		}
		r.t.Logf("fleet: head versions of %s (%s wrote %s):%s", wr.sandbox, hostName(wr.host), wr.id.Short()[:6], b.String())
	}
	return names
}

// creatorOf is the host that made a sandbox (0 if this test never heard
// of it).
func creatorOf(w *world, name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if sb := w.sandboxes[name]; sb != nil {
		return sb.creator
	}
	return 0
}

func getVersion(ctx context.Context, mc *minio.Client, obj minio.ObjectInfo) ([]byte, error) {
	o, err := mc.GetObject(ctx, bucket, obj.Key, minio.GetObjectOptions{VersionID: obj.VersionID})
	if err != nil {
		return nil, err
	}
	defer o.Close()
	return io.ReadAll(io.LimitReader(o, delta.MaxSmallObject+1))
}

func copySet(s map[int]bool) map[int]bool {
	out := make(map[int]bool, len(s))
	for k, v := range s {
		out[k] = v
	}
	return out
}

func setString(s map[int]bool) string {
	var hs []string
	for h := range s {
		hs = append(hs, hostName(h))
	}
	sort.Strings(hs)
	return strings.Join(hs, "|")
}

// checkRestores: on a fresh host (its own namespace, an empty home) that
// knows only the bucket, every checkpoint a host reported remote-durable
// and no retention released branches, and its root has the digest the
// test took before the checkpoint; every head in the bucket verifies.
func checkRestores(ctx context.Context, r *report, h *host, fn *fleethost.Net, srv *miniotest.Server, mc *minio.Client, w *world, names map[string]string) {
	const a = "(a) every durable, unreleased checkpoint restores byte for byte on a fresh host"
	const b = "(b) every head in the bucket resolves on a fresh host"
	// The bucket's heads first, from the bucket itself: each must name a
	// record it holds (and before the fresh host uploads heads of its own
	// for the branches below).
	var heads []delta.ID
	for obj := range mc.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: delta.HeadPrefix, Recursive: true}) {
		if obj.Err != nil {
			r.fail(b, "listing heads: %v", obj.Err)
			break
		}
		r.heads++
		data, err := getVersion(ctx, mc, obj)
		if err != nil {
			r.headsUnresolved++
			r.fail(b, "reading %s: %v", obj.Key, err)
			continue
		}
		id, _, err := delta.ParseHead(data)
		if err != nil {
			r.headsUnresolved++
			r.fail(b, "%s: %v", obj.Key, err)
			continue
		}
		if _, err := mc.StatObject(ctx, bucket, delta.RecordName(id), minio.StatObjectOptions{}); err != nil {
			r.headsUnresolved++
			name := names[strings.TrimPrefix(obj.Key, delta.HeadPrefix)]
			why, _ := diagnoseRecord(ctx, mc, w, &ckptInfo{id: id, sandbox: name, host: creatorOf(w, name)})
			r.fail(b, "%s (sandbox %s) names checkpoint %s: %v; %s", obj.Key, name, id.Short(), err, why)
			continue
		}
		heads = append(heads, id)
	}

	if err := initHome(ctx, h, fn, srv); err != nil {
		r.fail(a, "fresh host: %v", err)
		return
	}
	if err := h.Start(ctx); err != nil {
		r.fail(a, "fresh host: %v", err)
		return
	}
	defer h.Stop()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	rb, err := h.C.RebuildCatalog(rctx, api.RebuildRequest{})
	cancel()
	if err != nil {
		// A failure of its own; then the checks go on from what a rebuild
		// that skips the damage finds.
		r.fail(a, "fresh host: catalog rebuild: %v", err)
		rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		rb, err = h.C.RebuildCatalog(rctx, api.RebuildRequest{SkipCorrupt: true})
		cancel()
		if err != nil {
			r.fail(a, "fresh host: catalog rebuild --skip-corrupt: %v; no restore checked", err)
			return
		}
	}
	r.t.Logf("fleet: fresh host rebuilt %d sandboxes, %d checkpoints, %d packs from the bucket", rb.Sandboxes, rb.Checkpoints, rb.Packs)
	for _, id := range heads {
		vctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		_, err := h.C.Verify(vctx, id.String())
		cancel()
		if err != nil {
			r.headsUnresolved++
			r.fail(b, "head checkpoint %s does not verify on the fresh host: %v", id.Short(), err)
		}
	}
	checkUntil := time.Now().Add(15 * time.Minute)
	for n, c := range w.durableOf(func(*ckptInfo) bool { return true }) {
		if time.Now().After(checkUntil) {
			r.fail(a, "the fresh host's restores took over 15 minutes; %d checked, the rest not", r.restoresChecked)
			break
		}
		r.restoresChecked++
		name := fmt.Sprintf("check-%d", n)
		bctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		rs, err := h.C.Branch(bctx, c.id.String(), api.BranchRequest{Name: name})
		cancel()
		if err != nil {
			why, released := diagnoseRecord(ctx, mc, w, c)
			if released {
				r.releasedUnreported++
				r.t.Logf("fleet: checkpoint %s of %s (%s) is gone, released by a retention whose answer was lost: %s", c.id.Short(), c.sandbox, hostName(c.host), why)
				continue
			}
			r.lost++
			r.fail(a, "checkpoint %s of %s (%s, remote-durable %s): %v; %s", c.id.Short(), c.sandbox, hostName(c.host), c.at.Format("15:04:05.000"), err, why)
			continue
		}
		if len(rs) != 1 {
			r.fail(a, "checkpoint %s: branch answered %d sandboxes", c.id.Short(), len(rs))
			continue
		}
		d, err := treeDigest(rs[0].Root)
		if err != nil || d != c.digest {
			r.mismatched++
			r.fail(a, "checkpoint %s of %s (%s): the branch's root differs from the root checkpointed (%v)", c.id.Short(), c.sandbox, hostName(c.host), err)
		}
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		if _, err := h.C.RemoveSandbox(dctx, name, false); err != nil {
			r.t.Logf("fleet: removing %s on the fresh host: %v", name, err)
		}
		cancel()
	}
}

// diagnoseRecord says what became of a checkpoint the fresh host cannot
// find, from the versions of its record in the bucket. It also says
// whether a prune or forget of its sandbox's home that failed (so its
// report never came) released it: one begun before the record was
// deleted, when the test had already seen at least its keep-last newer
// checkpoints of that sandbox.
func diagnoseRecord(ctx context.Context, mc *minio.Client, w *world, c *ckptInfo) (string, bool) {
	key := delta.RecordName(c.id)
	var present, deleted []time.Time
	for obj := range mc.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: key, WithVersions: true}) {
		if obj.Err != nil {
			return "listing its record's versions: " + obj.Err.Error(), false
		}
		if obj.Key != key {
			continue
		}
		if obj.IsDeleteMarker {
			deleted = append(deleted, obj.LastModified)
		} else {
			present = append(present, obj.LastModified)
		}
	}
	switch {
	case len(present) == 0:
		return "its record never reached the bucket", false
	case len(deleted) == 0:
		return "its record is in the bucket (the rebuild did not index it)", false
	}
	at := deleted[0]
	for _, d := range deleted {
		if d.Before(at) {
			at = d
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	owner := c.host
	if sb := w.sandboxes[c.sandbox]; sb != nil {
		owner = sb.creator
	}
	var answered []string
	last := ""
	for _, rs := range w.retentions {
		if rs.host != owner || rs.start.After(at) {
			continue
		}
		newer := 0
		for _, o := range w.ckpts {
			if o.sandbox == c.sandbox && o.at.After(c.at) && o.at.Before(rs.start) {
				newer++
			}
		}
		if newer < rs.keep {
			last = fmt.Sprintf(" (the last before it: %s --keep-last %d at %s, when the test knew %d newer checkpoints of %s; error %v)",
				rs.op, rs.keep, rs.start.Format("15:04:05.000"), newer, c.sandbox, rs.err)
			continue
		}
		if rs.err != nil {
			return fmt.Sprintf("its record was deleted from the bucket at %s, after %s's %s --keep-last %d of %s failed (%v)",
				at.Format("15:04:05.000"), hostName(owner), rs.op, rs.keep, rs.start.Format("15:04:05.000"), rs.err), true
		}
		answered = append(answered, fmt.Sprintf("%s at %s", rs.op, rs.start.Format("15:04:05.000")))
	}
	if len(answered) == 0 {
		return fmt.Sprintf("its record was deleted from the bucket at %s; no prune or forget of %s before that would have released it%s", at.Format("15:04:05.000"), hostName(owner), last), false
	}
	return fmt.Sprintf("its record was deleted from the bucket at %s; %s's retentions that could have released it answered without it: %s",
		at.Format("15:04:05.000"), hostName(owner), strings.Join(answered, ", ")), false
}
