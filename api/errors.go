package api

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors shared by every layer. Code wraps them with context
// (fmt.Errorf("...: %w", ErrNotFound)) and tests them with errors.Is. They
// are turned into gRPC codes and back only at the edges, by ToStatus and
// FromStatus, through the one table below.
var (
	// ErrNotFound: no committed block under the key.
	ErrNotFound = errors.New("kvpool: block not found")
	// ErrAlreadyExists: the key holds a block with different bytes.
	ErrAlreadyExists = errors.New("kvpool: block exists with different bytes")
	// ErrResourceExhausted: not enough free space (or quota) for the block.
	ErrResourceExhausted = errors.New("kvpool: resource exhausted")
	// ErrInvalidArgument: a bad key, name, size or request.
	ErrInvalidArgument = errors.New("kvpool: invalid argument")
	// ErrFailedPrecondition: the operation conflicts with the block's state.
	ErrFailedPrecondition = errors.New("kvpool: failed precondition")
	// ErrUnavailable: the node or a peer cannot be reached, or is closing.
	ErrUnavailable = errors.New("kvpool: unavailable")
	// ErrDataLoss: bytes failed their checksum.
	ErrDataLoss = errors.New("kvpool: checksum mismatch")
	// ErrInternal: a bug or an unexpected condition.
	ErrInternal = errors.New("kvpool: internal error")
	// ErrUnauthenticated: the node requires credentials and the caller
	// presented none, or ones it does not accept (unknown, expired,
	// revoked).
	ErrUnauthenticated = errors.New("kvpool: unauthenticated")
	// ErrPermissionDenied: the caller is known but may not do this: another
	// tenant's blocks, or an admin call by a tenant.
	ErrPermissionDenied = errors.New("kvpool: permission denied")
)

// codeTable is the single mapping between sentinel errors and gRPC codes.
var codeTable = []struct {
	err  error
	code codes.Code
}{
	{ErrNotFound, codes.NotFound},
	{ErrAlreadyExists, codes.AlreadyExists},
	{ErrResourceExhausted, codes.ResourceExhausted},
	{ErrInvalidArgument, codes.InvalidArgument},
	{ErrFailedPrecondition, codes.FailedPrecondition},
	{ErrUnavailable, codes.Unavailable},
	{ErrDataLoss, codes.DataLoss},
	{ErrInternal, codes.Internal},
	{ErrUnauthenticated, codes.Unauthenticated},
	{ErrPermissionDenied, codes.PermissionDenied},
	{context.Canceled, codes.Canceled},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
}

// Code classifies err: codes.OK for nil, the table's code for a wrapped
// sentinel, the code of a gRPC status error, and codes.Internal otherwise.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	for _, e := range codeTable {
		if errors.Is(err, e.err) {
			return e.code
		}
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return codes.Internal
}

// ToStatus converts err into a gRPC status error carrying err's message.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return err
	}
	return status.Error(Code(err), err.Error())
}

// FromStatus converts a gRPC status error (or a code and message that came
// over the data channel) back into an error that wraps the matching
// sentinel, so callers can use errors.Is.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	return FromCode(s.Code(), s.Message())
}

// FromCode builds the error for code with the server's message. It returns
// nil for codes.OK.
func FromCode(code codes.Code, msg string) error {
	if code == codes.OK {
		return nil
	}
	sentinel := ErrInternal
	for _, e := range codeTable {
		if e.code == code {
			sentinel = e.err
			break
		}
	}
	if msg == "" {
		msg = sentinel.Error()
	}
	return &RemoteError{Code: code, Msg: msg, sentinel: sentinel}
}

// FromWireStatus is FromCode for the data channel's status byte: what a
// wire.Conn's ConnConfig.Status should be, so refusals on the data channel
// arrive as the same sentinel errors as over gRPC.
func FromWireStatus(code uint8, msg string) error { return FromCode(codes.Code(code), msg) }

// RemoteError is an error reported by a node. It unwraps to the matching
// sentinel error.
type RemoteError struct {
	Code     codes.Code
	Msg      string
	sentinel error
}

func (e *RemoteError) Error() string { return e.Msg }

// Unwrap returns the sentinel that Code maps to.
func (e *RemoteError) Unwrap() error { return e.sentinel }

// GRPCStatus lets a RemoteError pass through a gRPC edge unchanged.
func (e *RemoteError) GRPCStatus() *status.Status { return status.New(e.Code, e.Msg) }

// Errorf wraps sentinel with a formatted message; a shorthand used where an
// error must carry both a classification and context.
func Errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
