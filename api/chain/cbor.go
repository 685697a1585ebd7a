package chain

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/kvpool/kvpool/api"
)

// appendCBOR appends the canonical CBOR (RFC 8949 §4.2.1, as Python's
// cbor2.dumps(..., canonical=True) writes it) of v to b. It covers what
// vLLM feeds its sha256_cbor hash: non-negative and negative integers,
// byte strings, text strings, arrays (tuples), booleans and None. Integers
// use the shortest head. Other types are an error.
func appendCBOR(b []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(b, 0xf6), nil
	case bool:
		if x {
			return append(b, 0xf5), nil
		}
		return append(b, 0xf4), nil
	case uint32:
		return appendCBORHead(b, 0, uint64(x)), nil
	case uint64:
		return appendCBORHead(b, 0, x), nil
	case uint:
		return appendCBORHead(b, 0, uint64(x)), nil
	case int:
		return appendCBORInt(b, int64(x)), nil
	case int32:
		return appendCBORInt(b, int64(x)), nil
	case int64:
		return appendCBORInt(b, x), nil
	case []byte:
		return append(appendCBORHead(b, 2, uint64(len(x))), x...), nil
	case string:
		return append(appendCBORHead(b, 3, uint64(len(x))), x...), nil
	case []uint32:
		b = appendCBORHead(b, 4, uint64(len(x)))
		for _, t := range x {
			b = appendCBORHead(b, 0, uint64(t))
		}
		return b, nil
	case []any:
		b = appendCBORHead(b, 4, uint64(len(x)))
		for _, e := range x {
			var err error
			if b, err = appendCBOR(b, e); err != nil {
				return nil, err
			}
		}
		return b, nil
	default:
		return nil, fmt.Errorf("%w: cannot encode %T as CBOR", api.ErrInvalidArgument, v)
	}
}

func appendCBORInt(b []byte, x int64) []byte {
	if x >= 0 {
		return appendCBORHead(b, 0, uint64(x))
	}
	return appendCBORHead(b, 1, uint64(-(x + 1)))
}

// appendCBORHead writes a major type and argument in the shortest form.
func appendCBORHead(b []byte, major byte, arg uint64) []byte {
	m := major << 5
	switch {
	case arg < 24:
		return append(b, m|byte(arg))
	case arg <= math.MaxUint8:
		return append(b, m|24, byte(arg))
	case arg <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, m|25), uint16(arg))
	case arg <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, m|26), uint32(arg))
	default:
		return binary.BigEndian.AppendUint64(append(b, m|27), arg)
	}
}
