package transfer

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api"
)

// The transports' errors classify through api's one table, and survive a
// trip through a gRPC status and back.
func TestErrorsClassifyThroughAPI(t *testing.T) {
	for _, tc := range []struct {
		err  error
		msg  string
		kind error
		code codes.Code
	}{
		{ErrNoRegion, "transfer: no such region or range", api.ErrNotFound, codes.NotFound},
		{ErrPeer, "transfer: peer unavailable", api.ErrUnavailable, codes.Unavailable},
		{ErrClosed, "transfer: transport closed", api.ErrUnavailable, codes.Unavailable},
		{context.Canceled, "context canceled", context.Canceled, codes.Canceled},
	} {
		t.Run(tc.msg, func(t *testing.T) {
			if tc.err.Error() != tc.msg {
				t.Errorf("message %q, want %q", tc.err, tc.msg)
			}
			wrapped := fmt.Errorf("transfer: op 3: %w", tc.err)
			if !errors.Is(wrapped, tc.err) || !errors.Is(wrapped, tc.kind) {
				t.Errorf("%v: errors.Is fails for %v or %v", wrapped, tc.err, tc.kind)
			}
			if got := api.Code(wrapped); got != tc.code {
				t.Errorf("api.Code(%v) = %v, want %v", wrapped, got, tc.code)
			}
			back := api.FromStatus(api.ToStatus(wrapped))
			if !errors.Is(back, tc.kind) || back.Error() != wrapped.Error() {
				t.Errorf("through a status: %v, want an error %q that is %v", back, wrapped, tc.kind)
			}
		})
	}
	if errors.Is(ErrPeer, ErrClosed) || errors.Is(ErrClosed, ErrPeer) {
		t.Error("ErrPeer and ErrClosed are not told apart")
	}
}
