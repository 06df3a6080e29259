package sched

import "slices"

// requestCost is what every upload costs in the fair-share accounting on
// top of its bytes, so a sandbox sending thousands of empty or tiny objects
// pays for the requests too, not only for bytes it barely has.
const requestCost = 8 << 10

// drr is one lane of the queue: deficit round robin by bytes over the
// sandboxes that have uploads waiting. Each visit to a sandbox adds quantum
// to its deficit, and it may send uploads while their cost fits in the
// deficit; so over time every waiting sandbox gets the same number of bytes,
// whatever the size of its objects, and a sandbox with a few small objects
// is served within one round however much another has queued.
//
// It is not safe for concurrent use; the Scheduler's mutex guards it.
type drr struct {
	quantum int64
	flows   map[string]*flow
	ring    []*flow // the flows with uploads queued, in service order
	cur     int     // index in ring of the flow being served
	visited bool    // whether ring[cur] has had its quantum for this visit
	n       int     // uploads queued
}

// flow is one sandbox's queue in a lane.
type flow struct {
	sandbox string
	q       []*item
	deficit int64
}

func newDRR(quantum int64) *drr {
	return &drr{quantum: quantum, flows: map[string]*flow{}}
}

func cost(it *item) int64 { return it.u.Size + requestCost }

// push queues it at the back of its sandbox's flow.
func (d *drr) push(it *item) {
	f := d.flows[it.u.Sandbox]
	if f == nil {
		f = &flow{sandbox: it.u.Sandbox}
		d.flows[it.u.Sandbox] = f
	}
	if len(f.q) == 0 {
		// A flow joins the round behind the one being served, so it does
		// not cut in ahead of flows that have been waiting.
		d.ring = append(d.ring, f)
	}
	f.q = append(f.q, it)
	d.n++
}

// pop returns the next upload to send, or nil if the lane is empty.
func (d *drr) pop() *item {
	for len(d.ring) > 0 {
		f := d.ring[d.cur]
		if !d.visited {
			f.deficit += d.quantum
			d.visited = true
		}
		if it := f.q[0]; cost(it) <= f.deficit {
			f.deficit -= cost(it)
			f.q[0] = nil
			f.q = f.q[1:]
			d.n--
			if len(f.q) == 0 {
				d.dropFlow(d.cur)
			}
			return it
		}
		d.cur = (d.cur + 1) % len(d.ring)
		d.visited = false
	}
	return nil
}

// remove takes it out of the lane, if it is queued there, and reports
// whether it was.
func (d *drr) remove(it *item) bool {
	f := d.flows[it.u.Sandbox]
	if f == nil {
		return false
	}
	i := slices.Index(f.q, it)
	if i < 0 {
		return false
	}
	f.q = slices.Delete(f.q, i, i+1)
	d.n--
	if len(f.q) == 0 {
		d.dropFlow(slices.Index(d.ring, f))
	}
	return true
}

// take removes and returns every upload of sandbox, in order.
func (d *drr) take(sandbox string) []*item {
	f := d.flows[sandbox]
	if f == nil || len(f.q) == 0 {
		return nil
	}
	q := f.q
	f.q = nil
	d.n -= len(q)
	d.dropFlow(slices.Index(d.ring, f))
	return q
}

// dropFlow removes the empty flow at ring index i. An idle sandbox keeps no
// credit: a deficit saved while idle would let it burst past the others.
func (d *drr) dropFlow(i int) {
	f := d.ring[i]
	f.deficit = 0
	delete(d.flows, f.sandbox)
	d.ring = slices.Delete(d.ring, i, i+1)
	switch {
	case i < d.cur:
		d.cur--
	case i == d.cur:
		d.visited = false // the next flow slides into cur, unvisited
	}
	if d.cur >= len(d.ring) {
		d.cur = 0
	}
}
