package api

import (
	"context"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"

	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

// grpcPath moves bytes as protobuf over the KVPoolService's Put and Get
// streams: the portable path any gRPC client can take, and the slowest
// (protobuf copies each chunk twice).
type grpcPath struct {
	rpc kvpoolv1.KVPoolServiceClient
}

// grpcChunkBytes is the size of the chunks a Put stream carries.
const grpcChunkBytes = 1 << 20

func (p *grpcPath) close() error { return nil }

func protoKey(k BlockKey) *kvpoolv1.BlockKey {
	return &kvpoolv1.BlockKey{Tenant: k.Tenant, Namespace: k.Namespace, Key: k.Key}
}

func (p *grpcPath) put(ctx context.Context, k BlockKey, value []byte, copies uint32) (PutResult, error) {
	stream, err := p.rpc.Put(ctx)
	if err != nil {
		return PutResult{}, FromStatus(err)
	}
	crc := Checksum(value)
	hdr := &kvpoolv1.PutHeader{Key: protoKey(k), SizeBytes: uint64(len(value)), Crc32C: &crc, Replicas: copies}
	if err := stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Header{Header: hdr}}); err != nil {
		_, err = stream.CloseAndRecv()
		return PutResult{}, FromStatus(err)
	}
	for off := 0; off < len(value); off += grpcChunkBytes {
		chunk := value[off:min(off+grpcChunkBytes, len(value))]
		if err := stream.Send(&kvpoolv1.PutRequest{Msg: &kvpoolv1.PutRequest_Chunk{Chunk: chunk}}); err != nil {
			break // the real error comes from CloseAndRecv
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return PutResult{}, FromStatus(err)
	}
	return PutResult{Existed: resp.GetExisted(), CRC: resp.GetCrc32C()}, nil
}

func (p *grpcPath) get(ctx context.Context, k BlockKey, dst []byte, l lease) ([]byte, error) {
	v, _, err := p.read(ctx, k, dst, l)
	return v, err
}

// read is get that also returns the value's checksum, verified against
// the node's.
func (p *grpcPath) read(ctx context.Context, k BlockKey, dst []byte, l lease) ([]byte, uint32, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := p.rpc.Get(ctx, &kvpoolv1.GetRequest{Key: protoKey(k), LeaseMs: l.ms, Lease: l.on})
	if err != nil {
		return nil, 0, FromStatus(err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, 0, FromStatus(err)
	}
	info := first.GetInfo()
	if info == nil {
		return nil, 0, fmt.Errorf("%w: client: get stream did not start with block info", ErrInternal)
	}
	n := info.GetSizeBytes()
	if dst == nil {
		dst = make([]byte, n)
	}
	if uint64(len(dst)) < n {
		return nil, 0, shortBuffer(len(dst), n)
	}
	dst = dst[:n]
	off := 0
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, 0, FromStatus(err)
		}
		chunk := m.GetChunk()
		if len(chunk) > len(dst)-off {
			return nil, 0, fmt.Errorf("%w: client: get stream longer than its %d-byte block", ErrDataLoss, n)
		}
		off += copy(dst[off:], chunk)
	}
	if off != len(dst) {
		return nil, 0, fmt.Errorf("%w: client: get stream carried %d of %d bytes", ErrDataLoss, off, n)
	}
	crc := Checksum(dst)
	if crc != info.GetCrc32C() {
		return nil, 0, fmt.Errorf("%w: client: %s: received bytes have CRC %08x, the node stored %08x", ErrDataLoss, k, crc, info.GetCrc32C())
	}
	return dst, crc, nil
}

func (p *grpcPath) view(ctx context.Context, k BlockKey, l lease) (*View, error) {
	return copyView(p.read(ctx, k, nil, l))
}

func (p *grpcPath) reserve(_ context.Context, k BlockKey, size int) (*Reservation, error) {
	return &Reservation{path: p, k: k, mem: make([]byte, size)}, nil
}

func (p *grpcPath) putMany(ctx context.Context, tenant, namespace string, keys, values [][]byte) ([]error, error) {
	return putEach(ctx, p, tenant, namespace, keys, values)
}

func (p *grpcPath) remove(ctx context.Context, tenant, namespace string, keys [][]byte, force bool) ([]error, error) {
	errs := make([]error, len(keys))
	for i, k := range keys {
		_, err := p.rpc.Remove(ctx, &kvpoolv1.RemoveRequest{Key: &kvpoolv1.BlockKey{Tenant: tenant, Namespace: namespace, Key: k}, Force: force})
		errs[i] = FromStatus(err)
		switch Code(errs[i]) {
		case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
			return errs, errs[i] // the call, not the key, failed
		}
	}
	return errs, nil
}
