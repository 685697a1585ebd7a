package pool

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/transfer"
)

// Every test here feeds a node bad input and then checks the three
// promises: the right error, no committed block lost or altered, and the
// node still serving.

// sentinel is a block committed before the bad input; intact checks it.
type sentinel struct {
	k api.BlockKey
	v []byte
}

func putSentinel(t *testing.T, c *api.Client) sentinel {
	t.Helper()
	s := sentinel{api.BlockKey{Tenant: "keep", Namespace: "safe", Key: []byte("sentinel")}, value(42, 300_000)}
	if err := c.Put(context.Background(), s.k, s.v); err != nil {
		t.Fatal(err)
	}
	return s
}

// intact verifies the sentinel, that a fresh put and get still work, that
// no reservation is left open, and that the store's books balance.
func intact(t *testing.T, n *Node, c *api.Client, s sentinel) {
	t.Helper()
	ctx := context.Background()
	got, err := c.GetValue(ctx, s.k)
	if err != nil || !bytes.Equal(got, s.v) {
		t.Fatalf("sentinel block lost or altered: err=%v", err)
	}
	k := api.BlockKey{Tenant: "keep", Namespace: "safe", Key: []byte(time.Now().String())}
	if err := c.Put(ctx, k, []byte("still serving")); err != nil {
		t.Fatalf("node stopped serving puts: %v", err)
	}
	if err := c.Remove(ctx, k); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "open reservations to drain (all but the sessions' spares)", 10*time.Second, func() bool {
		return n.Store().Stats().Reservations == uint64(n.data.spares.Load())
	})
	if err := n.Store().Check(); err != nil {
		t.Fatal(err)
	}
}

// rawConn opens a data connection the test drives by hand.
func rawConn(t *testing.T, n *Node) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", n.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write(wire.Preamble[:]); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func putFrame(k api.BlockKey, declared uint64, body []byte, crc uint32, flags uint8) []byte {
	r := wire.Request{Op: wire.OpPut, Flags: flags, ValueLen: declared, Tenant: []byte(k.Tenant), Namespace: []byte(k.Namespace), Key: k.Key}
	b := wire.AppendRequest(nil, &r)
	b = append(b, body...)
	return wire.AppendTrailer(b, crc)
}

func readStatus(t *testing.T, c net.Conn) (codes.Code, string) {
	t.Helper()
	var resp wire.Response
	if err := wire.ReadResponse(c, &resp); err != nil {
		t.Fatalf("no response: %v", err)
	}
	return codes.Code(resp.Status), resp.Message
}

// expectClosed checks that the node closed a connection it cannot trust.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	var b [1]byte
	if _, err := c.Read(b[:]); !errors.Is(err, io.EOF) {
		t.Fatalf("connection still open after a protocol error: %v", err)
	}
}

func TestBadKeysAndNames(t *testing.T) {
	n := startNode(t)
	long := bytes.Repeat([]byte("k"), api.MaxKeyBytes+1)
	cases := []struct {
		name string
		k    api.BlockKey
	}{
		{"empty key", api.BlockKey{Tenant: "t", Namespace: "n", Key: nil}},
		{"oversized key", api.BlockKey{Tenant: "t", Namespace: "n", Key: long}},
		{"tenant with slash", api.BlockKey{Tenant: "a/b", Namespace: "n", Key: []byte("k")}},
		{"tenant with space", api.BlockKey{Tenant: "a b", Namespace: "n", Key: []byte("k")}},
		{"namespace with unicode", api.BlockKey{Tenant: "t", Namespace: "modèle", Key: []byte("k")}},
		{"empty tenant", api.BlockKey{Tenant: "", Namespace: "n", Key: []byte("k")}},
		{"empty namespace", api.BlockKey{Tenant: "t", Namespace: "", Key: []byte("k")}},
		{"long tenant", api.BlockKey{Tenant: strings.Repeat("t", 65), Namespace: "n", Key: []byte("k")}},
	}
	for _, path := range []api.Path{api.PathData, api.PathGRPC, api.PathShm} {
		c := dial(t, n, path)
		s := putSentinel(t, c)
		for _, tc := range cases {
			t.Run(path.String()+"/"+tc.name, func(t *testing.T) {
				ctx := context.Background()
				if err := c.Put(ctx, tc.k, []byte("v")); !errors.Is(err, api.ErrInvalidArgument) {
					t.Errorf("client put: %v, want InvalidArgument", err)
				}
				if _, err := c.GetValue(ctx, tc.k); !errors.Is(err, api.ErrInvalidArgument) {
					t.Errorf("client get: %v, want InvalidArgument", err)
				}
				// The client checks first; make sure the node does too.
				switch path {
				case api.PathGRPC:
					_, err := kvpoolv1.NewKVPoolServiceClient(c.Conn()).BatchPut(ctx, &kvpoolv1.BatchPutRequest{Items: []*kvpoolv1.BatchPutItem{{Key: &kvpoolv1.BlockKey{Tenant: tc.k.Tenant, Namespace: tc.k.Namespace, Key: tc.k.Key}, Value: []byte("v")}}})
					if err != nil {
						t.Fatal(err)
					}
					_, err = kvpoolv1.NewKVPoolServiceClient(c.Conn()).Remove(ctx, &kvpoolv1.RemoveRequest{Key: &kvpoolv1.BlockKey{Tenant: tc.k.Tenant, Namespace: tc.k.Namespace, Key: tc.k.Key}})
					if got := api.Code(err); got != codes.InvalidArgument {
						t.Errorf("node remove: %v, want InvalidArgument", got)
					}
				case api.PathData:
					raw := rawConn(t, n)
					if len(tc.k.Tenant) > wire.MaxNameBytes || len(tc.k.Key) > wire.MaxKeyBytes {
						return // not encodable; TestOversizedKeyFrameClosesConnection covers it
					}
					raw.Write(putFrame(tc.k, 1, []byte("v"), 0, 0))
					if code, msg := readStatus(t, raw); code != codes.InvalidArgument {
						t.Errorf("node put: %v %q, want InvalidArgument", code, msg)
					}
				}
			})
		}
		intact(t, n, c, s)
	}
}

func TestOversizedKeyFrameClosesConnection(t *testing.T) {
	n := startNode(t)
	c := dial(t, n, api.PathData)
	s := putSentinel(t, c)
	raw := rawConn(t, n)
	h := wire.AppendRequest(nil, &wire.Request{Op: wire.OpGet, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")})
	h[4], h[5] = 200, 0 // key length 200 > 128
	raw.Write(h)
	if code, _ := readStatus(t, raw); code != codes.InvalidArgument {
		t.Fatalf("got %v, want InvalidArgument", code)
	}
	expectClosed(t, raw)
	intact(t, n, c, s)
}

// A Fetch frame whose chain is malformed or larger than any chain closes
// the connection with InvalidArgument; the node is intact.
func TestMalformedFetchFrameClosesConnection(t *testing.T) {
	n := startNode(t)
	c := dial(t, n, api.PathData)
	s := putSentinel(t, c)
	for name, chain := range map[string][]byte{
		"empty key":         wire.AppendChain(nil, [][]byte{[]byte("a"), {}}),
		"ends inside a key": wire.AppendChain(nil, [][]byte{[]byte("abc")})[:4],
		"oversized":         nil, // declares more than MaxChainBytes
	} {
		t.Run(name, func(t *testing.T) {
			raw := rawConn(t, n)
			declared := uint64(len(chain))
			if chain == nil {
				declared = wire.MaxChainBytes + 1
			}
			raw.Write(append(wire.AppendRequest(nil, &wire.Request{Op: wire.OpFetch, Tenant: []byte("t"), Namespace: []byte("n"), ValueLen: declared}), chain...))
			if code, msg := readStatus(t, raw); code != codes.InvalidArgument {
				t.Fatalf("got %v %q, want InvalidArgument", code, msg)
			}
			expectClosed(t, raw)
		})
	}
	intact(t, n, c, s)
}

func TestBlockOverMaxBlockSize(t *testing.T) {
	n := startNode(t, func(c *Config) { c.MaxBlockBytes = 1 << 20 })
	ctx := context.Background()
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("big")}
	big := make([]byte, 1<<20+1)
	for _, path := range []api.Path{api.PathData, api.PathGRPC, api.PathShm} {
		t.Run(path.String(), func(t *testing.T) {
			c := dial(t, n, path)
			s := putSentinel(t, c)
			if err := c.Put(ctx, k, big); !errors.Is(err, api.ErrInvalidArgument) {
				t.Fatalf("put of max+1 bytes: %v, want InvalidArgument", err)
			}
			if err := c.Put(ctx, k, big[:1<<20]); err != nil {
				t.Fatalf("put of exactly max bytes: %v", err)
			}
			if err := c.Remove(ctx, k); err != nil {
				t.Fatal(err)
			}
			intact(t, n, c, s)
		})
	}
	t.Run("data frame declaring a huge size", func(t *testing.T) {
		c := dial(t, n, api.PathData)
		s := putSentinel(t, c)
		raw := rawConn(t, n)
		raw.Write(putFrame(k, 1<<40, nil, 0, 0)[:wire.RequestHeaderBytes+1+1+3])
		if code, _ := readStatus(t, raw); code != codes.InvalidArgument {
			t.Fatalf("got %v, want InvalidArgument", code)
		}
		expectClosed(t, raw)
		intact(t, n, c, s)
	})
}

func TestSizeHeaderDisagreesWithBytes(t *testing.T) {
	n := startNode(t)
	c := dial(t, n, api.PathData)
	s := putSentinel(t, c)
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("liar")}
	body := value(1, 1000)

	t.Run("data: more bytes than declared", func(t *testing.T) {
		raw := rawConn(t, n)
		// Declares 900 bytes, sends 1000: the trailer lands inside the value.
		raw.Write(putFrame(k, 900, body, api.Checksum(body), wire.FlagChecksum))
		if code, msg := readStatus(t, raw); code != codes.InvalidArgument || !strings.Contains(msg, "trailer") {
			t.Fatalf("got %v %q, want InvalidArgument about the trailer", code, msg)
		}
		expectClosed(t, raw)
	})
	t.Run("data: fewer bytes than declared", func(t *testing.T) {
		raw := rawConn(t, n)
		raw.Write(putFrame(k, 1100, body, api.Checksum(body), wire.FlagChecksum))
		raw.(*net.TCPConn).CloseWrite() // nothing more will come
		expectClosed(t, raw)
	})
	for _, tc := range []struct {
		name     string
		declared uint64
	}{{"grpc: more bytes than declared", 900}, {"grpc: fewer bytes than declared", 1100}} {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := kvpoolv1.NewKVPoolServiceClient(c.Conn()).Put(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Header{Header: &kvpoolv1.PutHeader{Key: &kvpoolv1.BlockKey{Tenant: k.Tenant, Namespace: k.Namespace, Key: k.Key}, SizeBytes: tc.declared}}})
			stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Chunk{Chunk: body[:500]}})
			stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Chunk{Chunk: body[500:]}})
			_, err = stream.CloseAndRecv()
			if got := api.Code(err); got != codes.InvalidArgument {
				t.Fatalf("got %v (%v), want InvalidArgument", got, err)
			}
		})
	}
	if _, err := c.GetValue(context.Background(), k); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a mis-sized put left a block behind: %v", err)
	}
	intact(t, n, c, s)
}

func TestTruncatedAndAbandonedPuts(t *testing.T) {
	n := startNode(t)
	c := dial(t, n, api.PathData)
	s := putSentinel(t, c)
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("half")}
	body := value(2, 2<<20)

	t.Run("data: client disconnects mid-value", func(t *testing.T) {
		raw := rawConn(t, n)
		f := putFrame(k, uint64(len(body)), body, api.Checksum(body), wire.FlagChecksum)
		raw.Write(f[:len(f)/2])
		eventually.True(t, "the reservation to open", 10*time.Second, func() bool { return n.Store().Stats().Reservations == 1 })
		raw.Close()
	})
	t.Run("data: stream ends inside the trailer", func(t *testing.T) {
		raw := rawConn(t, n)
		f := putFrame(k, uint64(len(body)), body, api.Checksum(body), wire.FlagChecksum)
		raw.Write(f[:len(f)-3])
		raw.(*net.TCPConn).CloseWrite()
		expectClosed(t, raw)
	})
	t.Run("grpc: client sends half and closes the stream", func(t *testing.T) {
		stream, err := kvpoolv1.NewKVPoolServiceClient(c.Conn()).Put(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Header{Header: &kvpoolv1.PutHeader{Key: &kvpoolv1.BlockKey{Tenant: k.Tenant, Namespace: k.Namespace, Key: k.Key}, SizeBytes: uint64(len(body))}}})
		stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Chunk{Chunk: body[:1<<20]}})
		_, err = stream.CloseAndRecv()
		if got := api.Code(err); got != codes.InvalidArgument {
			t.Fatalf("got %v, want InvalidArgument", got)
		}
	})
	t.Run("grpc: client cancels mid-stream", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		stream, err := kvpoolv1.NewKVPoolServiceClient(c.Conn()).Put(ctx)
		if err != nil {
			t.Fatal(err)
		}
		stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Header{Header: &kvpoolv1.PutHeader{Key: &kvpoolv1.BlockKey{Tenant: k.Tenant, Namespace: k.Namespace, Key: k.Key}, SizeBytes: uint64(len(body))}}})
		stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Chunk{Chunk: body[:1<<20]}})
		eventually.True(t, "the reservation to open", 10*time.Second, func() bool { return n.Store().Stats().Reservations >= 1 })
		cancel()
	})
	t.Run("grpc: stalled stream outlives the reservation timeout", func(t *testing.T) {
		// Send the header and nothing more, without closing the stream:
		// the node gives up after ReservationTimeout.
		stream2, err := kvpoolv1.NewKVPoolServiceClient(c.Conn()).Put(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		stream2.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Header{Header: &kvpoolv1.PutHeader{Key: &kvpoolv1.BlockKey{Tenant: k.Tenant, Namespace: k.Namespace, Key: k.Key}, SizeBytes: uint64(len(body))}}})
		var resp kvpoolv1.PutResponse
		err = stream2.RecvMsg(&resp)
		if got := api.Code(err); got != codes.FailedPrecondition {
			t.Fatalf("stalled put: %v, want FailedPrecondition after the reservation timeout", err)
		}
	})
	eventually.True(t, "abandoned reservations to be aborted", 10*time.Second, func() bool { return n.Store().Stats().Reservations == 0 })
	if _, err := c.GetValue(context.Background(), k); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a truncated put left a block behind: %v", err)
	}
	intact(t, n, c, s)
}

func TestChecksumMismatch(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	c := dial(t, n, api.PathData)
	s := putSentinel(t, c)
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("crc")}
	body := value(3, 64<<10)
	wrong := api.Checksum(body) ^ 1

	t.Run("data", func(t *testing.T) {
		raw := rawConn(t, n)
		raw.Write(putFrame(k, uint64(len(body)), body, wrong, wire.FlagChecksum))
		if code, _ := readStatus(t, raw); code != codes.DataLoss {
			t.Fatalf("got %v, want DataLoss", code)
		}
		// The frame was well formed, so the connection stays usable.
		raw.Write(putFrame(k, uint64(len(body)), body, api.Checksum(body), wire.FlagChecksum))
		if code, msg := readStatus(t, raw); code != codes.OK {
			t.Fatalf("put on the same connection after DataLoss: %v %q", code, msg)
		}
		if err := c.Remove(ctx, k); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("grpc", func(t *testing.T) {
		stream, _ := kvpoolv1.NewKVPoolServiceClient(c.Conn()).Put(ctx)
		stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Header{Header: &kvpoolv1.PutHeader{Key: &kvpoolv1.BlockKey{Tenant: k.Tenant, Namespace: k.Namespace, Key: k.Key}, SizeBytes: uint64(len(body)), Crc32C: &wrong}}})
		stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Chunk{Chunk: body}})
		if _, err := stream.CloseAndRecv(); api.Code(err) != codes.DataLoss {
			t.Fatalf("got %v, want DataLoss", err)
		}
		res, err := kvpoolv1.NewKVPoolServiceClient(c.Conn()).BatchPut(ctx, &kvpoolv1.BatchPutRequest{Items: []*kvpoolv1.BatchPutItem{{Key: &kvpoolv1.BlockKey{Tenant: k.Tenant, Namespace: k.Namespace, Key: k.Key}, Value: body, Crc32C: &wrong}}})
		if err != nil || codes.Code(res.GetResults()[0].GetStatus().GetCode()) != codes.DataLoss {
			t.Fatalf("batch put with a wrong crc: %v %v, want DataLoss", res, err)
		}
	})
	if _, err := c.GetValue(ctx, k); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a put with a bad checksum was stored: %v", err)
	}
	intact(t, n, c, s)
}

// shmRaw is a raw unix-socket session: hello read, fd ignored.
func shmRaw(t *testing.T, n *Node) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: n.ShmSocket(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	buf := make([]byte, 512)
	oob := make([]byte, 64)
	if _, _, _, _, err := c.ReadMsgUnix(buf, oob); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func TestShmCommitChecksumMismatch(t *testing.T) {
	n := startNode(t)
	c := dial(t, n, api.PathData)
	s := putSentinel(t, c)
	raw := shmRaw(t, n)
	req := wire.Request{Op: wire.OpReserve, ValueLen: 5000, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("shm-crc")}
	raw.Write(wire.AppendRequest(nil, &req))
	var resp wire.Response
	if err := wire.ReadResponse(raw, &resp); err != nil || resp.Status != 0 {
		t.Fatalf("reserve: %v %+v", err, resp)
	}
	// The bytes in the reservation are zeros; claim another checksum.
	commit := wire.Request{Op: wire.OpCommit, Flags: wire.FlagChecksum, CRC: 12345, Handle: resp.Handle}
	raw.Write(wire.AppendRequest(nil, &commit))
	if err := wire.ReadResponse(raw, &resp); err != nil || codes.Code(resp.Status) != codes.DataLoss {
		t.Fatalf("commit with a wrong crc: %v %+v, want DataLoss", err, resp)
	}
	intact(t, n, c, s)
}

func TestCapacityExhausted(t *testing.T) {
	n := startNode(t, func(c *Config) { c.CapacityBytes = 8 << 20; c.MaxBlockBytes = 4 << 20; c.DisableEviction = true })
	ctx := context.Background()
	for _, path := range []api.Path{api.PathData, api.PathGRPC, api.PathShm} {
		t.Run(path.String(), func(t *testing.T) {
			c := dial(t, n, path)
			var stored []sentinel
			var err error
			for i := 0; err == nil; i++ {
				s := sentinel{api.BlockKey{Tenant: "t", Namespace: path.String(), Key: []byte{byte(i)}}, value(uint64(i), 1<<20+77)}
				if err = c.Put(ctx, s.k, s.v); err == nil {
					stored = append(stored, s)
				}
			}
			if !errors.Is(err, api.ErrResourceExhausted) {
				t.Fatalf("filling the arena ended with %v, want ResourceExhausted", err)
			}
			if len(stored) < 6 {
				t.Fatalf("only %d blocks fit in 8 MiB", len(stored))
			}
			for _, s := range stored {
				got, err := c.GetValue(ctx, s.k)
				if err != nil || !bytes.Equal(got, s.v) {
					t.Fatalf("block %x damaged after exhaustion: %v", s.k.Key, err)
				}
			}
			// Still serving: removing one block makes room again.
			if err := c.Remove(ctx, stored[0].k); err != nil {
				t.Fatal(err)
			}
			if err := c.Put(ctx, stored[0].k, stored[0].v); err != nil {
				t.Fatalf("put after freeing space: %v", err)
			}
			for _, s := range stored {
				if err := c.Remove(ctx, s.k); err != nil {
					t.Fatal(err)
				}
			}
			if err := n.Store().Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestGetMissing(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	for _, path := range []api.Path{api.PathData, api.PathGRPC, api.PathShm} {
		c := dial(t, n, path)
		for _, k := range []api.BlockKey{
			{Tenant: "nobody", Namespace: "nothing", Key: []byte("x")}, // unknown namespace
			{Tenant: "keep", Namespace: "safe", Key: []byte("x")},      // known namespace, missing key
		} {
			if path == api.PathData {
				putSentinel(t, c)
			}
			if _, err := c.GetValue(ctx, k); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("%v get %v: %v, want NotFound", path, k, err)
			}
			if err := c.Remove(ctx, k); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("%v remove %v: %v, want NotFound", path, k, err)
			}
			if _, err := c.View(ctx, k); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("%v view %v: %v, want NotFound", path, k, err)
			}
		}
	}
}

func TestConcurrentPutsOfOneKey(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	const writers = 16
	for _, path := range []api.Path{api.PathData, api.PathGRPC, api.PathShm} {
		c := dial(t, n, path)
		s := putSentinel(t, c)
		t.Run(path.String()+"/equal bytes", func(t *testing.T) {
			k := api.BlockKey{Tenant: "t", Namespace: "same", Key: []byte(path.String())}
			v := value(9, 512<<10)
			var wg sync.WaitGroup
			var mu sync.Mutex
			existed := 0
			for range writers {
				wg.Go(func() {
					res, err := c.PutResult(ctx, k, v)
					if err != nil {
						t.Errorf("concurrent put of equal bytes: %v", err)
					}
					mu.Lock()
					if res.Existed {
						existed++
					}
					mu.Unlock()
				})
			}
			wg.Wait()
			if existed != writers-1 {
				t.Errorf("%d puts found the block existing, want %d", existed, writers-1)
			}
			got, err := c.GetValue(ctx, k)
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("stored value wrong: %v", err)
			}
		})
		t.Run(path.String()+"/different bytes", func(t *testing.T) {
			k := api.BlockKey{Tenant: "t", Namespace: "diff", Key: []byte(path.String())}
			vals := make([][]byte, writers)
			won := make([]bool, writers)
			var wg sync.WaitGroup
			for i := range writers {
				vals[i] = value(uint64(100+i), 256<<10)
				wg.Go(func() {
					err := c.Put(ctx, k, vals[i])
					switch {
					case err == nil:
						won[i] = true
					case !errors.Is(err, api.ErrAlreadyExists):
						t.Errorf("writer %d: %v, want success or AlreadyExists", i, err)
					}
				})
			}
			wg.Wait()
			winners := 0
			var want []byte
			for i, w := range won {
				if w {
					winners++
					want = vals[i]
				}
			}
			if winners != 1 {
				t.Fatalf("%d writers won, want exactly 1", winners)
			}
			got, err := c.GetValue(ctx, k)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("stored value is not the winner's: %v", err)
			}
		})
		intact(t, n, c, s)
	}
}

// A Put stream that sends no message at all is the client's mistake
// (InvalidArgument), not the node's (Internal "EOF").
func TestPutStreamWithoutMessages(t *testing.T) {
	n := startNode(t)
	c := dial(t, n, api.PathGRPC)
	s := putSentinel(t, c)
	stream, err := kvpoolv1.NewKVPoolServiceClient(c.Conn()).Put(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, err = stream.CloseAndRecv()
	if code := status.Code(err); code != codes.InvalidArgument || !strings.Contains(err.Error(), "header") {
		t.Fatalf("empty put stream: %v (%v), want InvalidArgument naming the missing header", code, err)
	}
	intact(t, n, c, s)
}

// A commit with the writer's checksum stores that checksum without reading
// the block; a wrong one is caught by every reader that crosses a socket,
// never served as good bytes. With FlagChecksum as well the node verifies.
func TestShmCommitWriterChecksum(t *testing.T) {
	n := startNode(t)
	c := dial(t, n, api.PathData)
	raw := shmRaw(t, n)
	commit := func(key string, flags uint8, crc uint32) wire.Response {
		t.Helper()
		req := wire.Request{Op: wire.OpReserve, ValueLen: 5000, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte(key)}
		raw.Write(wire.AppendRequest(nil, &req))
		var resp wire.Response
		if err := wire.ReadResponse(raw, &resp); err != nil || resp.Status != 0 {
			t.Fatalf("reserve: %v %+v", err, resp)
		}
		raw.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpCommit, Flags: flags, CRC: crc, Handle: resp.Handle}))
		if err := wire.ReadResponse(raw, &resp); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	zeros := make([]byte, 5000)
	if resp := commit("right", wire.FlagWriterChecksum, api.Checksum(zeros)); resp.Status != 0 || resp.CRC != api.Checksum(zeros) {
		t.Fatalf("commit with the right writer crc: %+v", resp)
	}
	if got, err := c.GetValue(context.Background(), api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("right")}); err != nil || !bytes.Equal(got, zeros) {
		t.Fatalf("get: %v", err)
	}
	if resp := commit("wrong", wire.FlagWriterChecksum, 12345); resp.Status != 0 || resp.CRC != 12345 {
		t.Fatalf("commit with a wrong writer crc: %+v (stored as given)", resp)
	}
	if _, err := c.GetValue(context.Background(), api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("wrong")}); !errors.Is(err, api.ErrDataLoss) {
		t.Fatalf("get of a block stored with a wrong writer crc: %v, want DataLoss", err)
	}
	if resp := commit("both", wire.FlagWriterChecksum|wire.FlagChecksum, 12345); codes.Code(resp.Status) != codes.DataLoss {
		t.Fatalf("commit with both flags and a wrong crc: %+v, want DataLoss", resp)
	}
}

// A frame that starts and stops has the io timeout for the rest of it,
// not the idle timeout that connections get between frames.
func TestTruncatedFrameEndsAtIOTimeout(t *testing.T) {
	n := startNode(t, func(c *Config) { c.IOTimeout = 200 * time.Millisecond; c.IdleTimeout = time.Hour })
	idle := rawConn(t, n)
	raw := rawConn(t, n)
	r := wire.Request{Op: wire.OpGet, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")}
	raw.Write(wire.AppendRequest(nil, &r)[:10])
	start := time.Now()
	expectClosed(t, raw)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("a truncated frame held its connection for %v; the io timeout is 200ms", d)
	}
	// A connection idle between frames is kept: it still serves.
	idle.Write(wire.AppendRequest(nil, &r))
	if code, _ := readStatus(t, idle); code != codes.NotFound {
		t.Fatalf("the idle connection answered %v, want NotFound", code)
	}
}

// Benchmark frames ask for at most a block's size, and a node can refuse
// them: a 40-byte request used to buy 2^40 bytes of filler.
func TestBenchFramesAreBounded(t *testing.T) {
	n := startNode(t, func(c *Config) { c.MaxBlockBytes = 1 << 20 })
	raw := rawConn(t, n)
	raw.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpSource, ValueLen: 1 << 40}))
	if code, _ := readStatus(t, raw); code != codes.InvalidArgument {
		t.Fatalf("a source of 2^40 bytes: %v, want InvalidArgument", code)
	}
	raw.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpSource, ValueLen: 1 << 20}))
	var resp wire.Response
	if err := wire.ReadResponse(raw, &resp); err != nil || resp.Status != 0 || resp.ValueLen != 1<<20 {
		t.Fatalf("a source of one block: %v %+v", err, resp)
	}
	if _, err := io.CopyN(io.Discard, raw, 1<<20); err != nil {
		t.Fatal(err)
	}
	sink := rawConn(t, n)
	sink.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpSink, ValueLen: 1 << 40}))
	if code, _ := readStatus(t, sink); code != codes.InvalidArgument {
		t.Fatalf("a sink of 2^40 bytes: %v, want InvalidArgument", code)
	}
	expectClosed(t, sink)

	off := startNode(t, func(c *Config) { c.NoBenchFrames = true })
	raw = rawConn(t, off)
	raw.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpSource, ValueLen: 4096}))
	if code, _ := readStatus(t, raw); code != codes.FailedPrecondition {
		t.Fatalf("a source on a node without bench frames: %v, want FailedPrecondition", code)
	}
}

// Transfer connections (after the KVPT preamble) get the same deadlines as
// data connections: idle ones close at the idle timeout, a truncated
// request at the io timeout. They used to stay open forever.
func TestTransferConnectionsTimeOut(t *testing.T) {
	for _, tc := range []struct {
		name      string
		send      []byte
		idle, io  time.Duration
		withinOne time.Duration
	}{
		{"idle after the preamble", nil, 300 * time.Millisecond, time.Hour, 300 * time.Millisecond},
		{"truncated request", []byte{1, 0, 0}, time.Hour, 300 * time.Millisecond, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startNode(t, func(c *Config) { c.IdleTimeout, c.IOTimeout = tc.idle, tc.io })
			c, err := net.Dial("tcp", n.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write(transfer.TCPPreamble[:])
			c.Write(tc.send)
			c.SetDeadline(time.Now().Add(20 * time.Second))
			start := time.Now()
			expectClosed(t, c)
			if d := time.Since(start); d > tc.withinOne+5*time.Second {
				t.Fatalf("closed after %v, want about %v", d, tc.withinOne)
			}
		})
	}
}

// A commit that names the block (a spare reserved ahead, see
// wire.FlagReserveNext) must keep the reservation's tenant and namespace:
// another is refused and leaves the reservation open; the right one
// commits under the new key and brings the next spare.
func TestShmCommitUnderAnotherNameIsChecked(t *testing.T) {
	n := startNode(t)
	raw := shmRaw(t, n)
	roundTrip := func(r *wire.Request) wire.Response {
		t.Helper()
		raw.Write(wire.AppendRequest(nil, r))
		var resp wire.Response
		if err := wire.ReadResponse(raw, &resp); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	res := roundTrip(&wire.Request{Op: wire.OpReserve, ValueLen: 5000, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("reserved")})
	if res.Status != 0 {
		t.Fatalf("reserve: %+v", res)
	}
	for _, c := range []struct{ name, tenant, namespace, key string }{
		{"other namespace", "t", "x", "k"},
		{"other tenant", "u", "n", "k"},
	} {
		r := wire.Request{Op: wire.OpCommit, Flags: wire.FlagWriterChecksum, Handle: res.Handle, Tenant: []byte(c.tenant), Namespace: []byte(c.namespace), Key: []byte(c.key)}
		if got := roundTrip(&r); codes.Code(got.Status) != codes.InvalidArgument {
			t.Fatalf("%s: status %v, want InvalidArgument", c.name, codes.Code(got.Status))
		}
	}
	zeros := make([]byte, 5000)
	got := roundTrip(&wire.Request{Op: wire.OpCommit, Flags: wire.FlagWriterChecksum | wire.FlagReserveNext, CRC: api.Checksum(zeros), Handle: res.Handle, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("renamed")})
	if got.Status != 0 || got.Flags&wire.FlagReserved == 0 || got.Handle == 0 || got.Handle == res.Handle {
		t.Fatalf("commit under a new name: %+v, want OK with a new spare", got)
	}
	c := dial(t, n, api.PathData)
	if v, err := c.GetValue(context.Background(), api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("renamed")}); err != nil || !bytes.Equal(v, zeros) {
		t.Fatalf("the renamed block: %v", err)
	}
	if _, err := c.GetValue(context.Background(), api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("reserved")}); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("the name it was reserved under: %v, want NotFound", err)
	}
	if st := n.Store().Stats(); st.Reservations != 1 {
		t.Fatalf("%d reservations, want the spare", st.Reservations)
	}
}
