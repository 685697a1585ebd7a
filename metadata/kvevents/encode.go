package kvevents

import (
	"encoding/binary"
	"math"
)

// Encode returns the three frames of m as vLLM publishes them with
// array_like msgspec structs: an engine that is not vLLM (or a test)
// publishes its cache with it and any subscriber of vLLM's events reads
// it. Hashes are encoded as bytes (an IntHash decodes back to itself);
// trailing fields at their zero value (no LoRA, group 0) are left out, as
// vLLM's older releases do. Decode(Encode(m)) is m.
func Encode(m Message) [][]byte {
	return [][]byte{[]byte(m.Topic), binary.BigEndian.AppendUint64(nil, m.Seq), EncodeBatch(m.Batch)}
}

// EncodeBatch encodes one EventBatch: [ts, [events...]] with the
// data-parallel rank appended when it is not −1.
func EncodeBatch(b Batch) []byte {
	var w writer
	if b.DPRank >= 0 {
		w.array(3)
	} else {
		w.array(2)
	}
	w.float(b.TS)
	w.array(len(b.Events))
	for i := range b.Events {
		w.event(&b.Events[i])
	}
	if b.DPRank >= 0 {
		w.int(int64(b.DPRank))
	}
	return w.b
}

// writer appends MessagePack, each value in its shortest form.
type writer struct{ b []byte }

func (w *writer) event(e *Event) {
	medium := e.Medium
	if medium == "" {
		medium = MediumGPU
	}
	switch e.Kind {
	case Cleared:
		w.array(1)
		w.str(Cleared.String())
	case Removed:
		if e.Group != 0 {
			w.array(4)
		} else {
			w.array(3)
		}
		w.str(Removed.String())
		w.hashes(e.Hashes)
		w.str(medium)
		if e.Group != 0 {
			w.int(int64(e.Group))
		}
	default:
		// BlockStored: hashes, parent, token ids, block size, lora_id,
		// medium, then lora_name, extra_keys and group_idx when needed.
		n := 7
		switch {
		case e.Group != 0:
			n = 10
		case e.LoRA != "":
			n = 8
		}
		w.array(n)
		w.str(Stored.String())
		w.hashes(e.Hashes)
		if e.Parent == "" {
			w.nil()
		} else {
			w.bin([]byte(e.Parent))
		}
		w.array(len(e.TokenIDs))
		for _, t := range e.TokenIDs {
			w.int(int64(t))
		}
		w.int(int64(e.BlockSize))
		w.nil() // lora_id: deprecated for lora_name
		w.str(medium)
		if n > 7 {
			if e.LoRA != "" {
				w.str(e.LoRA)
			} else {
				w.nil()
			}
		}
		if n > 8 {
			w.nil() // extra_keys
			w.int(int64(e.Group))
		}
	}
}

func (w *writer) hashes(hs []Hash) {
	w.array(len(hs))
	for _, h := range hs {
		w.bin([]byte(h))
	}
}

func (w *writer) nil() { w.b = append(w.b, 0xc0) }

func (w *writer) array(n int) {
	switch {
	case n < 16:
		w.b = append(w.b, 0x90|byte(n))
	case n <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xdc), uint16(n))
	default:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xdd), uint32(n))
	}
}

func (w *writer) str(s string) {
	switch n := len(s); {
	case n < 32:
		w.b = append(w.b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		w.b = append(w.b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xda), uint16(n))
	default:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xdb), uint32(n))
	}
	w.b = append(w.b, s...)
}

func (w *writer) bin(p []byte) {
	switch n := len(p); {
	case n <= math.MaxUint8:
		w.b = append(w.b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xc5), uint16(n))
	default:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xc6), uint32(n))
	}
	w.b = append(w.b, p...)
}

func (w *writer) float(f float64) {
	w.b = binary.BigEndian.AppendUint64(append(w.b, 0xcb), math.Float64bits(f))
}

func (w *writer) int(v int64) {
	switch {
	case v >= 0 && v < 128:
		w.b = append(w.b, byte(v))
	case v < 0 && v >= -32:
		w.b = append(w.b, byte(v))
	case v >= 0 && v <= math.MaxUint8:
		w.b = append(w.b, 0xcc, byte(v))
	case v >= 0 && v <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xcd), uint16(v))
	case v >= 0 && v <= math.MaxUint32:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xce), uint32(v))
	case v >= math.MinInt8 && v < 0:
		w.b = append(w.b, 0xd0, byte(v))
	case v >= math.MinInt16 && v < 0:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xd1), uint16(v))
	case v >= math.MinInt32 && v < 0:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xd2), uint32(v))
	default:
		w.b = binary.BigEndian.AppendUint64(append(w.b, 0xd3), uint64(v))
	}
}
