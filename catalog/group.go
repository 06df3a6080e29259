package catalog

import (
	"context"
	"sync"
)

// Group commits concurrent Updates together (group commit): the callers
// that arrive while a transaction of the group is being written are put
// into the next one, in arrival order, so N concurrent commits cost one
// Badger write and one fsync instead of N in a row. Each caller's fn sees
// the writes of those before it in the same transaction, as if they had
// run one after the other, and returns once the transaction holding its
// writes is durable. A transaction is all or nothing, so a crash leaves
// either every commit of a group or none of it.
//
// When the shared transaction fails (one fn's error, a conflict that
// outlasted the retries, a transaction too big), each fn of the group is
// run again in a transaction of its own, so every caller gets its own
// answer and one caller's error never fails another. As with Update, fn
// must have no effects outside tx, or ones that are safe to repeat.
//
// The zero Group is ready to use. Hold, if set, is held while a group's
// transaction runs: the lock other writers of the same keys take.
// Shared, if set, is called in a transaction shared by n > 1 callers after
// every fn ran and before it commits (a test's point to kill the process
// with a group's writes in flight).
type Group struct {
	Hold   sync.Locker
	Shared func(n int)

	mu      sync.Mutex
	queue   []*groupCall
	leading bool // someone is running the group's transactions
}

type groupCall struct {
	ctx  context.Context
	fn   func(tx *Tx) error
	err  error
	done chan struct{} // closed when err is final
	lead chan struct{} // closed when this caller is to run the next transaction
}

// maxGroup bounds how many callers share one transaction, far below what
// would make it too big for callers that each write a few dozen keys.
const maxGroup = 32

// Update runs fn in a transaction of the catalog c shared with the
// group's concurrent callers, and commits it durably.
func (g *Group) Update(ctx context.Context, c *Catalog, fn func(tx *Tx) error) error {
	call := &groupCall{ctx: ctx, fn: fn, done: make(chan struct{}), lead: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, call)
	if g.leading {
		g.mu.Unlock()
		select {
		case <-call.done:
			return call.err
		case <-call.lead:
		}
	} else {
		g.leading = true
		g.mu.Unlock()
	}
	// This caller leads: it runs transactions for whoever is queued until
	// its own is done, then hands the lead to the first caller still
	// waiting (so no caller serves the others for ever).
	for !closedChan(call.done) {
		g.mu.Lock()
		n := min(len(g.queue), maxGroup)
		batch := append([]*groupCall(nil), g.queue[:n]...)
		g.queue = g.queue[n:]
		g.mu.Unlock()
		g.run(c, batch)
	}
	g.mu.Lock()
	if len(g.queue) > 0 {
		close(g.queue[0].lead)
	} else {
		g.leading = false
	}
	g.mu.Unlock()
	return call.err
}

// run commits one group's transaction.
func (g *Group) run(c *Catalog, batch []*groupCall) {
	if g.Hold != nil {
		g.Hold.Lock()
		defer g.Hold.Unlock()
	}
	live := make([]*groupCall, 0, len(batch))
	for _, call := range batch {
		if err := call.ctx.Err(); err != nil {
			call.err = err // gave up before its turn: nothing written
			close(call.done)
			continue
		}
		live = append(live, call)
	}
	switch {
	case len(live) == 1:
		live[0].err = c.Update(live[0].ctx, live[0].fn)
	case len(live) > 1:
		// The shared transaction is not cancelled by one caller's
		// context: the others' writes are in it too.
		err := c.Update(context.WithoutCancel(live[0].ctx), func(tx *Tx) error {
			for _, call := range live {
				tx.ctx = call.ctx
				if err := call.fn(tx); err != nil {
					return err
				}
			}
			if g.Shared != nil {
				g.Shared(len(live))
			}
			return nil
		})
		if err != nil {
			for _, call := range live {
				call.err = c.Update(call.ctx, call.fn)
			}
		}
	}
	for _, call := range live {
		close(call.done)
	}
}

func closedChan(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
