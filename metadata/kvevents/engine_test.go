package kvevents

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/kvpool/kvpool/api/chain"
)

// Block n of the tests holds tokens n*10 .. n*10+bs−1, so a chain of
// blocks names its tokens.
func blockTokens(ns []int, bs int) []uint32 {
	var out []uint32
	for _, n := range ns {
		for i := range bs {
			out = append(out, uint32(n*10+i))
		}
	}
	return out
}

func ints(t *testing.T, s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		out = append(out, n)
	}
	return out
}

// The index of one engine, driven by testdata/engine: messages of events
// (with gaps, duplicates, restarts, lost replays) and what it then holds.
//
//	keying hashes | keying sha256 seed=S
//	msg seq=N [medium=M]       then lines: stored H,H [parent=H] [bs=B] | removed H,H | cleared
//	lost seq=N
//	prefix H,H,...             the engine's prefix of the chain of blocks H...
//	stats
func TestEngineIndex(t *testing.T) {
	var e *Engine
	var keying Keying
	const bs = 2
	// shadow is a copy of the index kept from its changes alone, as a
	// peer's mirror is: it must equal the index after every message.
	var shadow map[string]bool
	follow := func(t *testing.T) {
		applyChanges(shadow, e.TakeChanges())
		checkShadow(t, e, shadow)
	}
	datadriven.RunTest(t, "testdata/engine", func(t *testing.T, d *datadriven.TestData) string {
		arg := func(name string) (string, bool) {
			for _, a := range d.CmdArgs {
				if a.Key == name && len(a.Vals) > 0 {
					return a.Vals[0], true
				}
			}
			return "", false
		}
		switch d.Cmd {
		case "keying":
			keying = Keying{}
			if d.CmdArgs[0].Key == "sha256" {
				seed, _ := arg("seed")
				keying.Chain = chain.Config{Scheme: chain.SHA256, Seed: seed}
			}
			e = NewEngine(keying)
			e.TrackChanges()
			shadow = map[string]bool{}
			return ""
		case "msg":
			s, _ := arg("seq")
			seq, _ := strconv.ParseUint(s, 10, 64)
			medium, ok := arg("medium")
			if !ok {
				medium = MediumGPU
			}
			var evs []Event
			for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
				f := strings.Fields(line)
				if len(f) == 0 {
					continue
				}
				switch f[0] {
				case "cleared":
					evs = append(evs, Event{Kind: Cleared})
				case "stored", "removed":
					ns := ints(t, f[1])
					ev := Event{Kind: Removed, Medium: medium}
					for _, n := range ns {
						ev.Hashes = append(ev.Hashes, IntHash(int64(n)))
					}
					if f[0] == "stored" {
						ev.Kind, ev.BlockSize, ev.TokenIDs = Stored, bs, blockTokens(ns, bs)
						for _, opt := range f[2:] {
							if p, ok := strings.CutPrefix(opt, "parent="); ok {
								n, _ := strconv.Atoi(p)
								ev.Parent = IntHash(int64(n))
							}
						}
					}
					evs = append(evs, ev)
				default:
					t.Fatalf("unknown event %q", line)
				}
			}
			v := e.Apply(Message{Seq: seq, Batch: Batch{Events: evs}})
			follow(t)
			return fmt.Sprintf("%s; next %d; holds %d", []string{"applied", "gap", "duplicate", "restarted"}[v], e.Next(), e.Len())
		case "lost":
			s, _ := arg("seq")
			seq, _ := strconv.ParseUint(s, 10, 64)
			e.Lost(seq)
			follow(t)
			return fmt.Sprintf("next %d; holds %d", e.Next(), e.Len())
		case "prefix":
			ns := ints(t, d.CmdArgs[0].Key)
			var keys [][]byte
			if keying.Chain.Scheme == 0 {
				for _, n := range ns {
					keys = append(keys, []byte(IntHash(int64(n))))
				}
			} else {
				cfg := keying.Chain
				cfg.BlockTokens = bs
				var err error
				if keys, err = chain.Keys(cfg, blockTokens(ns, bs)); err != nil {
					t.Fatal(err)
				}
			}
			return strconv.Itoa(e.Prefix(keys))
		case "stats":
			s := e.Stats
			return fmt.Sprintf("messages %d events %d gaps %d restarts %d lost %d duplicates %d stored %d removed %d unkeyed %d other-media %d",
				s.Messages, s.Events, s.Gaps, s.Restarts, s.Lost, s.Duplicates, s.StoredBlocks, s.RemovedBlocks, s.UnkeyedBlocks, s.OtherMediaBlocks)
		}
		t.Fatalf("unknown command %q", d.Cmd)
		return ""
	})
}

func applyChanges(shadow map[string]bool, c Changes) {
	if c.Reset {
		clear(shadow)
	}
	for _, k := range c.Keys {
		if k.Held {
			shadow[k.Key] = true
		} else {
			delete(shadow, k.Key)
		}
	}
}

func checkShadow(t *testing.T, e *Engine, shadow map[string]bool) {
	t.Helper()
	keys := e.Keys()
	if len(keys) != len(shadow) {
		t.Fatalf("the copy kept from changes holds %d keys, the index %d", len(shadow), len(keys))
	}
	for _, k := range keys {
		if !shadow[k] {
			t.Fatalf("the copy kept from changes lacks key %x", k)
		}
	}
}

// A copy kept from the changes equals the index after any sequence of
// stores (re-stores and shared keys included), removals, clears, gaps,
// losses and restarts, however the changes are batched.
func TestChangesKeepACopyEqual(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		e := NewEngine(Keying{})
		e.TrackChanges()
		shadow := map[string]bool{}
		var seq uint64
		for range 400 {
			var evs []Event
			for range rng.IntN(4) {
				var hs []Hash
				for range 1 + rng.IntN(3) {
					hs = append(hs, IntHash(int64(rng.IntN(30))))
				}
				switch r := rng.IntN(20); {
				case r == 0:
					evs = append(evs, Event{Kind: Cleared})
				case r < 8:
					evs = append(evs, Event{Kind: Removed, Hashes: hs, Medium: MediumGPU})
				default:
					evs = append(evs, Event{Kind: Stored, Hashes: hs, Medium: MediumGPU})
				}
			}
			switch r := rng.IntN(30); {
			case r == 0:
				seq = 0 // a restart
			case r == 1:
				e.Lost(seq + 2)
				seq += 2
			}
			e.Apply(Message{Seq: seq, Batch: Batch{Events: evs}})
			seq++
			if rng.IntN(3) == 0 {
				applyChanges(shadow, e.TakeChanges())
				checkShadow(t, e, shadow)
			}
		}
		applyChanges(shadow, e.TakeChanges())
		checkShadow(t, e, shadow)
	}
}
