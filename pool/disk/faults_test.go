package disk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
)

// The disk faults a node must ride out (issue 17), at the package level:
// each costs the block it hits, counted, and nothing else. The tier's
// reads and writes go on.

// TestFaultDiskFull: a file system smaller than the tier's capacity fills
// up. The write that finds it full is counted as no_space and leaves
// nothing behind; the blocks written before it stay readable, and once
// room is made writes succeed again.
func TestFaultDiskFull(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skipf("cannot mount a tmpfs: %v", err)
		}
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	cfg := testConfig(t, dir)
	cfg.IO = IOAuto // tmpfs may refuse O_DIRECT
	cfg.CapacityBytes = 64 << 20
	cfg.Writers = 1 // in order: the fill point is one place
	// NB: the 1 MiB file system is also smaller than Open's 4 MiB read
	// probe, which must shrink to fit rather than fail Open.
	tier := open(t, cfg)
	stop := run(t, tier)

	const size = 100 << 10
	var bs []*testBlock
	for i := range 16 {
		b := newBlock("t", fmt.Sprint(i), size)
		mustOffer(t, tier, b)
		bs = append(bs, b)
	}
	s := settle(t, tier, uint64(len(bs)))
	checkDone(t, bs...)
	if s.WriteFailures[writeNoSpace] == 0 || s.WriteFailures[writeIO] != 0 || s.Spilled == 0 {
		t.Fatalf("%d written, write failures %v: want some written, then no_space failures only", s.Spilled, s.WriteFailures)
	}
	if s.Spilled+s.WriteFailures[writeNoSpace] != uint64(len(bs)) || s.Blocks != int64(s.Spilled) {
		t.Fatalf("stats %+v do not add up to %d offers", s, len(bs))
	}
	var held, lost []*testBlock
	for _, b := range bs {
		if holds(tier, b) {
			held = append(held, b)
		} else {
			lost = append(lost, b)
		}
	}
	for _, b := range lost {
		mustMiss(t, tier, b) // no file, no .tmp left
	}
	for _, b := range held {
		mustRead(t, tier, b)
	}
	if n := len(blockFiles(t, dir)); n != len(held) {
		t.Fatalf("%d files for %d blocks", n, len(held))
	}

	// Room made, a lost block is written after all.
	for _, b := range held[:2] {
		if !tier.Remove([]byte(b.tenant), []byte(b.namespace), b.key) {
			t.Fatalf("Remove %s reported none", b.key)
		}
	}
	again := lost[0]
	again.done.Store(0)
	mustOffer(t, tier, again)
	if s := settle(t, tier, uint64(len(bs)+1)); s.Spilled != uint64(len(held)+1) {
		t.Fatalf("after making room: %d written, failures %v", s.Spilled, s.WriteFailures)
	}
	mustRead(t, tier, again)
	for _, b := range held[2:] {
		mustRead(t, tier, b)
	}

	// A restart on the nearly full disk adopts what it holds.
	stop()
	must(t, tier.Close())
	tier = open(t, cfg)
	if r := tier.Opened(); r.Blocks != len(held)-1 || r.Dropped+r.Partial != 0 {
		t.Fatalf("reopened: %+v, want %d blocks", r, len(held)-1)
	}
	mustRead(t, tier, again)
	for _, b := range held[2:] {
		mustRead(t, tier, b)
	}
}

// TestFaultRead damages a written block's file in the ways a disk or an
// operator does; each read of it fails once, counted by why, drops it
// (file and index, the sink told), and then misses. The other blocks are
// untouched.
func TestFaultRead(t *testing.T) {
	const size = 3*align + 5
	cases := []struct {
		name   string
		damage func(t *testing.T, path string, other *testBlock, dir string)
		want   error // the first read's error
		reason string
	}{
		{"gone", func(t *testing.T, p string, _ *testBlock, _ string) { must(t, os.Remove(p)) }, api.ErrNotFound, failMissing},
		{"unreadable", func(t *testing.T, p string, _ *testBlock, _ string) {
			// chmod does not stop root: a directory under the
			// name does.
			must(t, os.Remove(p))
			must(t, os.Mkdir(p, 0o700))
		}, api.ErrDataLoss, failIO},
		{"truncated to nothing", truncateTo(0), api.ErrDataLoss, failTruncated},
		{"truncated in the header", truncateTo(100), api.ErrDataLoss, failTruncated},
		{"truncated after the header", truncateTo(headerBytes), api.ErrDataLoss, failTruncated},
		{"truncated unaligned", truncateTo(headerBytes + align + 100), api.ErrDataLoss, failTruncated},
		{"truncated by a byte", truncateTo(fileBytes(size) - 1), api.ErrDataLoss, failTruncated},
		{"bit flipped in the first byte", flipBit(headerBytes, 0), api.ErrDataLoss, failChecksum},
		{"bit flipped in the last byte", flipBit(headerBytes+size-1, 7), api.ErrDataLoss, failChecksum},
		{"bit flipped in the magic", flipBit(0, 1), api.ErrDataLoss, failHeader},
		{"bit flipped in the size", flipBit(16, 0), api.ErrDataLoss, failHeader},
		{"bit flipped in the header crc", flipBit(headerCRCAt, 3), api.ErrDataLoss, failHeader},
		{"another block's file", func(t *testing.T, p string, other *testBlock, dir string) {
			b, err := os.ReadFile(other.path(dir))
			must(t, err)
			must(t, os.WriteFile(p, b, 0o600))
		}, api.ErrDataLoss, failHeader},
	}
	for _, mode := range []IOMode{IODirect, IOBuffered} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := testConfig(t, t.TempDir())
			cfg.IO = mode
			tier := open(t, cfg)
			sink := &recordingSink{}
			tier.SetSink(sink)
			other := newBlock("t", "other", size)
			victims := map[string]*testBlock{}
			mustOffer(t, tier, other)
			for _, tc := range cases {
				victims[tc.name] = newBlock("t", tc.name, size)
				mustOffer(t, tier, victims[tc.name])
			}
			run(t, tier)
			written := uint64(len(cases) + 1)
			settle(t, tier, written)

			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					victim := victims[tc.name]
					before := tier.Stats()
					_, removedBefore := sink.lists()
					tc.damage(t, victim.path(cfg.Dir), other, cfg.Dir)
					_, err := victim.read(tier)
					if !errors.Is(err, tc.want) {
						t.Fatalf("Read of the damaged block: %v, want %v", err, tc.want)
					}
					s := tier.Stats()
					for _, r := range ReadFailures {
						if want := before.ReadFailures[r] + map[bool]uint64{true: 1}[r == tc.reason]; s.ReadFailures[r] != want {
							t.Errorf("read failures went from %v to %v: want one more %s", before.ReadFailures, s.ReadFailures, tc.reason)
							break
						}
					}
					if s.Blocks != before.Blocks-1 {
						t.Errorf("%d blocks held after the drop, want %d", s.Blocks, before.Blocks-1)
					}
					mustMiss(t, tier, victim)
					if n := tier.Stats().ReadFailures[tc.reason]; n != s.ReadFailures[tc.reason] {
						t.Errorf("the miss after the drop counted another %s failure", tc.reason)
					}
					if _, removed := sink.lists(); len(removed) != len(removedBefore)+1 || removed[len(removed)-1] != victim.id() {
						t.Errorf("the sink heard %q removed, want %q last", removed, victim.id())
					}
					mustRead(t, tier, other)

					// The name can be written again.
					victim.done.Store(0)
					mustOffer(t, tier, victim)
					written++
					settle(t, tier, written)
					mustRead(t, tier, victim)
				})
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func truncateTo(n int64) func(*testing.T, string, *testBlock, string) {
	return func(t *testing.T, p string, _ *testBlock, _ string) { must(t, os.Truncate(p, n)) }
}

// flipBit flips one bit of the file at off (the header is [0, 4096), the
// block's bytes start at 4096).
func flipBit(off int64, bit uint) func(*testing.T, string, *testBlock, string) {
	return func(t *testing.T, p string, _ *testBlock, _ string) {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		must(t, err)
		defer f.Close()
		b := make([]byte, 1)
		_, err = f.ReadAt(b, off)
		must(t, err)
		b[0] ^= 1 << bit
		_, err = f.WriteAt(b, off)
		must(t, err)
	}
}
