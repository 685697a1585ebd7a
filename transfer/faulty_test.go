package transfer

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
)

// Faulty with a Corrupt that never fires runs every batch through its own
// goroutine and must still behave as a Transport; Close closes the
// wrapped one.
func TestFaultyConformance(t *testing.T) {
	tcp := tcpFactory(TCPConfig{})
	runConformance(t, func(t *testing.T, mem []byte) pair {
		p := tcp(t, mem)
		f := &Faulty{Transport: p.client}
		f.Corrupt.Store(func(Op) bool { return false })
		t.Cleanup(func() { f.Close() })
		p.client = f
		return p
	})
}

func TestFaultyStall(t *testing.T) {
	mem := pattern(1<<20, 14)
	read := func(p pair) Op {
		return Op{Kind: Read, Peer: p.peer, Region: 7, Offset: 1000, Local: make([]byte, 5000), Checksum: true}
	}
	// waitDone fails the test if b does not complete; a stalled batch
	// that should end must end promptly.
	waitDone := func(t *testing.T, b *Batch, what string) {
		t.Helper()
		select {
		case <-b.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the stalled batch did not complete", what)
		}
	}
	t.Run("ends when the context does", func(t *testing.T) {
		p := tcpFactory(TCPConfig{})(t, mem)
		f := &Faulty{Transport: p.client}
		defer f.Close()
		f.Stall.Store(true)
		ctx, cancel := context.WithCancel(context.Background())
		b := f.Submit(ctx, []Op{read(p)})
		if done, _ := b.Poll(); done {
			t.Fatal("a stalled batch completed")
		}
		cancel()
		waitDone(t, b, "after cancel")
		if err := b.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("stalled batch after cancel: %v, want context.Canceled", err)
		}
	})
	t.Run("ends when the Faulty is closed", func(t *testing.T) {
		p := tcpFactory(TCPConfig{})(t, mem)
		f := &Faulty{Transport: p.client}
		f.Stall.Store(true)
		b := f.Submit(context.Background(), []Op{read(p), read(p)})
		if done, _ := b.Poll(); done {
			t.Fatal("a stalled batch completed")
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		// Close waited for the batch's goroutine: it is complete now.
		if done, err := b.Poll(); !done || !errors.Is(err, ErrClosed) {
			t.Fatalf("stalled batch after Close: done %v, %v; want ErrClosed", done, err)
		}
		// The wrapped transport is closed too.
		if err := p.client.Submit(context.Background(), []Op{read(p)}).Wait(context.Background()); !errors.Is(err, ErrClosed) {
			t.Fatalf("the wrapped transport after Close: %v, want ErrClosed", err)
		}
		if err := f.Submit(context.Background(), []Op{read(p)}).Wait(context.Background()); !errors.Is(err, ErrClosed) {
			t.Fatalf("a stalled Faulty after Close: %v, want ErrClosed", err)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
	t.Run("resumes when switched off", func(t *testing.T) {
		p := tcpFactory(TCPConfig{})(t, mem)
		f := &Faulty{Transport: p.client}
		defer f.Close()
		f.Stall.Store(true)
		f.Stall.Store(true) // idempotent
		op := read(p)
		b := f.Submit(context.Background(), []Op{op})
		if done, _ := b.Poll(); done || !f.Stall.Load() {
			t.Fatal("a stalled batch completed")
		}
		f.Stall.Store(false)
		waitDone(t, b, "after Stall was switched off")
		if err := b.Err(); err != nil {
			t.Fatalf("resumed batch: %v", err)
		}
		if !bytes.Equal(op.Local, mem[1000:6000]) || b.OpCRC(0) != api.Checksum(mem[1000:6000]) || b.Bytes() != 5000 {
			t.Fatal("resumed batch: wrong bytes, checksum or count")
		}
		// Off: batches go straight through.
		if err := f.Submit(context.Background(), []Op{read(p)}).Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestFaultyCorrupt(t *testing.T) {
	mem := pattern(1<<20, 15)
	p := tcpFactory(TCPConfig{})(t, mem)
	f := &Faulty{Transport: p.client}
	f.Corrupt.Store(func(op Op) bool { return op.Offset == 0 })
	defer f.Close()
	ops := []Op{
		{Kind: Read, Peer: p.peer, Region: 7, Offset: 0, Local: make([]byte, 4096), Checksum: true},
		{Kind: Read, Peer: p.peer, Region: 7, Offset: 4096, Local: make([]byte, 4096), Checksum: true},
	}
	b := f.Submit(context.Background(), ops)
	if err := b.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(ops[0].Local, mem[:4096]) || b.OpCRC(0) != api.Checksum(ops[0].Local) || b.OpCRC(0) == api.Checksum(mem[:4096]) {
		t.Fatal("the corrupted op arrived intact, or its checksum is not of the damaged bytes")
	}
	if !bytes.Equal(ops[1].Local, mem[4096:8192]) || b.OpCRC(1) != api.Checksum(mem[4096:8192]) {
		t.Fatal("the op Corrupt did not pick was damaged")
	}
}
