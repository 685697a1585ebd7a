package transfer

import (
	"encoding/json"
	"errors"
	"flag"
	"io"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kvpool/kvpool/api"
)

func TestProtocol(t *testing.T) {
	for _, tc := range []struct {
		name string
		text string   // input to ParseProtocol and UnmarshalText
		want Protocol // what both parse it to
		// parseErr: ParseProtocol refuses text; unmarshalErr: so does
		// UnmarshalText (which takes "" for the zero value).
		parseErr, unmarshalErr bool
	}{
		{name: "tcp", text: "tcp", want: ProtocolTCP},
		{name: "grpc", text: "grpc", want: ProtocolGRPC},
		{name: "shm", text: "shm", want: ProtocolSHM},
		{name: "empty is unset", text: "", want: 0, parseErr: true},
		{name: "names are lower case", text: "TCP", parseErr: true, unmarshalErr: true},
		{name: "no spaces", text: " shm", parseErr: true, unmarshalErr: true},
		{name: "unknown", text: "rdma", parseErr: true, unmarshalErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseProtocol(tc.text)
			if tc.parseErr {
				if !errors.Is(err, api.ErrInvalidArgument) {
					t.Fatalf("ParseProtocol(%q) = %v, %v; want an error wrapping ErrInvalidArgument", tc.text, p, err)
				}
				if want := `kvpool: invalid argument: transport "` + tc.text + `": want tcp, grpc or shm`; err.Error() != want {
					t.Fatalf("ParseProtocol(%q): %q, want %q", tc.text, err, want)
				}
			} else if err != nil || p != tc.want {
				t.Fatalf("ParseProtocol(%q) = %v, %v; want %v", tc.text, p, err, tc.want)
			}

			u := ProtocolSHM + 1 // whatever UnmarshalText leaves, it is not this
			err = u.UnmarshalText([]byte(tc.text))
			if tc.unmarshalErr {
				if !errors.Is(err, api.ErrInvalidArgument) {
					t.Fatalf("UnmarshalText(%q): %v, want ErrInvalidArgument", tc.text, err)
				}
				return
			}
			if err != nil || u != tc.want {
				t.Fatalf("UnmarshalText(%q) = %v, %v; want %v", tc.text, u, err, tc.want)
			}
			b, err := u.MarshalText()
			if err != nil || string(b) != tc.text {
				t.Fatalf("MarshalText(%v) = %q, %v; want %q", u, b, err, tc.text)
			}
			if tc.text != "" && u.String() != tc.text {
				t.Fatalf("String() = %q, want %q", u.String(), tc.text)
			}
		})
	}
}

func TestProtocolInvalidValues(t *testing.T) {
	for _, tc := range []struct {
		p    Protocol
		want string
	}{{0, "Protocol(0)"}, {4, "Protocol(4)"}, {255, "Protocol(255)"}} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
	if b, err := Protocol(4).MarshalText(); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("MarshalText(Protocol(4)) = %q, %v; want ErrInvalidArgument", b, err)
	}
	if _, err := json.Marshal(struct{ T Protocol }{4}); err == nil {
		t.Error("json.Marshal of Protocol(4) succeeded")
	}
}

// A Protocol is a flag value and a field of a JSON or YAML config; its
// names are the transports' names.
func TestProtocolEncodings(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var p Protocol
	fs.TextVar(&p, "transport", ProtocolTCP, "how the node pulls blocks")
	if p != ProtocolTCP {
		t.Fatalf("flag default: %v, want tcp", p)
	}
	if err := fs.Parse([]string{"--transport", "grpc"}); err != nil || p != ProtocolGRPC {
		t.Fatalf("--transport grpc: %v, %v", p, err)
	}
	if err := fs.Parse([]string{"--transport=carrier-pigeon"}); err == nil {
		t.Fatal("--transport=carrier-pigeon was accepted")
	}

	type config struct {
		Transport Protocol `json:"transport"`
	}
	for _, tc := range []struct {
		c    config
		json string
	}{{config{ProtocolSHM}, `{"transport":"shm"}`}, {config{}, `{"transport":""}`}} {
		b, err := json.Marshal(tc.c)
		if err != nil || string(b) != tc.json {
			t.Fatalf("json.Marshal(%+v) = %s, %v; want %s", tc.c, b, err, tc.json)
		}
		var back config
		if err := json.Unmarshal(b, &back); err != nil || back != tc.c {
			t.Fatalf("json.Unmarshal(%s) = %+v, %v", b, back, err)
		}
	}
	var c config
	if err := yaml.Unmarshal([]byte("transport: grpc\n"), &c); err != nil || c.Transport != ProtocolGRPC {
		t.Fatalf("yaml: %+v, %v", c, err)
	}
	if err := yaml.Unmarshal([]byte("transport: udp\n"), &c); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("yaml with transport udp: %v, want ErrInvalidArgument", err)
	}

	for _, tc := range []struct {
		tr   Transport
		want Protocol
	}{{NewTCP(TCPConfig{}), ProtocolTCP}, {NewGRPC(GRPCConfig{}), ProtocolGRPC}, {NewSHM(SHMConfig{}), ProtocolSHM}} {
		if tc.tr.Name() != tc.want.String() {
			t.Errorf("%T.Name() = %q, want %q", tc.tr, tc.tr.Name(), tc.want)
		}
		tc.tr.Close()
	}
}
