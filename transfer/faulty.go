package transfer

import (
	"context"
	"sync/atomic"

	"github.com/kvpool/kvpool/api"
)

// Faulty wraps a Transport to inject faults, for tests: corrupt bytes that
// arrive, stall batches, or run a hook before each submission.
type Faulty struct {
	Transport
	// Corrupt, when it returns true for a completed read op, flips one
	// byte of what arrived.
	Corrupt func(op Op) bool
	// Stall makes every batch hang until its context ends, like a link
	// that stopped moving.
	Stall atomic.Bool
	// BeforeSubmit runs before each submission (kill a peer, say).
	BeforeSubmit func(ops []Op)
}

// Submit implements Transport with the configured faults.
func (f *Faulty) Submit(ctx context.Context, ops []Op) *Batch {
	if f.BeforeSubmit != nil {
		f.BeforeSubmit(ops)
	}
	if f.Stall.Load() {
		b := NewBatch(len(ops))
		go func() {
			<-ctx.Done()
			for i := range ops {
				b.Complete(i, 0, ctx.Err())
			}
		}()
		return b
	}
	inner := f.Transport.Submit(ctx, ops)
	if f.Corrupt == nil {
		return inner
	}
	out := NewBatch(len(ops))
	go func() {
		<-inner.Done()
		for i, op := range ops {
			err := inner.OpErr(i)
			crc := inner.OpCRC(i)
			if err == nil && op.Kind == Read && len(op.Local) > 0 && f.Corrupt(op) {
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
			out.CompleteCRC(i, n, crc, err)
		}
	}()
	return out
}
