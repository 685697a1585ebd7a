package kvevents

import (
	"github.com/kvpool/kvpool/api/chain"
)

// Keying says how an engine's blocks become kvpool chain keys.
type Keying struct {
	// Chain, when its Scheme is set, recomputes each block's kvpool key
	// from the tokens its BlockStored carries, continuing the chain after
	// its parent's key (chain.KeysAfter), so routing does not depend on the
	// engine's hash algorithm. A block whose parent the index never saw
	// gets no key. With no Scheme the engine's own hashes are the keys:
	// right when it hashes with sha256_cbor and the same seed (and block
	// size) as kvpool's clients.
	Chain chain.Config
}

// block is what the index keeps per engine block.
type block struct {
	key string // kvpool chain key; "" when it could not be computed
}

// Engine is one engine's GPU prefix cache as its event stream tells it:
// which kvpool chain keys it holds. It is a pure state machine; the
// caller feeds it messages in the order they arrive. Not safe for
// concurrent use.
//
// It never claims a block the engine does not hold. After a gap in the
// sequence numbers that the caller could not fill from the engine's replay
// buffer (Lost), or an engine restart (its sequence starts again at 0),
// everything it knew is dropped and only blocks stored since count: it may
// then know less than the engine holds, never more.
type Engine struct {
	keying Keying
	blocks map[Hash]block
	held   map[string]int // kvpool key → engine blocks holding it
	next   uint64
	seen   bool
	// changes, when tracked, are the key transitions since TakeChanges.
	track   bool
	changes Changes
	// Stats count what was applied.
	Stats EngineStats
}

// EngineStats are an engine stream's counters.
type EngineStats struct {
	Messages, Events                int64
	Gaps, Restarts, Lost            int64
	Duplicates                      int64 // messages at or before the last applied
	StoredBlocks, RemovedBlocks     int64
	UnkeyedBlocks, OtherMediaBlocks int64
}

// Changes are the transitions of an index's kvpool keys, in order: what a
// copy of the index elsewhere applies to stay equal to it.
type Changes struct {
	// Reset: the copy forgets every key it held before applying Keys.
	Reset bool
	// Keys are keys that became held (Held) or stopped being held.
	Keys []KeyChange
}

// KeyChange is one key's transition.
type KeyChange struct {
	Key  string
	Held bool
}

// Empty reports whether c changes nothing.
func (c *Changes) Empty() bool { return !c.Reset && len(c.Keys) == 0 }

// TrackChanges makes the index record its key transitions for
// TakeChanges. The caller must take them, or they grow without bound.
func (e *Engine) TrackChanges() { e.track = true }

// TakeChanges returns the transitions since the last call and forgets
// them.
func (e *Engine) TakeChanges() Changes {
	c := e.changes
	e.changes = Changes{}
	return c
}

// Keys returns every kvpool key the index holds, in no order.
func (e *Engine) Keys() []string {
	out := make([]string, 0, len(e.held))
	for k := range e.held {
		out = append(out, k)
	}
	return out
}

// NewEngine returns the index of an engine that has published nothing.
func NewEngine(k Keying) *Engine {
	return &Engine{keying: k, blocks: map[Hash]block{}, held: map[string]int{}}
}

// Verdict is what Apply made of a message.
type Verdict uint8

const (
	// Applied: the message was the next one and is in the index.
	Applied Verdict = iota
	// Gap: messages before this one are missing. It was not applied; the
	// caller asks the engine's replay buffer for Next() on, applies what
	// it returns, and calls Lost if that does not reach this message.
	Gap
	// Duplicate: already applied (a replay overlapping the stream).
	Duplicate
	// Restarted: the sequence began again at 0, so the engine restarted:
	// the index was cleared and the message applied.
	Restarted
)

// Next is the sequence number the index expects next.
func (e *Engine) Next() uint64 { return e.next }

// Apply feeds one message.
func (e *Engine) Apply(m Message) Verdict {
	e.Stats.Messages++
	v := Applied
	switch {
	case !e.seen:
		// The first message fixes the sequence: what came before it is
		// not known, and nothing was claimed.
	case m.Seq == 0 && e.next > 0:
		e.Stats.Restarts++
		e.clear()
		v = Restarted
	case m.Seq < e.next:
		e.Stats.Duplicates++
		return Duplicate
	case m.Seq > e.next:
		e.Stats.Gaps++
		return Gap
	}
	e.seen, e.next = true, m.Seq+1
	for i := range m.Batch.Events {
		e.apply(&m.Batch.Events[i])
	}
	return v
}

// Lost tells the index that messages up to (not including) seq cannot be
// recovered: it forgets everything it knew and expects seq next.
func (e *Engine) Lost(seq uint64) {
	e.Stats.Lost++
	e.clear()
	e.seen, e.next = true, seq
}

func (e *Engine) clear() {
	clear(e.blocks)
	clear(e.held)
	if e.track {
		e.changes = Changes{Reset: true}
	}
}

func (e *Engine) apply(ev *Event) {
	e.Stats.Events++
	switch ev.Kind {
	case Cleared:
		e.clear()
		return
	case Removed:
		for _, h := range ev.Hashes {
			e.remove(h)
		}
		return
	}
	if ev.Medium != MediumGPU {
		e.Stats.OtherMediaBlocks += int64(len(ev.Hashes))
		return
	}
	keys := e.keys(ev)
	for i, h := range ev.Hashes {
		e.remove(h) // a re-store replaces
		k := ""
		if i < len(keys) {
			k = keys[i]
		}
		e.blocks[h] = block{key: k}
		if k == "" {
			e.Stats.UnkeyedBlocks++
			continue
		}
		if e.held[k]++; e.held[k] == 1 && e.track {
			e.changes.Keys = append(e.changes.Keys, KeyChange{Key: k, Held: true})
		}
		e.Stats.StoredBlocks++
	}
}

// keys are the kvpool keys of a BlockStored's blocks ("" where unknown).
func (e *Engine) keys(ev *Event) []string {
	out := make([]string, len(ev.Hashes))
	if e.keying.Chain.Scheme == 0 {
		for i, h := range ev.Hashes {
			out[i] = string(h)
		}
		return out
	}
	var parent []byte
	if ev.Parent != "" {
		p, ok := e.blocks[ev.Parent]
		if !ok || p.key == "" {
			return out // the chain before these blocks is not known
		}
		parent = []byte(p.key)
	}
	cfg := e.keying.Chain
	cfg.BlockTokens = ev.BlockSize
	if ev.LoRA != "" {
		lora := ev.LoRA
		cfg.Extra = func(int) []any { return []any{lora} }
	}
	ks, err := chain.KeysAfter(cfg, parent, ev.TokenIDs)
	if err != nil {
		return out
	}
	for i := range min(len(ks), len(out)) {
		out[i] = string(ks[i])
	}
	return out
}

func (e *Engine) remove(h Hash) {
	b, ok := e.blocks[h]
	if !ok {
		return
	}
	delete(e.blocks, h)
	e.Stats.RemovedBlocks++
	if b.key == "" {
		return
	}
	if e.held[b.key]--; e.held[b.key] <= 0 {
		delete(e.held, b.key)
		if e.track {
			e.changes.Keys = append(e.changes.Keys, KeyChange{Key: b.key})
		}
	}
}

// Holds reports whether the engine holds the block under kvpool key k.
func (e *Engine) Holds(k []byte) bool { return e.held[string(k)] > 0 }

// Prefix is how many leading keys of a chain the engine holds.
func (e *Engine) Prefix(keys [][]byte) int {
	for i, k := range keys {
		if !e.Holds(k) {
			return i
		}
	}
	return len(keys)
}

// Len is how many kvpool keys the engine holds.
func (e *Engine) Len() int { return len(e.held) }
