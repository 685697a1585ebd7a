package transfer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvpool/kvpool/api"
)

// Faulty wraps a Transport to inject faults, for tests: corrupt bytes that
// arrive, stall batches, or run a hook before each submission. Set
// BeforeSubmit before the first Submit; Corrupt and Stall may be switched
// at any time (a test cannot rely on a network round trip to order its
// writes after the node's reads: the race detector sees no edge through
// a socket). Close it instead of the wrapped Transport: it closes that
// too.
type Faulty struct {
	Transport
	// Corrupt picks the completed read ops that get one byte of what
	// arrived flipped; unset, it picks none.
	Corrupt FaultPicker
	// Stall, while on, makes every batch submitted hang, like a link that
	// stopped moving, until its context ends (the ops fail with its
	// error), the Faulty is closed (ErrClosed) or Stall is switched off
	// (the ops then go to the wrapped Transport).
	Stall FaultSwitch
	// BeforeSubmit runs before each submission (kill a peer, say).
	BeforeSubmit func(ops []Op)

	mu struct {
		sync.Mutex
		closed  bool
		closing chan struct{} // closed by Close; made on first use
	}
	// wg counts the goroutines Submit starts. INVARIANT: they are added
	// under mu while !mu.closed, so Close waits for every one.
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

var _ NamedReader = (*Faulty)(nil)

// RTT implements RTTReporter when the wrapped Transport does.
func (f *Faulty) RTT(peer string) (time.Duration, bool) {
	if r, ok := f.Transport.(RTTReporter); ok {
		return r.RTT(peer)
	}
	return 0, false
}

// ReadsByName implements NamedReader when the wrapped Transport does.
func (f *Faulty) ReadsByName() bool {
	r, ok := f.Transport.(NamedReader)
	return ok && r.ReadsByName()
}

// FaultPicker picks the ops a fault hits. The zero value picks none. Safe
// for concurrent use.
type FaultPicker struct {
	pick atomic.Pointer[func(Op) bool]
}

// Store sets the function that picks ops; nil picks none.
func (p *FaultPicker) Store(pick func(op Op) bool) {
	if pick == nil {
		p.pick.Store(nil)
		return
	}
	p.pick.Store(&pick)
}

// load returns the picking function, or nil when none is set.
func (p *FaultPicker) load() func(Op) bool {
	if f := p.pick.Load(); f != nil {
		return *f
	}
	return nil
}

// FaultSwitch is a fault that is on or off. The zero value is off. Safe for
// concurrent use.
type FaultSwitch struct {
	mu  sync.Mutex
	on  bool
	off chan struct{} // while on: closed when it goes off
}

// Store switches the fault on or off.
func (s *FaultSwitch) Store(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on == s.on {
		return
	}
	s.on = on
	if on {
		s.off = make(chan struct{})
	} else {
		close(s.off)
		s.off = nil
	}
}

// Load reports whether the fault is on.
func (s *FaultSwitch) Load() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.on
}

// state reports whether the fault is on and, if so, a channel closed when
// it goes off.
func (s *FaultSwitch) state() (bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.on, s.off
}

// Submit implements Transport with the configured faults.
func (f *Faulty) Submit(ctx context.Context, ops []Op) *Batch {
	if f.BeforeSubmit != nil {
		f.BeforeSubmit(ops)
	}
	stalled, resumed := f.Stall.state()
	corrupt := f.Corrupt.load()
	if !stalled && corrupt == nil {
		return f.Transport.Submit(ctx, ops)
	}
	var inner *Batch
	if !stalled {
		inner = f.Transport.Submit(ctx, ops)
	}
	out := NewBatch(len(ops))
	f.mu.Lock()
	if f.mu.closed {
		f.mu.Unlock()
		if inner != nil {
			return inner // failed or failing with ErrClosed: nothing to corrupt
		}
		for i := range ops {
			out.Complete(i, 0, ErrClosed)
		}
		return out
	}
	closing := f.closingLocked()
	f.wg.Go(func() {
		if stalled {
			select {
			case <-ctx.Done():
				for i := range ops {
					out.Complete(i, 0, ctx.Err())
				}
				return
			case <-closing:
				for i := range ops {
					out.Complete(i, 0, ErrClosed)
				}
				return
			case <-resumed:
				inner = f.Transport.Submit(ctx, ops)
			}
		}
		f.finish(ops, inner, out, corrupt)
	})
	f.mu.Unlock()
	return out
}

// finish waits for inner, ops on the wrapped Transport, and completes out
// with what they did, corrupting the reads that corrupt (if not nil)
// picks.
func (f *Faulty) finish(ops []Op, inner, out *Batch, corrupt func(Op) bool) {
	<-inner.Done()
	for i, op := range ops {
		err := inner.OpErr(i)
		crc := inner.OpCRC(i)
		if err == nil && op.Kind == Read && len(op.Local) > 0 && corrupt != nil && corrupt(op) {
			// As if the wire damaged it: the receiver's checksum sees
			// the damaged bytes.
			op.Local[len(op.Local)/2] ^= 0x5a
			if op.Checksum {
				crc = api.Checksum(op.Local)
			}
		}
		n := uint64(0)
		if err == nil {
			n = uint64(len(op.Local))
		}
		out.CompleteNamed(i, n, crc, inner.OpPeerCRC(i), err)
	}
}

// closingLocked returns the channel Close closes.
//
// REQUIRES: f.mu.
func (f *Faulty) closingLocked() chan struct{} {
	if f.mu.closing == nil {
		f.mu.closing = make(chan struct{})
	}
	return f.mu.closing
}

// Close fails every stalled batch with ErrClosed, closes the wrapped
// Transport (which fails the batches it holds) and waits for every
// goroutine Submit started. It returns the wrapped Transport's error, and
// the same again if called more than once.
func (f *Faulty) Close() error {
	f.mu.Lock()
	if !f.mu.closed {
		f.mu.closed = true
		close(f.closingLocked())
	}
	f.mu.Unlock()
	f.closeOnce.Do(func() { f.closeErr = f.Transport.Close() })
	f.wg.Wait()
	return f.closeErr
}
