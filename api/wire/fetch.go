package wire

import (
	"encoding/binary"
	"fmt"
	"time"
)

// A Fetch frame (OpFetch) asks the node to make a chain of blocks local,
// pulling each one it lacks from a peer, as the gRPC Fetch does, without
// gRPC's cost per call (about 0.3 ms of a 1 ms fetch on loopback).
//
// The request's value, ValueLen bytes after the header and names, is the
// chain: each key as its length (uint16, little-endian) and its bytes.
// Its TimeoutMs bounds each holder's transfer (0: the node's default).
// The response's value, ValueLen bytes after the header, holds one result
// per key, in order:
//
//	status  u8   a gRPC code
//	srclen  u8   length of source
//	msglen  u16  length of message
//	size    u64  bytes fetched (0 if the block was local)
//	took    u64  nanoseconds the node spent on the fetch that brought it
//	source  srclen bytes: the node the block came from ("" if local)
//	message msglen bytes: why status is not OK

// MaxChainKeys is the most keys one Fetch frame carries.
const MaxChainKeys = 1 << 16

// MaxChainBytes bounds a Fetch request's value.
const MaxChainBytes = MaxChainKeys * (2 + MaxKeyBytes)

// MaxFetchMessageBytes is the longest error message one fetch result
// carries; longer ones are cut.
const MaxFetchMessageBytes = 512

// fetchResultHeaderBytes is the fixed part of one encoded result.
const fetchResultHeaderBytes = 20

// MaxFetchResultsBytes is the most a Fetch response's value may hold for
// a chain of n keys: what a decoder allows before reading it.
func MaxFetchResultsBytes(n int) uint64 {
	return uint64(n) * (fetchResultHeaderBytes + 255 + MaxFetchMessageBytes)
}

// AppendChain appends keys as a Fetch request's value.
func AppendChain(b []byte, keys [][]byte) []byte {
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(k)))
		b = append(b, k...)
	}
	return b
}

// DecodeChain splits a Fetch request's value into its keys, which alias v.
// It rejects an empty or oversized key, a value that ends inside a key,
// and more than MaxChainKeys keys.
func DecodeChain(v []byte) ([][]byte, error) {
	var keys [][]byte
	for len(v) > 0 {
		if len(keys) == MaxChainKeys {
			return nil, fmt.Errorf("%w: a chain of more than %d keys", ErrProtocol, MaxChainKeys)
		}
		if len(v) < 2 {
			return nil, fmt.Errorf("%w: chain ends inside a key's length", ErrProtocol)
		}
		n := int(binary.LittleEndian.Uint16(v))
		switch {
		case n == 0:
			return nil, fmt.Errorf("%w: empty key %d in the chain", ErrProtocol, len(keys))
		case n > MaxKeyBytes:
			return nil, fmt.Errorf("%w: key %d of the chain has %d bytes, more than %d", ErrProtocol, len(keys), n, MaxKeyBytes)
		case len(v) < 2+n:
			return nil, fmt.Errorf("%w: chain ends inside key %d", ErrProtocol, len(keys))
		}
		keys = append(keys, v[2:2+n:2+n])
		v = v[2+n:]
	}
	return keys, nil
}

// FetchResult is one key's outcome in a Fetch response.
type FetchResult struct {
	Status  uint8 // a gRPC code
	Source  string
	Size    uint64
	Took    time.Duration
	Message string
}

// AppendFetchResults appends rs as a Fetch response's value. A source
// longer than 255 bytes or a message longer than MaxFetchMessageBytes is
// cut.
func AppendFetchResults(b []byte, rs []FetchResult) []byte {
	for _, r := range rs {
		src, msg := r.Source, r.Message
		if len(src) > 255 {
			src = src[:255]
		}
		if len(msg) > MaxFetchMessageBytes {
			msg = msg[:MaxFetchMessageBytes]
		}
		var h [fetchResultHeaderBytes]byte
		h[0] = r.Status
		h[1] = byte(len(src))
		binary.LittleEndian.PutUint16(h[2:], uint16(len(msg)))
		binary.LittleEndian.PutUint64(h[4:], r.Size)
		binary.LittleEndian.PutUint64(h[12:], uint64(max(r.Took, 0)))
		b = append(append(append(b, h[:]...), src...), msg...)
	}
	return b
}

// DecodeFetchResults decodes a Fetch response's value, which must hold
// exactly n results.
func DecodeFetchResults(v []byte, n int) ([]FetchResult, error) {
	out := make([]FetchResult, 0, max(0, min(n, len(v)/fetchResultHeaderBytes)))
	for len(v) > 0 {
		if len(out) == n {
			return nil, fmt.Errorf("%w: more than the %d fetch results asked for", ErrProtocol, n)
		}
		if len(v) < fetchResultHeaderBytes {
			return nil, fmt.Errorf("%w: fetch results end inside result %d", ErrProtocol, len(out))
		}
		sl, ml := int(v[1]), int(binary.LittleEndian.Uint16(v[2:]))
		took := binary.LittleEndian.Uint64(v[12:])
		switch {
		case v[0] > 16:
			return nil, fmt.Errorf("%w: fetch result %d has status %d, not a gRPC code", ErrProtocol, len(out), v[0])
		case ml > MaxFetchMessageBytes:
			return nil, fmt.Errorf("%w: fetch result %d has a %d-byte message", ErrProtocol, len(out), ml)
		case took > 1<<63-1:
			return nil, fmt.Errorf("%w: fetch result %d took %d ns", ErrProtocol, len(out), took)
		case len(v) < fetchResultHeaderBytes+sl+ml:
			return nil, fmt.Errorf("%w: fetch results end inside result %d", ErrProtocol, len(out))
		}
		rest := v[fetchResultHeaderBytes:]
		out = append(out, FetchResult{Status: v[0], Size: binary.LittleEndian.Uint64(v[4:]), Took: time.Duration(took),
			Source: string(rest[:sl]), Message: string(rest[sl : sl+ml])})
		v = rest[sl+ml:]
	}
	if len(out) != n {
		return nil, fmt.Errorf("%w: %d fetch results for a chain of %d keys", ErrProtocol, len(out), n)
	}
	return out, nil
}
