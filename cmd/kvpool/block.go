package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
)

// The --json shapes of the block commands.
type (
	putJSON struct {
		Key     string `json:"key"`
		Bytes   int    `json:"bytes"`
		CRC32C  uint32 `json:"crc32c"`
		Existed bool   `json:"existed"`
		Path    string `json:"path"`
	}
	getJSON struct {
		Key         string `json:"key"`
		Bytes       int    `json:"bytes"`
		CRC32C      uint32 `json:"crc32c"`
		Path        string `json:"path"`
		ValueBase64 string `json:"value_base64,omitempty"`
		File        string `json:"file,omitempty"`
	}
	existsJSON struct {
		Key    string `json:"key"`
		Exists bool   `json:"exists"`
	}
	removeJSON struct {
		Key     string `json:"key"`
		Removed bool   `json:"removed"`
	}
	locateJSON struct {
		NodeID       string `json:"node_id"`
		ChainBlocks  int    `json:"chain_blocks"`
		PrefixBlocks int    `json:"prefix_blocks"`
		// MemoryBlocks of PrefixBlocks are in host memory, the rest on
		// the node's disk tier.
		MemoryBlocks int    `json:"memory_prefix_blocks"`
		LeaseUntil   string `json:"lease_until,omitempty"`
	}
	fetchJSON struct {
		Blocks       []fetchBlockJSON `json:"blocks"`
		FetchedBytes int64            `json:"fetched_bytes"`
		Seconds      float64          `json:"seconds"`
	}
	fetchBlockJSON struct {
		Key    string `json:"key"`
		Source string `json:"source"`
		Bytes  int64  `json:"bytes"`
		Error  string `json:"error,omitempty"`
	}
)

func blockPutCmd(e *env) *cobra.Command {
	var f clientFlags
	var file string
	var value []byte
	c := &cobra.Command{
		Use:   "put",
		Short: "Store one block read from --file or stdin",
		Example: `  kvpool block put --tenant acme --namespace llama3-8b --key block-0 --file kv.bin
  head -c 2097152 /dev/urandom | kvpool block put --tenant acme --namespace m --hex --key 00ff`,
	}
	read := func() (err error) {
		if file == "" || file == "-" {
			value, err = io.ReadAll(e.stdin)
		} else {
			value, err = os.ReadFile(file)
		}
		return err
	}
	c.Flags().StringVar(&file, "file", "", "read the value from this file (default stdin)")
	return oneKeyCmd(c, &f, read, func(ctx context.Context, c *api.Client, bk api.BlockKey) error {
		res, err := c.PutResult(ctx, bk, value)
		if err != nil {
			return err
		}
		if f.asJSON {
			return printJSON(e.stdout, putJSON{Key: hex.EncodeToString(bk.Key), Bytes: len(value), CRC32C: res.CRC, Existed: res.Existed, Path: c.Path().String()})
		}
		verb := "stored"
		if res.Existed {
			verb = "already held"
		}
		fmt.Fprintf(e.stdout, "%s %d bytes as %s (crc32c %08x, via %s)\n", verb, len(value), bk, res.CRC, c.Path())
		return nil
	})
}

func blockGetCmd(e *env) *cobra.Command {
	var f clientFlags
	var file string
	c := &cobra.Command{
		Use:   "get",
		Short: "Fetch one block to stdout or --file",
		Long: `get fetches one block and writes its bytes to stdout, or to --file. With --json
it prints the block's size and checksum instead, and the bytes in base64 unless
--file is given.`,
		Example: `  kvpool block get --tenant acme --namespace llama3-8b --key block-0 > kv.bin
  kvpool block get --tenant acme --namespace m --hex --key 00ff --file out.bin --json`,
	}
	c.Flags().StringVar(&file, "file", "", "write the value to this file instead of stdout")
	return oneKeyCmd(c, &f, nil, func(ctx context.Context, c *api.Client, bk api.BlockKey) error {
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
			out := getJSON{Key: hex.EncodeToString(bk.Key), Bytes: len(v), CRC32C: api.Checksum(v), Path: c.Path().String(), File: file}
			if file == "" {
				out.ValueBase64 = base64.StdEncoding.EncodeToString(v)
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
}

func blockExistsCmd(e *env) *cobra.Command {
	var f clientFlags
	var keys []string
	c := &cobra.Command{
		Use:   "exists",
		Short: "Report for each key whether the node holds it",
		Args:  noArgs,
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
					out := make([]existsJSON, len(list))
					for i, k := range list {
						out[i] = existsJSON{Key: hex.EncodeToString(k), Exists: ex[i]}
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
	f.register(c, true, 30*time.Second)
	c.Flags().StringSliceVar(&keys, "keys", nil, "keys to check, comma-separated (required)")
	return c
}

func blockRemoveCmd(e *env) *cobra.Command {
	var f clientFlags
	var force bool
	c := &cobra.Command{Use: "remove", Short: "Delete one block"}
	c.Flags().BoolVar(&force, "force", false, "remove the block even under a read lease")
	return oneKeyCmd(c, &f, nil, func(ctx context.Context, c *api.Client, bk api.BlockKey) error {
		remove := c.Remove
		if force {
			remove = c.RemoveForce
		}
		if err := remove(ctx, bk); err != nil {
			return err
		}
		if f.asJSON {
			return printJSON(e.stdout, removeJSON{Key: hex.EncodeToString(bk.Key), Removed: true})
		}
		fmt.Fprintf(e.stdout, "removed %s\n", bk)
		return nil
	})
}

// oneKeyCmd completes c, a command on the one block named by --tenant,
// --namespace and --key: it adds the client flags and --key, checks them
// first, then runs read (when not nil: put reads its value there), so bad
// input fails before any node is dialed, and then run on a client.
func oneKeyCmd(c *cobra.Command, f *clientFlags, read func() error, run func(ctx context.Context, c *api.Client, bk api.BlockKey) error) *cobra.Command {
	var key string
	c.Args = noArgs
	c.RunE = func(cmd *cobra.Command, _ []string) error {
		bk, err := f.blockKey(key)
		if err == nil && read != nil {
			err = read()
		}
		if err != nil {
			return err
		}
		return f.withClient(cmd, func(ctx context.Context, c *api.Client) error { return run(ctx, c, bk) })
	}
	f.register(c, true, 30*time.Second)
	c.Flags().StringVar(&key, "key", "", "block key (text, or hex with --hex) (required)")
	return c
}

func blockLocateCmd(e *env) *cobra.Command {
	var f clientFlags
	var keys []string
	var lease time.Duration
	c := &cobra.Command{
		Use:     "locate",
		Short:   "Count how many leading blocks of a prefix chain the node holds",
		Example: `  kvpool block locate --tenant acme --namespace llama3-8b --hex --keys $(kvpool chain keys --tokens-file prompt.txt --block-tokens 16 --csv)`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			chain, err := f.namedKeys(keys)
			if err != nil {
				return err
			}
			return f.withClient(cmd, func(ctx context.Context, c *api.Client) error {
				var n, memory int
				var until time.Time
				if cmd.Flags().Changed("lease") {
					// A lease promotes the disk's blocks: all in memory.
					n, until, err = c.LocateLease(ctx, f.tenant, f.namespace, chain, lease) // --lease alone: the node's default
					memory = n
				} else {
					n, memory, err = c.LocateTiers(ctx, f.tenant, f.namespace, chain)
				}
				if err != nil {
					return err
				}
				if f.asJSON {
					out := locateJSON{NodeID: c.Info().GetNodeId(), ChainBlocks: len(chain), PrefixBlocks: n, MemoryBlocks: memory}
					if !until.IsZero() {
						out.LeaseUntil = until.UTC().Format(time.RFC3339Nano)
					}
					return printJSON(e.stdout, out)
				}
				fmt.Fprintf(e.stdout, "node %s holds %d of %d leading blocks", c.Info().GetNodeId(), n, len(chain))
				if memory < n {
					fmt.Fprintf(e.stdout, " (%d in memory, %d on disk)", memory, n-memory)
				}
				fmt.Fprintln(e.stdout)
				if !until.IsZero() {
					fmt.Fprintf(e.stdout, "leased until %s: not evicted, and removed only with --force, until then\n", until.UTC().Format(time.RFC3339))
				}
				return nil
			})
		},
	}
	f.register(c, true, 30*time.Second)
	c.Flags().StringSliceVar(&keys, "keys", nil, "the chain's keys, block 0 first, comma-separated (required)")
	c.Flags().DurationVar(&lease, "lease", 0, "also take a read lease of this long on the blocks held (capped by the node's maximum); --lease alone takes the node's default")
	c.Flags().Lookup("lease").NoOptDefVal = "-1ns"
	return c
}

func blockFetchCmd(e *env) *cobra.Command {
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
		Example: `  kvpool block fetch --server 10.0.0.5:7070 --tenant acme --namespace llama3-8b --keys b0,b1,b2
  kvpool block fetch --server 10.0.0.5:7070 --tenant acme --namespace m --hex --keys 00ff,01aa --direct --dir /tmp/kv --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := f.namedKeys(keys)
			if err != nil {
				return err
			}
			if dir != "" && !direct {
				return usagef("--dir needs --direct: without it the blocks are stored on --server")
			}
			if direct && cmd.Flags().Changed("holder-timeout") {
				return usagef("--holder-timeout applies to a node's fetch, not to --direct")
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
				} else if res, err = c.Fetch(ctx, f.tenant, f.namespace, list, holderTimeout); err != nil {
					return err
				}
				return printFetch(e, &f, list, res, time.Since(start))
			})
		},
	}
	f.register(c, true, 30*time.Second)
	c.Flags().StringSliceVar(&keys, "keys", nil, "keys to fetch, comma-separated (required)")
	c.Flags().DurationVar(&holderTimeout, "holder-timeout", 0, "give up on one holder after this long and try the next (default: the node's, 1s)")
	c.Flags().BoolVar(&direct, "direct", false, "read the blocks from their holders from this client instead of storing them on --server")
	c.Flags().StringVar(&dir, "dir", "", "with --direct: write each block's bytes to this directory")
	return c
}

// printFetch reports where each block came from; it fails when any could
// not be fetched.
func printFetch(e *env, f *clientFlags, list [][]byte, res []api.FetchResult, took time.Duration) error {
	out := fetchJSON{Seconds: took.Seconds()}
	failed := 0
	for i, r := range res {
		b := fetchBlockJSON{Key: hex.EncodeToString(list[i]), Source: r.Source, Bytes: r.Size}
		if r.Err != nil {
			failed++
			b.Error = r.Err.Error()
		}
		out.FetchedBytes += r.Size
		out.Blocks = append(out.Blocks, b)
	}
	if f.asJSON {
		if err := printJSON(e.stdout, out); err != nil {
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
		fmt.Fprintf(e.stderr, "fetched %s in %v\n", humanBytes(uint64(out.FetchedBytes)), took.Round(time.Millisecond))
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d blocks could not be fetched", failed, len(res))
	}
	return nil
}
