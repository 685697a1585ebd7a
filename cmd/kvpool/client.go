package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
)

// clientFlags are shared by the commands that talk to one node.
type clientFlags struct {
	server    string
	tenant    string
	namespace string
	hex       bool
	asJSON    bool
	path      string
	timeout   time.Duration
}

// register adds the flags; with names, also --tenant, --namespace and
// --hex.
func (f *clientFlags) register(c *cobra.Command, names bool, timeout time.Duration) {
	fl := c.Flags()
	fl.StringVar(&f.server, "server", "127.0.0.1:7070", "node address (host:port)")
	if names {
		fl.StringVar(&f.tenant, "tenant", "", "tenant, [A-Za-z0-9._-]{1,64} (required)")
		fl.StringVar(&f.namespace, "namespace", "", "namespace, [A-Za-z0-9._-]{1,64} (required)")
		fl.BoolVar(&f.hex, "hex", false, "keys are hex-encoded bytes instead of text")
	}
	fl.BoolVar(&f.asJSON, "json", false, "print machine-readable JSON")
	fl.StringVar(&f.path, "path", "auto", "how bytes move: auto, shm, data or grpc")
	fl.DurationVar(&f.timeout, "timeout", timeout, "give up after this long")
}

func (f *clientFlags) key(s string) ([]byte, error) {
	if !f.hex {
		return []byte(s), nil
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("key %q is not hex: %v", s, err)
	}
	return b, nil
}

// keys parses a --keys list: comma-separated, block 0 first.
func (f *clientFlags) keys(list []string) ([][]byte, error) {
	var out [][]byte
	for _, s := range list {
		for _, part := range strings.Split(s, ",") {
			if part = strings.TrimSpace(part); part == "" {
				continue
			}
			k, err := f.key(part)
			if err != nil {
				return nil, err
			}
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("--keys is required: a comma-separated list, block 0 first")
	}
	return out, nil
}

// blockKey builds the key named by --tenant, --namespace and --key, or a
// usage error saying everything wrong with them.
func (f *clientFlags) blockKey(key string) (api.BlockKey, error) {
	k, err := f.key(key)
	if err != nil {
		return api.BlockKey{}, usage(err)
	}
	if err := errors.Join(f.checkNames(), api.ValidateKey(k)); err != nil {
		return api.BlockKey{}, usage(err)
	}
	return api.BlockKey{Tenant: f.tenant, Namespace: f.namespace, Key: k}, nil
}

// namedKeys checks --tenant and --namespace and parses --keys, or returns
// a usage error.
func (f *clientFlags) namedKeys(list []string) ([][]byte, error) {
	keys, err := f.keys(list)
	return keys, usage(errors.Join(f.checkNames(), err))
}

// checkNames validates --tenant and --namespace before any network call.
func (f *clientFlags) checkNames() error {
	return errors.Join(api.ValidateName("--tenant", f.tenant), api.ValidateName("--namespace", f.namespace))
}

// withClient dials the node, runs fn with a context bounded by --timeout,
// and closes the client.
func (f *clientFlags) withClient(cmd *cobra.Command, fn func(ctx context.Context, c *api.Client) error) error {
	p, err := api.ParsePath(f.path)
	if err != nil {
		return usage(err)
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	defer cancel()
	c, err := api.Dial(ctx, api.ClientConfig{Server: f.server, Path: p})
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(ctx, c)
}

// withAdmin is withClient for the admin calls.
func (f *clientFlags) withAdmin(cmd *cobra.Command, fn func(ctx context.Context, a *api.Admin) error) error {
	return f.withClient(cmd, func(ctx context.Context, c *api.Client) error { return fn(ctx, c.Admin()) })
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func displayKey(k []byte, asHex bool) string {
	if asHex {
		return hex.EncodeToString(k)
	}
	return strconv.Quote(string(k))
}

// chainFlags name a prefix chain: its keys (--keys, text or --hex), or a
// prompt's tokens (--tokens-file) hashed as the engine hashes them.
type chainFlags struct {
	keys        []string
	tokensFile  string
	scheme      string
	seed        string
	blockTokens int
}

func (f *chainFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringSliceVar(&f.keys, "keys", nil, "the chain's keys, block 0 first, comma-separated")
	fl.StringVar(&f.tokensFile, "tokens-file", "", "file of the prompt's token ids ('-' for stdin)")
	fl.IntVar(&f.blockTokens, "block-tokens", 16, "tokens per block")
	fl.StringVar(&f.scheme, "scheme", "sha256_cbor", "chain hash, with --tokens-file: sha256_cbor (vLLM) or sha256")
	fl.StringVar(&f.seed, "seed", "0", "chain seed, with --tokens-file (vLLM: PYTHONHASHSEED)")
}

// chain returns the chain and, with --tokens-file, the prompt's length in
// tokens (0 with --keys). Errors are usage errors.
func (f *chainFlags) chain(e *env, cf *clientFlags) ([][]byte, int, error) {
	if f.blockTokens <= 0 {
		return nil, 0, usagef("--block-tokens %d: want a positive count", f.blockTokens)
	}
	switch {
	case f.tokensFile != "" && len(f.keys) > 0:
		return nil, 0, usagef("give --keys or --tokens-file, not both")
	case f.tokensFile != "":
		s, err := api.ParseChainScheme(f.scheme)
		if err != nil {
			return nil, 0, usage(err)
		}
		tokens, err := readTokensFile(e, f.tokensFile)
		if err != nil {
			return nil, 0, usage(err)
		}
		chain, err := api.ChainKeys(api.ChainConfig{Scheme: s, BlockTokens: f.blockTokens, Seed: f.seed}, tokens)
		if err != nil {
			return nil, 0, err
		}
		if len(chain) == 0 {
			return nil, 0, usagef("%d tokens make no full block of %d", len(tokens), f.blockTokens)
		}
		return chain, len(tokens), nil
	}
	chain, err := cf.keys(f.keys)
	return chain, 0, usage(err)
}

func readTokensFile(e *env, path string) ([]uint32, error) {
	var in io.Reader = e.stdin
	if path != "-" && path != "" {
		fh, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer fh.Close()
		in = fh
	}
	return readTokens(in)
}

func readTokens(r io.Reader) ([]uint32, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	fields := strings.FieldsFunc(string(b), func(c rune) bool { return c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r' })
	out := make([]uint32, 0, len(fields))
	for _, s := range fields {
		v, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("token %q is not a non-negative 32-bit integer", s)
		}
		out = append(out, uint32(v))
	}
	return out, nil
}
