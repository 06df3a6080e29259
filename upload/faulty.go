package upload

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

// Op names a Store operation, for fault plans and call counts.
type Op string

// The operations of a Store.
const (
	OpPut    Op = "Put"
	OpGet    Op = "Get" // GetRange counts as a Get
	OpStat   Op = "Stat"
	OpList   Op = "List"
	OpDelete Op = "Delete"
)

// FaultPlan says which calls of a Faulty store fail. Call numbers count
// from 1 per operation, failed calls included. The zero plan injects nothing.
type FaultPlan struct {
	// Fail lists, per operation, the calls that fail with an error wrapping
	// errdefs.ErrUnavailable before reaching the inner store, as a refused
	// connection would.
	Fail map[Op][]int
	// HalfPut lists the Put calls (numbered with the other Puts) that hand
	// the inner store a reader failing with an error wrapping
	// errdefs.ErrUnavailable after half the object's bytes, as a connection
	// dropped mid-upload would. The inner store must then show no object,
	// or still the old one.
	HalfPut []int
}

// Faulty wraps a Store and injects the failures of its FaultPlan, so tests
// can show that callers surface store errors and that no failure leaves a
// partial object. It is safe for concurrent use.
type Faulty struct {
	inner Store
	plan  FaultPlan

	mu    sync.Mutex
	calls map[Op]int
}

// NewFaulty returns inner wrapped to fail as plan says. It copies plan, so
// the caller may change it afterwards without effect.
func NewFaulty(inner Store, plan FaultPlan) *Faulty {
	p := FaultPlan{Fail: map[Op][]int{}, HalfPut: slices.Clone(plan.HalfPut)}
	for op, ns := range plan.Fail {
		p.Fail[op] = slices.Clone(ns)
	}
	return &Faulty{inner: inner, plan: p, calls: map[Op]int{}}
}

// Calls returns how many times op has been called, failed calls included.
func (f *Faulty) Calls(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// AllCalls returns a copy of every operation's call count.
func (f *Faulty) AllCalls() map[Op]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.calls)
}

// call counts a call of op on what ("object x", `list "x"`) and returns
// its number and the injected error, if the plan fails this call outright.
func (f *Faulty) call(op Op, what string) (int, error) {
	f.mu.Lock()
	f.calls[op]++
	n := f.calls[op]
	f.mu.Unlock()
	if slices.Contains(f.plan.Fail[op], n) {
		return n, injected(op, n, what)
	}
	return n, nil
}

func injected(op Op, n int, what string) error {
	return fmt.Errorf("%s: injected fault on %s call %d: %w", what, op, n, errdefs.ErrUnavailable)
}

func (f *Faulty) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	n, err := f.call(OpPut, "object "+name)
	if err != nil {
		return err
	}
	if slices.Contains(f.plan.HalfPut, n) {
		r = io.MultiReader(io.LimitReader(r, size/2), errReader{injected(OpPut, n, "object "+name)})
	}
	return f.inner.Put(ctx, name, r, size)
}

func (f *Faulty) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	if _, err := f.call(OpGet, "object "+name); err != nil {
		return nil, err
	}
	return f.inner.Get(ctx, name)
}

// GetRange keeps the inner store's fast path, so code under test reads the
// way it would without the wrapper.
func (f *Faulty) GetRange(ctx context.Context, name string, offset, length int64) (io.ReadCloser, error) {
	if _, err := f.call(OpGet, "object "+name); err != nil {
		return nil, err
	}
	return GetRange(ctx, f.inner, name, offset, length)
}

func (f *Faulty) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	if _, err := f.call(OpStat, "object "+name); err != nil {
		return ObjectInfo{}, err
	}
	return f.inner.Stat(ctx, name)
}

func (f *Faulty) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	if _, err := f.call(OpList, fmt.Sprintf("list %q", prefix)); err != nil {
		return err
	}
	return f.inner.List(ctx, prefix, fn)
}

func (f *Faulty) Delete(ctx context.Context, name string) error {
	if _, err := f.call(OpDelete, "object "+name); err != nil {
		return err
	}
	return f.inner.Delete(ctx, name)
}

// errReader fails every Read with its error.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
