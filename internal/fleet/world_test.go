package fleet

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/turnsnap/turnsnap/delta"
)

// world is what the workload learnt from the hosts' answers: only reported
// successes count. Every field is guarded by mu.
type world struct {
	mu sync.Mutex
	// sandboxes by name; names are unique across the fleet (hN-sM, hN-bM),
	// so a name means one sandbox on every host that rebuilt it.
	sandboxes map[string]*sandboxInfo
	// writable[h] are the sandboxes host h believes it may write: those it
	// created or branched, and those it adopted.
	writable map[int]map[string]bool
	ckpts    map[delta.ID]*ckptInfo
	// released are the checkpoints some retention (prune, forget) reported
	// deleting: they may vanish.
	released map[delta.ID]bool
	// heads[sandbox][id][h] is when host h began the first operation
	// whose reported success may have written a head of that sandbox
	// naming id (checkpoint, rollback, create, branch): how a head version
	// without an owner line is attributed to its writer (a host whose
	// operation began after the version was written cannot have written
	// it).
	heads map[string]map[delta.ID]map[int]time.Time
	// writes are accepted writes (a checkpoint reported remote-durable),
	// adopts the reported adoptions, both with their time spans.
	writes, adopts []span
	ops            map[string]*opCount
	problems       []string // inconsistencies seen during the run (rollback or branch roots)
	daemonKills    int
	minioKills     int
	skipped        map[string]int // ops the binary cannot do yet (capability probes)
	retentions     []retentionSpan
	reasons        map[string]int // failed operations by normalised error
	steps          int            // operations the workload started
	logf           func(format string, args ...any)
}

type sandboxInfo struct {
	name    string
	creator int
}

type ckptInfo struct {
	id      delta.ID
	host    int
	sandbox string
	digest  string
	durable bool
	at      time.Time
}

type span struct {
	sandbox    string
	host       int
	id         delta.ID // the checkpoint (writes)
	start, end time.Time
}

type opCount struct{ ok, failed int }

// retentionSpan is one prune or forget, answered (err nil) or not.
type retentionSpan struct {
	host       int
	op         string
	keep       int // --keep-last
	start, end time.Time
	err        error
}

func newWorld() *world {
	return &world{sandboxes: map[string]*sandboxInfo{}, writable: map[int]map[string]bool{},
		ckpts: map[delta.ID]*ckptInfo{}, released: map[delta.ID]bool{}, heads: map[string]map[delta.ID]map[int]time.Time{},
		ops: map[string]*opCount{}, skipped: map[string]int{}, reasons: map[string]int{}}
}

func (w *world) count(op string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if w.logf != nil {
			w.logf("%s failed: %v", op, err)
		}
		w.reasons[op+": "+normalise(err.Error())]++
	}
	c := w.ops[op]
	if c == nil {
		c = &opCount{}
		w.ops[op] = c
	}
	if err != nil {
		c.failed++
	} else {
		c.ok++
	}
}

func (w *world) problem(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.problems = append(w.problems, fmt.Sprintf(format, args...))
}

// addSandbox records a sandbox host h made (created or branched) with an
// operation begun at start.
func (w *world) addSandbox(name string, h int, head delta.ID, start time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sandboxes[name] = &sandboxInfo{name: name, creator: h}
	if w.writable[h] == nil {
		w.writable[h] = map[string]bool{}
	}
	w.writable[h][name] = true
	w.headLocked(name, head, h, start)
}

func (w *world) headLocked(sandbox string, id delta.ID, h int, start time.Time) {
	if id.IsZero() {
		return
	}
	if w.heads[sandbox] == nil {
		w.heads[sandbox] = map[delta.ID]map[int]time.Time{}
	}
	if w.heads[sandbox][id] == nil {
		w.heads[sandbox][id] = map[int]time.Time{}
	}
	if t, ok := w.heads[sandbox][id][h]; !ok || start.Before(t) {
		w.heads[sandbox][id][h] = start
	}
}

func (w *world) head(sandbox string, id delta.ID, h int, start time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.headLocked(sandbox, id, h, start)
}

// writersOf are the hosts that may have written the head version of
// sandbox naming id at time at.
func (w *world) writersOfLocked(sandbox string, id delta.ID, at time.Time) map[int]bool {
	out := map[int]bool{}
	for h, start := range w.heads[sandbox][id] {
		if !start.After(at) {
			out[h] = true
		}
	}
	return out
}

// checkpointed records a checkpoint host h reported, with the digest of
// the root it was taken of.
func (w *world) checkpointed(h int, sandbox string, id delta.ID, digest string, durable bool, start, end time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.headLocked(sandbox, id, h, start)
	c := w.ckpts[id]
	isNew := c == nil
	if isNew {
		c = &ckptInfo{id: id, host: h, sandbox: sandbox, digest: digest, at: end}
		w.ckpts[id] = c
	} else if c.digest != digest {
		// A skip turn answers with the head it did not move: the root must
		// be what that checkpoint recorded.
		w.problems = append(w.problems, fmt.Sprintf("%s: checkpoint of %s answered %s, whose recorded root digest differs from the root's now",
			hostName(h), sandbox, id.Short()))
	}
	if durable {
		c.durable = true
		// A skip turn answers with the head it did not move: it wrote
		// nothing, so it is no write for the one-writer check (a host
		// that does not know yet that its sandbox was adopted still
		// skips on the head it pushed before).
		if isNew {
			w.writes = append(w.writes, span{sandbox: sandbox, host: h, id: id, start: start, end: end})
		}
	}
}

func (w *world) release(ids ...delta.ID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		w.released[id] = true
	}
}

func (w *world) adopted(h int, sandbox string, start, end time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.writable[h] == nil {
		w.writable[h] = map[string]bool{}
	}
	w.writable[h][sandbox] = true
	w.adopts = append(w.adopts, span{sandbox: sandbox, host: h, start: start, end: end})
}

// durableOf lists the remote-durable, unreleased checkpoints matching f.
func (w *world) durableOf(f func(*ckptInfo) bool) []*ckptInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*ckptInfo
	for _, c := range w.ckpts {
		if c.durable && !w.released[c.id] && f(c) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// knownOf lists the unreleased checkpoints of a sandbox that this test saw
// reported, durable or not.
func (w *world) knownOf(sandbox string) []*ckptInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*ckptInfo
	for _, c := range w.ckpts {
		if c.sandbox == sandbox && !w.released[c.id] {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

func (w *world) writableOf(h int) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for n := range w.writable[h] {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// foreignOf lists sandboxes host h may not write, with a durable checkpoint.
func (w *world) foreignOf(h int) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	has := map[string]bool{}
	for _, c := range w.ckpts {
		if c.durable && !w.released[c.id] {
			has[c.sandbox] = true
		}
	}
	var out []string
	for n := range w.sandboxes {
		if !w.writable[h][n] && has[n] {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func (w *world) opsSummary() (total, ok int, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var names []string
	for n := range w.ops {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		c := w.ops[n]
		total += c.ok + c.failed
		ok += c.ok
		fmt.Fprintf(&b, " %s=%d/%d", n, c.ok, c.ok+c.failed)
	}
	return total, ok, b.String()
}

// writerViolationsLocked checks the accepted writes against the adoptions: a
// write accepted for host h is legitimate only if h could have owned the
// sandbox at some instant of the write: it was the owner when the write
// started (the creator, or the last adopter before), or an adoption by h
// overlapped the write. w.mu is held.
func (w *world) writerViolationsLocked(inBucket func(sandbox string, id delta.ID) bool) []string {
	var out []string
	for _, wr := range w.writes {
		sb := w.sandboxes[wr.sandbox]
		if sb == nil {
			continue
		}
		owner, ownerEnd := sb.creator, time.Time{}
		possible := map[int]bool{}
		for _, a := range w.adopts {
			if a.sandbox != wr.sandbox {
				continue
			}
			if a.end.Before(wr.start) && a.end.After(ownerEnd) {
				owner, ownerEnd = a.host, a.end
			}
			if !a.start.After(wr.end) && !a.end.Before(wr.start) {
				possible[a.host] = true
			}
		}
		possible[owner] = true
		if !possible[wr.host] {
			where := "no head version in the bucket names it"
			if inBucket(wr.sandbox, wr.id) {
				where = "a head version in the bucket names it"
			}
			out = append(out, fmt.Sprintf("sandbox %s: %s's checkpoint %s was reported remote-durable (%s) while %s owned it and %s had not adopted it (%s)",
				wr.sandbox, hostName(wr.host), wr.id.Short(), wr.end.Format("15:04:05.000"), hostName(owner), hostName(wr.host), where))
		}
	}
	return out
}

func hostName(i int) string { return fmt.Sprintf("h%d", i) }

var (
	normHex  = regexp.MustCompile(`[0-9a-f]{12,64}`)
	normPath = regexp.MustCompile(`/tmp/[^ :"]*`)
	normName = regexp.MustCompile(`\bh[0-9]-[sb][0-9]+\b`)
	normNum  = regexp.MustCompile(`\b[0-9]+(\.[0-9]+)?(ms|s)?\b`)
)

// normalise makes failures that differ only in ids, paths, sandbox names
// and numbers count as one reason.
func normalise(s string) string {
	s = normPath.ReplaceAllString(s, "PATH")
	s = normHex.ReplaceAllString(s, "ID")
	s = normName.ReplaceAllString(s, "SANDBOX")
	s = normNum.ReplaceAllString(s, "N")
	if len(s) > 220 {
		s = s[:220] + "..."
	}
	return s
}

// topReasons lists the commonest failures, most frequent first.
func (w *world) topReasons(n int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range w.reasons {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v || (all[i].v == all[j].v && all[i].k < all[j].k) })
	var b strings.Builder
	for i, e := range all {
		if i == n {
			break
		}
		fmt.Fprintf(&b, "\n  %5d  %s", e.v, e.k)
	}
	return b.String()
}
