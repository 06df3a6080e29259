package sched

import (
	"context"
	"errors"
	"fmt"
)

// Ticket follows one submitted upload to its end.
type Ticket struct {
	// Sandbox, Name and Size are the upload's.
	Sandbox string
	Name    string
	Size    int64

	done chan struct{}
	err  error // set before done is closed
}

func newTicket(u Upload) *Ticket {
	return &Ticket{Sandbox: u.Sandbox, Name: u.Name, Size: u.Size, done: make(chan struct{})}
}

func (t *Ticket) finish(err error) {
	t.err = err
	close(t.done)
}

// Done is closed when the upload has finished, stored or failed.
func (t *Ticket) Done() <-chan struct{} { return t.done }

// Err is nil once the object is stored: the Store's Put returned nil, so
// it is durable there. Before Done is closed it is nil too.
func (t *Ticket) Err() error {
	select {
	case <-t.done:
		return t.err
	default:
		return nil
	}
}

// Wait blocks until the upload has finished and returns its error, or
// until ctx ends. Ending the wait does not cancel the upload.
func (t *Ticket) Wait(ctx context.Context) error {
	select {
	case <-t.done:
		return t.err
	case <-ctx.Done():
		return fmt.Errorf("waiting for upload %s of sandbox %s: %w", t.Name, t.Sandbox, ctx.Err())
	}
}

// Wait blocks until every ticket's upload has finished, such as all objects
// of one checkpoint, and returns their errors joined; or until ctx ends.
func Wait(ctx context.Context, tickets ...*Ticket) error {
	var errs []error
	for _, t := range tickets {
		if err := t.Wait(ctx); err != nil {
			if ctx.Err() != nil {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
