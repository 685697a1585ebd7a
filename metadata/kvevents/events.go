// Package kvevents decodes the KV-cache events inference engines publish
// about their own (GPU) prefix caches, in vLLM's format: ZeroMQ messages of
// three frames (topic, an 8-byte big-endian sequence number, a MessagePack
// EventBatch) carrying BlockStored, BlockRemoved and AllBlocksCleared
// events (vllm/distributed/kv_events.py).
//
// vLLM encodes with msgspec, and its structs have been encoded both as
// arrays (array_like, in the releases its example subscriber targets) and
// as maps with a "type" tag; both are accepted, as are the fields later
// releases appended (medium, lora_name, extra_keys, group_idx, ...).
//
// Decoding is pure and bounded: no goroutines, no I/O, every length
// checked against the message, so a malformed or hostile message is an
// error (ErrMalformed), never a crash or an allocation larger than
// itself.
package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Kind is an event's type.
type Kind uint8

const (
	kindInvalid Kind = iota
	// Stored: the engine cached blocks (a chain segment under Parent).
	Stored
	// Removed: the engine evicted blocks.
	Removed
	// Cleared: the engine dropped its whole cache.
	Cleared
)

var kindNames = map[string]Kind{"BlockStored": Stored, "BlockRemoved": Removed, "AllBlocksCleared": Cleared}

func (k Kind) String() string {
	switch k {
	case Stored:
		return "BlockStored"
	case Removed:
		return "BlockRemoved"
	case Cleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Hash is an engine's block hash. vLLM's ExternalBlockHash is bytes or an
// int; an int is kept as its 8-byte big-endian two's complement, so equal
// hashes are equal strings either way.
type Hash string

// IntHash is the Hash of an integer block hash.
func IntHash(v int64) Hash { return Hash(binary.BigEndian.AppendUint64(nil, uint64(v))) }

// MediumGPU is what an event without a medium refers to.
const MediumGPU = "GPU"

// Event is one cache event.
type Event struct {
	Kind Kind
	// Hashes are the blocks, in chain order for Stored.
	Hashes []Hash
	// Parent is the block before Hashes[0] in its chain; "" for a chain's
	// first block. Stored only.
	Parent Hash
	// TokenIDs are the blocks' tokens, BlockSize per block. Stored only.
	TokenIDs []uint32
	// BlockSize is tokens per block. Stored only.
	BlockSize int
	// LoRA names the adapter the blocks were computed with ("" none): the
	// lora_name, or the deprecated lora_id in decimal.
	LoRA string
	// Medium is where the blocks are: "GPU" (the default), "CPU", ...
	Medium string
	// Group is the KV-cache group (hybrid models); 0 when not given.
	Group int
}

// Batch is one EventBatch.
type Batch struct {
	// TS is when the engine published it, Unix seconds.
	TS     float64
	Events []Event
	// DPRank is the data-parallel rank that published it; −1 if not given.
	DPRank int
}

// Message is one ZeroMQ message of the stream.
type Message struct {
	Topic string
	// Seq is the publisher's sequence number: consecutive messages differ
	// by one; a jump is a gap (messages lost).
	Seq   uint64
	Batch Batch
}

// ErrMalformed marks a message that is not a valid event batch.
var ErrMalformed = errors.New("kvevents: malformed message")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// DecodeMessage decodes the three frames of one message.
func DecodeMessage(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, malformed("%d frames, want 3 (topic, sequence, payload)", len(frames))
	}
	if len(frames[1]) != 8 {
		return Message{}, malformed("a %d-byte sequence number, want 8", len(frames[1]))
	}
	b, err := DecodeBatch(frames[2])
	if err != nil {
		return Message{}, err
	}
	return Message{Topic: string(frames[0]), Seq: binary.BigEndian.Uint64(frames[1]), Batch: b}, nil
}

// MaxEvents and MaxBlocks bound one batch, well above what an engine
// step emits, so that one message cannot make the daemon hold more than
// a bounded amount.
const (
	MaxEvents = 1 << 16
	MaxBlocks = 1 << 16
)

// DecodeBatch decodes one EventBatch payload.
func DecodeBatch(payload []byte) (Batch, error) {
	v, err := decode(payload)
	if err != nil {
		return Batch{}, malformed("%v", err)
	}
	b := Batch{DPRank: -1}
	var ts, events, rank value
	switch x := v.(type) {
	case []value: // array_like: [ts, events, data_parallel_rank?]
		if len(x) < 2 || len(x) > 3 {
			return Batch{}, malformed("a batch of %d fields, want 2 or 3", len(x))
		}
		ts, events = x[0], x[1]
		if len(x) == 3 {
			rank = x[2]
		}
	case []pair:
		f, err := fields(x)
		if err != nil {
			return Batch{}, err
		}
		ts, events, rank = f["ts"], f["events"], f["data_parallel_rank"]
	default:
		return Batch{}, malformed("a batch is a %T, want an array or a map", v)
	}
	if b.TS, err = number(ts, "ts"); err != nil {
		return Batch{}, err
	}
	if rank != nil {
		r, err := integer(rank, "data_parallel_rank", 0, math.MaxInt32)
		if err != nil {
			return Batch{}, err
		}
		b.DPRank = int(r)
	}
	list, ok := events.([]value)
	if !ok {
		return Batch{}, malformed("events is a %T, want an array", events)
	}
	if len(list) > MaxEvents {
		return Batch{}, malformed("%d events in one batch, more than %d", len(list), MaxEvents)
	}
	b.Events = make([]Event, 0, len(list))
	for i, ev := range list {
		e, err := decodeEvent(ev)
		if err != nil {
			return Batch{}, fmt.Errorf("event %d: %w", i, err)
		}
		b.Events = append(b.Events, e)
	}
	return b, nil
}

// eventFields are the fields of each event type in msgspec's array order,
// after the tag. The first `required` must be present.
var eventFields = map[Kind]struct {
	names    []string
	required int
}{
	Stored: {[]string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
		"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}, 4},
	Removed: {[]string{"block_hashes", "medium", "group_idx"}, 1},
	Cleared: {nil, 0},
}

func decodeEvent(v value) (Event, error) {
	var tag value
	f := map[string]value{}
	switch x := v.(type) {
	case []value:
		if len(x) == 0 {
			return Event{}, malformed("an empty event")
		}
		tag = x[0]
		k, err := kind(tag)
		if err != nil {
			return Event{}, err
		}
		spec := eventFields[k]
		if len(x)-1 < spec.required {
			return Event{}, malformed("%v with %d fields, want at least %d", k, len(x)-1, spec.required)
		}
		if len(x)-1 > len(spec.names) {
			// Fields a later release appended: not ours to read.
			x = x[:1+len(spec.names)]
		}
		for i, val := range x[1:] {
			f[spec.names[i]] = val
		}
	case []pair:
		m, err := fields(x)
		if err != nil {
			return Event{}, err
		}
		f, tag = m, m["type"]
		k, err := kind(tag)
		if err != nil {
			return Event{}, err
		}
		for _, name := range eventFields[k].names[:eventFields[k].required] {
			if _, ok := f[name]; !ok {
				return Event{}, malformed("%v without %s", k, name)
			}
		}
	default:
		return Event{}, malformed("an event is a %T, want an array or a map", v)
	}
	k, _ := kind(tag)
	e := Event{Kind: k, Medium: MediumGPU}
	var err error
	if k == Cleared {
		return e, nil
	}
	if e.Hashes, err = hashes(f["block_hashes"]); err != nil {
		return Event{}, err
	}
	if m := f["medium"]; m != nil {
		s, ok := m.(string)
		if !ok || s == "" || len(s) > 32 {
			return Event{}, malformed("medium %v, want a short name", m)
		}
		e.Medium = s
	}
	if g := f["group_idx"]; g != nil {
		n, err := integer(g, "group_idx", 0, math.MaxInt32)
		if err != nil {
			return Event{}, err
		}
		e.Group = int(n)
	}
	if k == Removed {
		return e, nil
	}
	if p := f["parent_block_hash"]; p != nil {
		if e.Parent, err = hash(p); err != nil {
			return Event{}, err
		}
	}
	bs, err := integer(f["block_size"], "block_size", 1, 1<<20)
	if err != nil {
		return Event{}, err
	}
	e.BlockSize = int(bs)
	toks, ok := f["token_ids"].([]value)
	if !ok {
		return Event{}, malformed("token_ids is a %T, want an array", f["token_ids"])
	}
	if len(toks) != len(e.Hashes)*e.BlockSize {
		return Event{}, malformed("%d token ids for %d blocks of %d", len(toks), len(e.Hashes), e.BlockSize)
	}
	e.TokenIDs = make([]uint32, len(toks))
	for i, t := range toks {
		n, err := integer(t, "token id", 0, math.MaxUint32)
		if err != nil {
			return Event{}, err
		}
		e.TokenIDs[i] = uint32(n)
	}
	switch name := f["lora_name"].(type) {
	case nil:
		if id := f["lora_id"]; id != nil {
			n, err := integer(id, "lora_id", math.MinInt64, math.MaxInt64)
			if err != nil {
				return Event{}, err
			}
			e.LoRA = strconv.FormatInt(n, 10)
		}
	case string:
		e.LoRA = name
	default:
		return Event{}, malformed("lora_name is a %T, want a string", name)
	}
	return e, nil
}

func kind(tag value) (Kind, error) {
	s, ok := tag.(string)
	if !ok {
		return kindInvalid, malformed("event tag %v, want a type name", tag)
	}
	k, ok := kindNames[s]
	if !ok {
		return kindInvalid, malformed("unknown event type %q", s)
	}
	return k, nil
}

// fields turns a map's pairs into a lookup by string key.
func fields(ps []pair) (map[string]value, error) {
	m := make(map[string]value, len(ps))
	for _, p := range ps {
		k, ok := p.key.(string)
		if !ok {
			return nil, malformed("a map key %v, want a string", p.key)
		}
		m[k] = p.val
	}
	return m, nil
}

func hashes(v value) ([]Hash, error) {
	list, ok := v.([]value)
	if !ok || len(list) == 0 {
		return nil, malformed("block_hashes %T of %d, want a non-empty array", v, len(list))
	}
	if len(list) > MaxBlocks {
		return nil, malformed("%d blocks in one event, more than %d", len(list), MaxBlocks)
	}
	out := make([]Hash, len(list))
	for i, h := range list {
		var err error
		if out[i], err = hash(h); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func hash(v value) (Hash, error) {
	switch x := v.(type) {
	case []byte:
		if len(x) == 0 || len(x) > 64 {
			return "", malformed("a %d-byte block hash, want 1 to 64", len(x))
		}
		return Hash(x), nil
	case int64:
		return IntHash(x), nil
	case uint64:
		return IntHash(int64(x)), nil
	}
	return "", malformed("a block hash is a %T, want bytes or an integer", v)
}

func integer(v value, what string, lo, hi int64) (int64, error) {
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case uint64:
		if hi < math.MaxInt64 || x > math.MaxInt64 {
			return 0, malformed("%s %d is out of range", what, x)
		}
		n = int64(x)
	default:
		return 0, malformed("%s is a %T, want an integer", what, v)
	}
	if n < lo || n > hi {
		return 0, malformed("%s %d is outside [%d, %d]", what, n, lo, hi)
	}
	return n, nil
}

func number(v value, what string) (float64, error) {
	switch x := v.(type) {
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return 0, malformed("%s %v is not a finite number", what, x)
		}
		return x, nil
	case int64:
		return float64(x), nil
	case uint64:
		return float64(x), nil
	}
	return 0, malformed("%s is a %T, want a number", what, v)
}
