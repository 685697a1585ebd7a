package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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
	"github.com/kvpool/kvpool/api/admin"
	"github.com/kvpool/kvpool/api/chain"
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
	creds     credFlags
}

// credFlags are how a client proves who it is to a node that requires
// credentials: a client certificate (--tls-cert, --tls-key) over TLS
// verified with --tls-ca, or a bearer token (--token-file, or
// $KVPOOL_TOKEN).
type credFlags struct {
	ca, cert, key string
	tokenFile     string
}

func (f *credFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.ca, "tls-ca", "", "PEM file of the CA that signed the node's certificate: talk TLS")
	fl.StringVar(&f.cert, "tls-cert", "", "PEM client certificate naming a tenant, node or admin (with --tls-key and --tls-ca)")
	fl.StringVar(&f.key, "tls-key", "", "PEM key of --tls-cert")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding a bearer token (default: $KVPOOL_TOKEN)")
}

// apply puts the credentials into cfg: TLS with --tls-ca, a client
// certificate with --tls-cert and --tls-key, a token from --token-file or
// $KVPOOL_TOKEN.
func (f *credFlags) apply(cfg *api.ClientConfig) error {
	if (f.cert == "") != (f.key == "") {
		return usagef("--tls-cert and --tls-key go together")
	}
	if f.cert != "" && f.ca == "" {
		return usagef("--tls-cert needs --tls-ca: a client certificate is sent over TLS")
	}
	var err error
	if cfg.TLS, err = clientTLS("--tls-ca", f.ca, f.cert, f.key); err != nil {
		return usage(err)
	}
	cfg.Token = os.Getenv("KVPOOL_TOKEN")
	if f.tokenFile != "" {
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return usage(err)
		}
		cfg.Token = strings.TrimSpace(string(b))
	}
	return nil
}

// register adds the flags; with names, also --tenant, --namespace and
// --hex.
func (f *clientFlags) register(c *cobra.Command, names bool, timeout time.Duration) {
	fl := c.Flags()
	fl.StringVar(&f.server, "server", "127.0.0.1:7070", "node address (host:port)")
	if names {
		f.registerNames(c)
	}
	fl.BoolVar(&f.asJSON, "json", false, "print machine-readable JSON")
	fl.StringVar(&f.path, "path", "auto", "how bytes move: auto, shm, data or grpc")
	fl.DurationVar(&f.timeout, "timeout", timeout, "give up after this long")
	f.creds.register(c)
}

// registerNames adds --tenant, --namespace and --hex.
func (f *clientFlags) registerNames(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.tenant, "tenant", "", "tenant, [A-Za-z0-9._-]{1,64} (required)")
	fl.StringVar(&f.namespace, "namespace", "", "namespace, [A-Za-z0-9._-]{1,64} (required)")
	fl.BoolVar(&f.hex, "hex", false, "keys are hex-encoded bytes instead of text")
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
	cfg := api.ClientConfig{Server: f.server, Path: p}
	if err := f.creds.apply(&cfg); err != nil {
		return err
	}
	c, err := api.Dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(ctx, c)
}

// withAdmin is withClient for the admin calls.
func (f *clientFlags) withAdmin(cmd *cobra.Command, fn func(ctx context.Context, a *admin.Client) error) error {
	return f.withClient(cmd, func(ctx context.Context, c *api.Client) error { return fn(ctx, admin.New(c)) })
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
	c.Flags().StringSliceVar(&f.keys, "keys", nil, "the chain's keys, block 0 first, comma-separated")
	f.registerTokens(c, "file of the prompt's token ids ('-' for stdin)")
}

// registerTokens adds the flags that hash a prompt's tokens into keys.
func (f *chainFlags) registerTokens(c *cobra.Command, fileUsage string) {
	fl := c.Flags()
	fl.StringVar(&f.tokensFile, "tokens-file", "", fileUsage)
	fl.IntVar(&f.blockTokens, "block-tokens", 16, "tokens per block")
	fl.StringVar(&f.scheme, "scheme", "sha256_cbor", "chain hash: sha256_cbor (vLLM) or sha256 (kvpool's own)")
	fl.StringVar(&f.seed, "seed", "0", "chain seed; for sha256_cbor the engine's PYTHONHASHSEED")
}

// chain returns the chain and, with --tokens-file, the prompt's length in
// tokens (0 with --keys).
func (f *chainFlags) chain(e *env, cf *clientFlags) ([][]byte, int, error) {
	switch {
	case f.tokensFile != "" && len(f.keys) > 0:
		return nil, 0, usagef("give --keys or --tokens-file, not both")
	case f.tokensFile != "":
		keys, tokens, err := f.hashTokens(e)
		if err == nil && len(keys) == 0 {
			err = usagef("%d tokens make no full block of %d", tokens, f.blockTokens)
		}
		return keys, tokens, err
	}
	if f.blockTokens <= 0 {
		return nil, 0, usagef("--block-tokens %d: want a positive count", f.blockTokens)
	}
	keys, err := cf.keys(f.keys)
	return keys, 0, usage(err)
}

// hashTokens reads --tokens-file (stdin when empty or '-') and hashes its
// tokens into keys; it returns them and the number of tokens read. A flag
// or a file's content that is wrong is a usage error; a file that cannot
// be read is not.
func (f *chainFlags) hashTokens(e *env) ([][]byte, int, error) {
	s, err := chain.ParseScheme(f.scheme)
	if err != nil {
		return nil, 0, usage(err)
	}
	if f.blockTokens <= 0 {
		return nil, 0, usagef("--block-tokens %d: want a positive count", f.blockTokens)
	}
	var in io.Reader = e.stdin
	if f.tokensFile != "-" && f.tokensFile != "" {
		fh, err := os.Open(f.tokensFile)
		if err != nil {
			return nil, 0, err
		}
		defer fh.Close()
		in = fh
	}
	tokens, err := chain.ReadTokens(in)
	if err != nil {
		return nil, 0, usage(err)
	}
	keys, err := chain.Keys(chain.Config{Scheme: s, BlockTokens: f.blockTokens, Seed: f.seed}, tokens)
	return keys, len(tokens), err
}

// clientTLS is a client's TLS configuration from PEM files: the roots in
// ca (named by flag in errors), and a client certificate when cert and
// key are given. nil without ca.
func clientTLS(flag, ca, cert, key string) (*tls.Config, error) {
	if ca == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %s holds no PEM certificate", flag, ca)
	}
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
