package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
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

func (f *clientFlags) register(c *cobra.Command, needKey bool) {
	fl := c.Flags()
	fl.StringVar(&f.server, "server", "127.0.0.1:7070", "node address (host:port)")
	if needKey {
		fl.StringVar(&f.tenant, "tenant", "", "tenant, [A-Za-z0-9._-]{1,64} (required)")
		fl.StringVar(&f.namespace, "namespace", "", "namespace, [A-Za-z0-9._-]{1,64} (required)")
		fl.BoolVar(&f.hex, "hex", false, "keys are hex-encoded bytes instead of text")
	}
	fl.BoolVar(&f.asJSON, "json", false, "print machine-readable JSON")
	fl.StringVar(&f.path, "path", "auto", "how bytes move: auto, shm, data or grpc")
	fl.DurationVar(&f.timeout, "timeout", 30*time.Second, "give up after this long")
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
		return api.BlockKey{}, usageError{error: err}
	}
	if err := errors.Join(f.checkNames(), api.ValidateKey(k)); err != nil {
		return api.BlockKey{}, usageError{error: err}
	}
	return api.BlockKey{Tenant: f.tenant, Namespace: f.namespace, Key: k}, nil
}

// namedKeys checks --tenant and --namespace and parses --keys, or returns
// a usage error.
func (f *clientFlags) namedKeys(list []string) ([][]byte, error) {
	keys, err := f.keys(list)
	if err = errors.Join(f.checkNames(), err); err != nil {
		return nil, usageError{error: err}
	}
	return keys, nil
}

// checkNames validates --tenant and --namespace before any network call.
func (f *clientFlags) checkNames() error {
	return errors.Join(api.ValidateName("--tenant", f.tenant), api.ValidateName("--namespace", f.namespace))
}

func (f *clientFlags) dial(ctx context.Context) (*api.Client, context.Context, context.CancelFunc, error) {
	p, err := api.ParsePath(f.path)
	if err != nil {
		return nil, nil, nil, usageError{error: err}
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	c, err := api.Dial(ctx, api.ClientConfig{Server: f.server, Path: p})
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return c, ctx, cancel, nil
}

// withClient dials the node, runs fn with a context bounded by --timeout,
// and closes the client.
func (f *clientFlags) withClient(cmd *cobra.Command, fn func(ctx context.Context, c *api.Client) error) error {
	c, ctx, cancel, err := f.dial(cmd.Context())
	if err != nil {
		return err
	}
	defer cancel()
	defer c.Close()
	return fn(ctx, c)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func dataCmds(e *env) []*cobra.Command {
	return []*cobra.Command{putCmd(e), getCmd(e), locateCmd(e), existsCmd(e), removeCmd(e), statsCmd(e), chainCmd(e), fetchCmd(e)}
}

func putCmd(e *env) *cobra.Command {
	var f clientFlags
	var key, file string
	c := &cobra.Command{
		Use:   "put",
		Short: "Store one block read from --file or stdin",
		Example: `  kvpool put --tenant acme --namespace llama3-8b --key block-0 --file kv.bin
  head -c 2097152 /dev/urandom | kvpool put --tenant acme --namespace m --hex --key 00ff`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bk, err := f.blockKey(key)
			if err != nil {
				return err
			}
			k := bk.Key
			var value []byte
			if file == "" || file == "-" {
				value, err = io.ReadAll(e.stdin)
			} else {
				value, err = os.ReadFile(file)
			}
			if err != nil {
				return err
			}
			return f.withClient(cmd, func(ctx context.Context, c *api.Client) error {
				res, err := c.PutResult(ctx, bk, value)
				if err != nil {
					return err
				}
				if f.asJSON {
					return printJSON(e.stdout, map[string]any{"key": hex.EncodeToString(k), "bytes": len(value), "crc32c": res.CRC, "existed": res.Existed, "path": c.Path().String()})
				}
				verb := "stored"
				if res.Existed {
					verb = "already held"
				}
				fmt.Fprintf(e.stdout, "%s %d bytes as %s (crc32c %08x, via %s)\n", verb, len(value), bk, res.CRC, c.Path())
				return nil
			})
		},
	}
	f.register(c, true)
	c.Flags().StringVar(&key, "key", "", "block key (text, or hex with --hex) (required)")
	c.Flags().StringVar(&file, "file", "", "read the value from this file (default stdin)")
	return c
}

func getCmd(e *env) *cobra.Command {
	var f clientFlags
	var key, file string
	c := &cobra.Command{
		Use:   "get",
		Short: "Fetch one block to stdout or --file",
		Long: `get fetches one block and writes its bytes to stdout, or to --file. With --json
it prints the block's size and checksum instead, and the bytes in base64 unless
--file is given.`,
		Example: `  kvpool get --tenant acme --namespace llama3-8b --key block-0 > kv.bin
  kvpool get --tenant acme --namespace m --hex --key 00ff --file out.bin --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bk, err := f.blockKey(key)
			if err != nil {
				return err
			}
			k := bk.Key
			return f.withClient(cmd, func(ctx context.Context, c *api.Client) error {
				v, err := c.GetValue(ctx, bk)
				if err != nil {
					return err
				}
				if file != "" {
					if err := os.WriteFile(file, v, 0o644); err != nil {
						return err
					}
				}
				if f.asJSON {
					out := map[string]any{"key": hex.EncodeToString(k), "bytes": len(v), "crc32c": api.Checksum(v), "path": c.Path().String()}
					if file == "" {
						out["value_base64"] = base64.StdEncoding.EncodeToString(v)
					} else {
						out["file"] = file
					}
					return printJSON(e.stdout, out)
				}
				if file == "" {
					_, err = e.stdout.Write(v)
					return err
				}
				fmt.Fprintf(e.stderr, "wrote %d bytes to %s\n", len(v), file)
				return nil
			})
		},
	}
	f.register(c, true)
	c.Flags().StringVar(&key, "key", "", "block key (text, or hex with --hex) (required)")
	c.Flags().StringVar(&file, "file", "", "write the value to this file instead of stdout")
	return c
}

func locateCmd(e *env) *cobra.Command {
	var f clientFlags
	var keys []string
	var lease time.Duration
	c := &cobra.Command{
		Use:     "locate",
		Short:   "Count how many leading blocks of a prefix chain the node holds",
		Example: `  kvpool locate --tenant acme --namespace llama3-8b --hex --keys $(kvpool chain --tokens-file prompt.txt --block-tokens 16 --csv)`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			chain, err := f.namedKeys(keys)
			if err != nil {
				return err
			}
			return f.withClient(cmd, func(ctx context.Context, c *api.Client) error {
				locate := c.LocateLease // lease < 0: --lease alone, the node's default
				if !cmd.Flags().Changed("lease") {
					locate = func(ctx context.Context, tenant, ns string, chain [][]byte, _ time.Duration) (int, time.Time, error) {
						n, err := c.Locate(ctx, tenant, ns, chain)
						return n, time.Time{}, err
					}
				}
				n, until, err := locate(ctx, f.tenant, f.namespace, chain, lease)
				if err != nil {
					return err
				}
				if f.asJSON {
					out := map[string]any{"node_id": c.Info().GetNodeId(), "chain_blocks": len(chain), "prefix_blocks": n}
					if !until.IsZero() {
						out["lease_until"] = until.UTC().Format(time.RFC3339Nano)
					}
					return printJSON(e.stdout, out)
				}
				fmt.Fprintf(e.stdout, "node %s holds %d of %d leading blocks\n", c.Info().GetNodeId(), n, len(chain))
				if !until.IsZero() {
					fmt.Fprintf(e.stdout, "leased until %s: not evicted, and removed only with --force, until then\n", until.UTC().Format(time.RFC3339))
				}
				return nil
			})
		},
	}
	f.register(c, true)
	c.Flags().StringSliceVar(&keys, "keys", nil, "the chain's keys, block 0 first, comma-separated (required)")
	c.Flags().DurationVar(&lease, "lease", 0, "also take a read lease of this long on the blocks held (capped by the node's maximum); --lease alone takes the node's default")
	c.Flags().Lookup("lease").NoOptDefVal = "-1ns"
	return c
}

func existsCmd(e *env) *cobra.Command {
	var f clientFlags
	var keys []string
	c := &cobra.Command{
		Use:   "exists",
		Short: "Report for each key whether the node holds it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := f.namedKeys(keys)
			if err != nil {
				return err
			}
			return f.withClient(cmd, func(ctx context.Context, c *api.Client) error {
				ex, err := c.Exists(ctx, f.tenant, f.namespace, list)
				if err != nil {
					return err
				}
				if f.asJSON {
					out := make([]map[string]any, len(list))
					for i, k := range list {
						out[i] = map[string]any{"key": hex.EncodeToString(k), "exists": ex[i]}
					}
					return printJSON(e.stdout, out)
				}
				for i, k := range list {
					fmt.Fprintf(e.stdout, "%s\t%v\n", displayKey(k, f.hex), ex[i])
				}
				return nil
			})
		},
	}
	f.register(c, true)
	c.Flags().StringSliceVar(&keys, "keys", nil, "keys to check, comma-separated (required)")
	return c
}

func displayKey(k []byte, asHex bool) string {
	if asHex {
		return hex.EncodeToString(k)
	}
	return strconv.Quote(string(k))
}

func removeCmd(e *env) *cobra.Command {
	var f clientFlags
	var key string
	var force bool
	c := &cobra.Command{
		Use:   "remove",
		Short: "Delete one block",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bk, err := f.blockKey(key)
			if err != nil {
				return err
			}
			k := bk.Key
			return f.withClient(cmd, func(ctx context.Context, c *api.Client) error {
				remove := c.Remove
				if force {
					remove = c.RemoveForce
				}
				if err := remove(ctx, bk); err != nil {
					return err
				}
				if f.asJSON {
					return printJSON(e.stdout, map[string]any{"key": hex.EncodeToString(k), "removed": true})
				}
				fmt.Fprintf(e.stdout, "removed %s\n", bk)
				return nil
			})
		},
	}
	f.register(c, true)
	c.Flags().StringVar(&key, "key", "", "block key (text, or hex with --hex) (required)")
	return c
}

func statsCmd(e *env) *cobra.Command {
	var f clientFlags
	c := &cobra.Command{
		Use:   "stats",
		Short: "Show a node's capacity, usage and allocator state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withClient(cmd, func(ctx context.Context, c *api.Client) error {
				st, err := c.Stats(ctx)
				if err != nil {
					return err
				}
				if f.asJSON {
					return printJSON(e.stdout, statsJSON(st))
				}
				w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintf(w, "node\t%s\n", st.GetNodeId())
				fmt.Fprintf(w, "capacity\t%s\n", humanBytes(st.GetCapacityBytes()))
				fmt.Fprintf(w, "used\t%s (%.1f%%)\n", humanBytes(st.GetUsedBytes()), 100*float64(st.GetUsedBytes())/float64(max(st.GetCapacityBytes(), 1)))
				fmt.Fprintf(w, "stored\t%s in %d blocks\n", humanBytes(st.GetStoredBytes()), st.GetBlocks())
				fmt.Fprintf(w, "reservations\t%d (%s)\n", st.GetReservations(), humanBytes(st.GetReservedBytes()))
				fmt.Fprintf(w, "page\t%s\n", humanBytes(st.GetPageBytes()))
				fmt.Fprintf(w, "largest free run\t%s\n", humanBytes(st.GetLargestFreeBytes()))
				fmt.Fprintf(w, "fragmentation\texternal %.3f, internal %.3f\n", st.GetExternalFragmentation(), st.GetInternalFragmentation())
				fmt.Fprintf(w, "memory locked\t%v\n", st.GetMemoryLocked())
				w.Flush()
				if len(st.GetNamespaces()) > 0 {
					fmt.Fprintln(e.stdout)
					w = tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
					fmt.Fprintln(w, "TENANT\tNAMESPACE\tBLOCKS\tSTORED")
					for _, ns := range st.GetNamespaces() {
						fmt.Fprintf(w, "%s\t%s\t%d\t%s\n", ns.GetTenant(), ns.GetNamespace(), ns.GetBlocks(), humanBytes(ns.GetStoredBytes()))
					}
					w.Flush()
				}
				if len(st.GetTenants()) > 0 {
					fmt.Fprintln(e.stdout)
					printTenants(e.stdout, st.GetNodeId(), st.GetTenants())
				}
				return nil
			})
		},
	}
	f.register(c, false)
	return c
}

// statsJSON is the stable --json shape of stats: every field present,
// numbers as numbers.
func statsJSON(st *kvpoolv1.StatsResponse) map[string]any {
	ns := make([]map[string]any, 0, len(st.GetNamespaces()))
	for _, n := range st.GetNamespaces() {
		ns = append(ns, map[string]any{"tenant": n.GetTenant(), "namespace": n.GetNamespace(), "blocks": n.GetBlocks(), "stored_bytes": n.GetStoredBytes()})
	}
	return map[string]any{
		"node_id":                st.GetNodeId(),
		"capacity_bytes":         st.GetCapacityBytes(),
		"used_bytes":             st.GetUsedBytes(),
		"free_bytes":             st.GetFreeBytes(),
		"stored_bytes":           st.GetStoredBytes(),
		"blocks":                 st.GetBlocks(),
		"reservations":           st.GetReservations(),
		"reserved_bytes":         st.GetReservedBytes(),
		"page_bytes":             st.GetPageBytes(),
		"largest_free_bytes":     st.GetLargestFreeBytes(),
		"external_fragmentation": st.GetExternalFragmentation(),
		"internal_fragmentation": st.GetInternalFragmentation(),
		"memory_locked":          st.GetMemoryLocked(),
		"namespaces":             ns,
		"tenants":                tenantsJSON(st.GetTenants()),
		"leased_blocks":          st.GetLeasedBlocks(),
	}
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func chainCmd(e *env) *cobra.Command {
	var tokensFile, scheme, seed string
	var blockTokens int
	var csv, asJSON bool
	c := &cobra.Command{
		Use:   "chain",
		Short: "Compute the prefix-chain keys of a token sequence",
		Long: `chain cuts a token sequence into blocks of --block-tokens and prints one key per
full block, block 0 first, in hex. Tokens are integers separated by spaces,
commas or newlines, read from --tokens-file or stdin.

--scheme sha256_cbor reproduces vLLM's prefix_caching_hash_algo=sha256_cbor
with --seed set to the engine's PYTHONHASHSEED; --scheme sha256 is kvpool's
own fixed-width encoding.`,
		Example: `  echo 1 2 3 4 5 6 7 8 | kvpool chain --block-tokens 4 --scheme sha256_cbor --seed 0`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := api.ParseChainScheme(scheme)
			if err != nil {
				return usageError{error: err}
			}
			if blockTokens <= 0 {
				return usageError{error: fmt.Errorf("--block-tokens %d: want a positive count", blockTokens)}
			}
			var in io.Reader = e.stdin
			if tokensFile != "" {
				fh, err := os.Open(tokensFile)
				if err != nil {
					return err
				}
				defer fh.Close()
				in = fh
			}
			tokens, err := readTokens(in)
			if err != nil {
				return usageError{error: err}
			}
			keys, err := api.ChainKeys(api.ChainConfig{Scheme: s, BlockTokens: blockTokens, Seed: seed}, tokens)
			if err != nil {
				return err
			}
			hexKeys := make([]string, len(keys))
			for i, k := range keys {
				hexKeys[i] = hex.EncodeToString(k)
			}
			switch {
			case asJSON:
				return printJSON(e.stdout, map[string]any{"scheme": s.String(), "block_tokens": blockTokens, "tokens": len(tokens), "keys": hexKeys})
			case csv:
				fmt.Fprintln(e.stdout, strings.Join(hexKeys, ","))
			default:
				for _, k := range hexKeys {
					fmt.Fprintln(e.stdout, k)
				}
			}
			return nil
		},
	}
	fl := c.Flags()
	fl.StringVar(&tokensFile, "tokens-file", "", "file of token ids (default stdin)")
	fl.IntVar(&blockTokens, "block-tokens", 16, "tokens per block")
	fl.StringVar(&scheme, "scheme", "sha256_cbor", "sha256_cbor (vLLM) or sha256 (kvpool)")
	fl.StringVar(&seed, "seed", "0", "chain seed; for sha256_cbor the engine's PYTHONHASHSEED")
	fl.BoolVar(&csv, "csv", false, "print the keys on one comma-separated line (for --keys)")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	return c
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

func fetchCmd(e *env) *cobra.Command {
	var f clientFlags
	var keys []string
	var holderTimeout time.Duration
	var direct bool
	var dir string
	c := &cobra.Command{
		Use:   "fetch",
		Short: "Make blocks local on a node, pulling the ones it lacks from the nodes that hold them",
		Long: `fetch asks a node (--server) to make the blocks under --keys local. Each block it
lacks is pulled from the live node holding it with the best measured link,
checked against its checksum, and stored as a replica; a holder that fails or
times out (--holder-timeout) is replaced by the next one. Prints where each
block came from.

With --direct the blocks are not stored on --server: this client asks it where
each block lives and reads it from the holder itself (direct mode), verifying
its checksum, and reports where each came from; add --dir to keep the bytes,
one file per block named by its hex key.`,
		Example: `  kvpool fetch --server 10.0.0.5:7070 --tenant acme --namespace llama3-8b --keys b0,b1,b2
  kvpool fetch --server 10.0.0.5:7070 --tenant acme --namespace m --hex --keys 00ff,01aa --direct --dir /tmp/kv --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := f.namedKeys(keys)
			if err != nil {
				return err
			}
			if dir != "" && !direct {
				return usageError{error: errors.New("--dir needs --direct: without it the blocks are stored on --server")}
			}
			if direct && cmd.Flags().Changed("holder-timeout") {
				return usageError{error: errors.New("--holder-timeout applies to a node's fetch, not to --direct")}
			}
			return f.withClient(cmd, func(ctx context.Context, c *api.Client) error {
				start := time.Now()
				var res []api.FetchResult
				if direct {
					got, err := c.GetDirect(ctx, f.tenant, f.namespace, list)
					if err != nil {
						return err
					}
					for i, g := range got {
						if g.Err == nil && dir != "" {
							g.Err = os.WriteFile(filepath.Join(dir, hex.EncodeToString(list[i])), g.Value, 0o644)
						}
						res = append(res, api.FetchResult{Source: g.Source, Size: int64(len(g.Value)), Err: g.Err})
					}
				} else {
					res, err = c.Fetch(ctx, f.tenant, f.namespace, list, holderTimeout)
					if err != nil {
						return err
					}
				}
				el := time.Since(start)
				var failed int
				var moved int64
				out := make([]map[string]any, len(res))
				for i, r := range res {
					m := map[string]any{"key": hex.EncodeToString(list[i]), "source": r.Source, "bytes": r.Size}
					if r.Err != nil {
						failed++
						m["error"] = r.Err.Error()
					}
					moved += r.Size
					out[i] = m
				}
				if f.asJSON {
					if err := printJSON(e.stdout, map[string]any{"blocks": out, "fetched_bytes": moved, "seconds": el.Seconds()}); err != nil {
						return err
					}
				} else {
					for i, r := range res {
						switch {
						case r.Err != nil:
							fmt.Fprintf(e.stdout, "%s\tfailed: %v\n", displayKey(list[i], f.hex), r.Err)
						case r.Source == "":
							fmt.Fprintf(e.stdout, "%s\talready here\n", displayKey(list[i], f.hex))
						default:
							fmt.Fprintf(e.stdout, "%s\tfrom %s (%s)\n", displayKey(list[i], f.hex), r.Source, humanBytes(uint64(r.Size)))
						}
					}
					fmt.Fprintf(e.stderr, "fetched %s in %v\n", humanBytes(uint64(moved)), el.Round(time.Millisecond))
				}
				if failed > 0 {
					return fmt.Errorf("%d of %d blocks could not be fetched", failed, len(res))
				}
				return nil
			})
		},
	}
	f.register(c, true)
	c.Flags().StringSliceVar(&keys, "keys", nil, "keys to fetch, comma-separated (required)")
	c.Flags().DurationVar(&holderTimeout, "holder-timeout", 0, "give up on one holder after this long and try the next (default: the node's, 1s)")
	c.Flags().BoolVar(&direct, "direct", false, "read the blocks from their holders from this client instead of storing them on --server")
	c.Flags().StringVar(&dir, "dir", "", "with --direct: write each block's bytes to this directory")
	return c
}
