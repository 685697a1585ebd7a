package transfer

import (
	"fmt"

	"github.com/kvpool/kvpool/api"
)

// Protocol names a transport. It exists for the node's configuration,
// which picks how the node pulls blocks from its peers (every node serves
// all three): a typed value is checked once, where the flag, the config
// file or the JSON is parsed, instead of as a string wherever it is
// compared. Its text form is what Transport.Name returns.
//
// The zero value is no protocol: it marshals to the empty string and the
// empty string unmarshals to it, so an unset field survives a round trip
// and the config's defaults can fill it; ParseProtocol refuses it.
type Protocol uint8

const (
	protocolInvalid Protocol = iota
	// ProtocolTCP is the framed tcp transport (TCP).
	ProtocolTCP
	// ProtocolGRPC is the grpc transport with the raw-bytes codec (GRPC).
	ProtocolGRPC
	// ProtocolSHM is the same-host shared-memory transport (SHM).
	ProtocolSHM
)

// String returns "tcp", "grpc" or "shm", or "Protocol(N)" for any other
// value.
func (p Protocol) String() string {
	switch p {
	case ProtocolTCP:
		return "tcp"
	case ProtocolGRPC:
		return "grpc"
	case ProtocolSHM:
		return "shm"
	}
	return fmt.Sprintf("Protocol(%d)", uint8(p))
}

// ParseProtocol returns the protocol named s ("tcp", "grpc" or "shm").
// Any other s is an error wrapping api.ErrInvalidArgument.
func ParseProtocol(s string) (Protocol, error) {
	switch s {
	case "tcp":
		return ProtocolTCP, nil
	case "grpc":
		return ProtocolGRPC, nil
	case "shm":
		return ProtocolSHM, nil
	}
	return protocolInvalid, fmt.Errorf("%w: transport %q: want tcp, grpc or shm", api.ErrInvalidArgument, s)
}

// MarshalText implements encoding.TextMarshaler: the protocol's name, or
// nothing for the zero value. Other values are an error.
func (p Protocol) MarshalText() ([]byte, error) {
	switch p {
	case protocolInvalid:
		return []byte{}, nil
	case ProtocolTCP, ProtocolGRPC, ProtocolSHM:
		return []byte(p.String()), nil
	}
	return nil, fmt.Errorf("%w: %v is not a transport", api.ErrInvalidArgument, p)
}

// UnmarshalText implements encoding.TextUnmarshaler, so a Protocol is a
// flag value and a JSON or YAML string: a name ParseProtocol accepts, or
// the empty string for the zero value.
func (p *Protocol) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*p = protocolInvalid
		return nil
	}
	q, err := ParseProtocol(string(b))
	if err != nil {
		return err
	}
	*p = q
	return nil
}
