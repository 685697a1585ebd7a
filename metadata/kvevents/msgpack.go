package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// value is one decoded MessagePack value: nil, bool, int64, uint64,
// float64, string, []byte, []value or []pair. The decoder is a bounded
// subset of the format (no ext types beyond skipping them): every length
// is checked against the bytes left, so a hostile message costs at most
// its own size.
type value any

type pair struct {
	key, val value
}

// errShort is a message that ends inside a value.
var errShort = errors.New("truncated")

// maxDepth bounds nesting: events are three levels deep (batch, events,
// fields) plus extra keys.
const maxDepth = 16

type reader struct {
	b   []byte
	off int
}

func (r *reader) need(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, errShort
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s, nil
}

func (r *reader) uint(n int) (uint64, error) {
	s, err := r.need(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(s[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(s)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(s)), nil
	}
	return binary.BigEndian.Uint64(s), nil
}

// length reads an n-byte length and checks that at least min bytes per
// element remain for it.
func (r *reader) length(n, min int) (int, error) {
	u, err := r.uint(n)
	if err != nil {
		return 0, err
	}
	if u > uint64(len(r.b)-r.off)/uint64(max(min, 1)) {
		return 0, errShort
	}
	return int(u), nil
}

func (r *reader) read(depth int) (value, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxDepth)
	}
	s, err := r.need(1)
	if err != nil {
		return nil, err
	}
	c := s[0]
	switch {
	case c <= 0x7f:
		return int64(c), nil
	case c >= 0xe0:
		return int64(int8(c)), nil
	case c&0xe0 == 0xa0:
		return r.str(int(c & 0x1f))
	case c&0xf0 == 0x90:
		return r.array(int(c&0x0f), depth)
	case c&0xf0 == 0x80:
		return r.mapping(int(c&0x0f), depth)
	}
	switch c {
	case 0xc0:
		return nil, nil
	case 0xc2:
		return false, nil
	case 0xc3:
		return true, nil
	case 0xcc, 0xcd, 0xce, 0xcf:
		u, err := r.uint(1 << (c - 0xcc))
		if err != nil {
			return nil, err
		}
		if u <= math.MaxInt64 {
			return int64(u), nil
		}
		return u, nil
	case 0xd0, 0xd1, 0xd2, 0xd3:
		n := 1 << (c - 0xd0)
		u, err := r.uint(n)
		if err != nil {
			return nil, err
		}
		shift := 64 - 8*n
		return int64(u<<shift) >> shift, nil
	case 0xca:
		u, err := r.uint(4)
		return float64(math.Float32frombits(uint32(u))), err
	case 0xcb:
		u, err := r.uint(8)
		return math.Float64frombits(u), err
	case 0xd9, 0xda, 0xdb:
		n, err := r.length(1<<(c-0xd9), 1)
		if err != nil {
			return nil, err
		}
		return r.str(n)
	case 0xc4, 0xc5, 0xc6:
		n, err := r.length(1<<(c-0xc4), 1)
		if err != nil {
			return nil, err
		}
		b, err := r.need(n)
		return append([]byte(nil), b...), err
	case 0xdc, 0xdd:
		n, err := r.length(2<<(c-0xdc), 1)
		if err != nil {
			return nil, err
		}
		return r.array(n, depth)
	case 0xde, 0xdf:
		n, err := r.length(2<<(c-0xde), 2)
		if err != nil {
			return nil, err
		}
		return r.mapping(n, depth)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext: skipped as nil
		_, err := r.need(1 + 1<<(c-0xd4))
		return nil, err
	case 0xc7, 0xc8, 0xc9:
		n, err := r.length(1<<(c-0xc7), 1)
		if err != nil {
			return nil, err
		}
		_, err = r.need(1 + n)
		return nil, err
	}
	return nil, fmt.Errorf("byte 0x%02x at offset %d is not MessagePack", c, r.off-1)
}

func (r *reader) str(n int) (value, error) {
	s, err := r.need(n)
	if err != nil {
		return nil, err
	}
	return string(s), nil
}

func (r *reader) array(n, depth int) (value, error) {
	if n > len(r.b)-r.off {
		return nil, errShort
	}
	out := make([]value, n)
	for i := range out {
		v, err := r.read(depth + 1)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (r *reader) mapping(n, depth int) (value, error) {
	if n > (len(r.b)-r.off)/2 {
		return nil, errShort
	}
	out := make([]pair, n)
	for i := range out {
		k, err := r.read(depth + 1)
		if err != nil {
			return nil, err
		}
		v, err := r.read(depth + 1)
		if err != nil {
			return nil, err
		}
		out[i] = pair{k, v}
	}
	return out, nil
}

// decode reads exactly one value from b.
func decode(b []byte) (value, error) {
	r := &reader{b: b}
	v, err := r.read(0)
	if err != nil {
		return nil, err
	}
	if r.off != len(b) {
		return nil, fmt.Errorf("%d bytes after the value", len(b)-r.off)
	}
	return v, nil
}
