package wire

import (
	"bytes"
	"errors"
	"io"
	"math"
	"testing"
)

func TestRequestRoundTrip(t *testing.T) {
	in := Request{Op: OpPut, Flags: FlagChecksum, CRC: 0xdeadbeef, Replicas: 3, ValueLen: 2 << 20, Handle: 77,
		Tenant: []byte("acme"), Namespace: []byte("llama3-8b"), Key: bytes.Repeat([]byte{9}, MaxKeyBytes)}
	b := AppendRequest(nil, &in)
	var out Request
	buf := make([]byte, RequestBufferBytes)
	if err := ReadRequest(bytes.NewReader(b), buf, &out); err != nil {
		t.Fatal(err)
	}
	if out.Op != in.Op || out.Flags != in.Flags || out.CRC != in.CRC || out.Replicas != in.Replicas || out.ValueLen != in.ValueLen || out.Handle != in.Handle ||
		!bytes.Equal(out.Tenant, in.Tenant) || !bytes.Equal(out.Namespace, in.Namespace) || !bytes.Equal(out.Key, in.Key) {
		t.Fatalf("round trip: got %+v, want %+v", out, in)
	}
}

func TestLeaseAndForceRoundTrip(t *testing.T) {
	for _, in := range []Request{
		{Op: OpGet, Flags: FlagLease, LeaseMs: 1500, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")},
		{Op: OpView, Flags: FlagLease, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")},
		{Op: OpRemove, Flags: FlagForce, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")},
		{Op: OpCommit, Flags: FlagChecksum, Replicas: 3, Handle: 9},
		{Op: OpFetch, TimeoutMs: 2500, ValueLen: 12, Tenant: []byte("t"), Namespace: []byte("n")},
		{Op: OpFetch, ValueLen: 12, CallOverheadUs: 87, Tenant: []byte("t"), Namespace: []byte("n")},
		{Op: OpFetch, ValueLen: 12, CallOverheadUs: 87, PreviousCallBlocks: 64, Tenant: []byte("t"), Namespace: []byte("n")},
		{Op: OpFetch, ValueLen: 12, CallOverheadUs: math.MaxUint32, PreviousCallBlocks: math.MaxUint32, Tenant: []byte("t"), Namespace: []byte("n")},
	} {
		var out Request
		if err := ReadRequest(bytes.NewReader(AppendRequest(nil, &in)), make([]byte, RequestBufferBytes), &out); err != nil {
			t.Fatalf("%v: %v", in.Op, err)
		}
		if out.Op != in.Op || out.Flags != in.Flags || out.LeaseMs != in.LeaseMs || out.Replicas != in.Replicas || out.Handle != in.Handle || out.TimeoutMs != in.TimeoutMs ||
			out.CallOverheadUs != in.CallOverheadUs || out.PreviousCallBlocks != in.PreviousCallBlocks {
			t.Errorf("round trip: got %+v, want %+v", out, in)
		}
	}
}

// An overhead past the header's 32 bits saturates rather than spill into
// the previous call's block count.
func TestCallOverheadSaturates(t *testing.T) {
	in := Request{Op: OpFetch, ValueLen: 12, CallOverheadUs: 1 << 40, PreviousCallBlocks: 3, Tenant: []byte("t"), Namespace: []byte("n")}
	var out Request
	if err := ReadRequest(bytes.NewReader(AppendRequest(nil, &in)), make([]byte, RequestBufferBytes), &out); err != nil {
		t.Fatal(err)
	}
	if out.CallOverheadUs != math.MaxUint32 || out.PreviousCallBlocks != 3 {
		t.Fatalf("got overhead %d, blocks %d; want %d, 3", out.CallOverheadUs, out.PreviousCallBlocks, uint64(math.MaxUint32))
	}
}

func TestResponseRoundTrip(t *testing.T) {
	in := Response{Status: 5, Flags: FlagExisted | FlagClose, CRC: 1, ValueLen: 2, Offset: 3, Handle: 4, Message: "no block"}
	var out Response
	if err := ReadResponse(bytes.NewReader(AppendResponse(nil, &in)), &out); err != nil {
		t.Fatal(err)
	}
	if out != in {
		t.Fatalf("got %+v, want %+v", out, in)
	}
}

func TestDecodeRejects(t *testing.T) {
	good := AppendRequest(nil, &Request{Op: OpGet, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")})
	mut := func(f func(b []byte)) []byte { b := bytes.Clone(good); f(b); return b }
	cases := map[string][]byte{
		"op zero":           mut(func(b []byte) { b[0] = 0 }),
		"unknown op":        mut(func(b []byte) { b[0] = byte(NumOps) }),
		"unknown flag":      mut(func(b []byte) { b[1] = 0x80 }),
		"reserved bytes":    mut(func(b []byte) { b[6] = 1 }),
		"replicas on a get": mut(func(b []byte) { b[12] = 2 }),
		"force on a get":    mut(func(b []byte) { b[1] = FlagForce }),
		"checksum on a get": mut(func(b []byte) { b[1] = FlagChecksum }),
		"long tenant":       mut(func(b []byte) { b[2] = MaxNameBytes + 1 }),
		"long key":          mut(func(b []byte) { b[4], b[5] = 0, 1 }),
	}
	for name, b := range cases {
		var r Request
		if err := ReadRequest(bytes.NewReader(b), make([]byte, RequestBufferBytes), &r); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
	var r Request
	if err := ReadRequest(bytes.NewReader(good[:10]), make([]byte, RequestBufferBytes), &r); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("short header: %v, want ErrUnexpectedEOF", err)
	}
	if err := ReadRequest(bytes.NewReader(nil), make([]byte, RequestBufferBytes), &r); err != io.EOF {
		t.Errorf("no bytes: %v, want io.EOF", err)
	}
	if _, err := DecodeTrailer(AppendTrailer(nil, 5)[:7]); !errors.Is(err, ErrProtocol) {
		t.Errorf("short trailer: %v", err)
	}
	if crc, err := DecodeTrailer(AppendTrailer(nil, 5)); err != nil || crc != 5 {
		t.Errorf("trailer: %v %v", crc, err)
	}
}

func TestHelloRoundTrip(t *testing.T) {
	in := Hello{SegmentBytes: 1 << 34, PageBytes: 4096, VersionWords: 1 << 22, NodeID: "gpu-node-7"}
	var out Hello
	if err := DecodeHello(AppendHello(nil, &in), &out); err != nil || out != in {
		t.Fatalf("got %+v %v, want %+v", out, err, in)
	}
}

// FuzzDecodeRequest feeds arbitrary bytes to the request decoder: it must
// never panic, and whatever it accepts must re-encode to the same bytes.
func FuzzDecodeRequest(f *testing.F) {
	f.Add(AppendRequest(nil, &Request{Op: OpPut, ValueLen: 5, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")}))
	f.Add(AppendRequest(nil, &Request{Op: OpRelease, Handle: 1}))
	f.Add([]byte("KVPD\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Request
		err := ReadRequest(bytes.NewReader(b), make([]byte, RequestBufferBytes), &r)
		if err != nil {
			return
		}
		re := AppendRequest(nil, &r)
		if !bytes.Equal(re, b[:len(re)]) {
			t.Fatalf("accepted %x but re-encodes as %x", b[:len(re)], re)
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(AppendResponse(nil, &Response{Status: 5, Message: "x"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Response
		if err := ReadResponse(bytes.NewReader(b), &r); err != nil {
			return
		}
		if re := AppendResponse(nil, &r); !bytes.Equal(re, b[:len(re)]) {
			t.Fatalf("accepted %x but re-encodes as %x", b[:len(re)], re)
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	f.Add(AppendHello(nil, &Hello{SegmentBytes: 4096, PageBytes: 4096, NodeID: "n"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Hello
		if err := DecodeHello(b, &h); err != nil {
			return
		}
		if re := AppendHello(nil, &h); !bytes.Equal(re, b) {
			t.Fatalf("accepted %x but re-encodes as %x", b, re)
		}
	})
}

// FuzzPreambleToken feeds arbitrary bytes after a preamble's first five:
// the reader never panics nor reads past a token's announced length, and
// whatever it accepts re-encodes to the same bytes.
func FuzzPreambleToken(f *testing.F) {
	f.Add(AppendPreamble(nil, Preamble, "kvp_token"))
	f.Add(Preamble[:])
	f.Add([]byte("KVPD\x01\x01\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 8 {
			return
		}
		var pre [8]byte
		copy(pre[:], b)
		copy(pre[:5], Preamble[:5])
		r := bytes.NewReader(b[8:])
		tok, err := ReadPreambleToken(r, pre)
		if err != nil {
			return
		}
		if len(tok) > MaxTokenBytes {
			t.Fatalf("accepted a %d-byte token", len(tok))
		}
		if re := AppendPreamble(nil, Preamble, tok); !bytes.Equal(re, append(pre[:], b[8:8+len(tok)]...)) {
			t.Fatalf("accepted %x but re-encodes as %x", append(pre[:], b[8:8+len(tok)]...), re)
		}
	})
}
