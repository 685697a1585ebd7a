// Command rollingbench drains a node holding 1 GiB, then restarts each
// daemon of a three-node cluster in turn under a steady put and get load,
// every daemon running with --drain-on-stop (see package rolling), and
// prints what was lost, what the clients saw and how long each step took
// (issue 18).
//
//	go run ./test/rollingbench --json
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/kvpool/kvpool/test/rolling"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rollingbench:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := rolling.Config{Log: os.Stderr}
	flag.IntVar(&cfg.Nodes, "nodes", 3, "daemons in the cluster")
	flag.Int64Var(&cfg.CapacityBytes, "capacity", 4<<30, "each daemon's arena, bytes")
	flag.Int64Var(&cfg.DrainBytes, "drain-bytes", 1<<30, "what the drained node holds, bytes (0: no drain)")
	flag.Int64Var(&cfg.DrainBlockBytes, "drain-block-size", 2<<20, "block size of the drained node's blocks")
	flag.Int64Var(&cfg.LoadBlockBytes, "block-size", 256<<10, "block size of the load")
	flag.IntVar(&cfg.Workers, "workers", 4, "load workers (each puts and reads in turn)")
	flag.IntVar(&cfg.Preload, "preload", 256, "blocks the load puts before the first restart")
	flag.DurationVar(&cfg.Settle, "settle", 2*time.Second, "load between two restarts")
	flag.DurationVar(&cfg.DrainBudget, "drain-budget", time.Minute, "each daemon's --drain-budget")
	kvpoolBin := flag.String("kvpool", "", "kvpool binary (default: build ./cmd/kvpool)")
	etcdBin := flag.String("etcd", "etcd", "etcd binary (Debian's etcd-server)")
	asJSON := flag.Bool("json", false, "print JSON")
	flag.Parse()

	dir, err := os.MkdirTemp("", "rollingbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg.Dir = dir
	if cfg.Etcd, err = exec.LookPath(*etcdBin); err != nil {
		return fmt.Errorf("etcd: %w (apt install etcd-server)", err)
	}
	cfg.Kvpool = *kvpoolBin
	if cfg.Kvpool == "" {
		cfg.Kvpool = filepath.Join(dir, "kvpool")
		if out, err := exec.Command("go", "build", "-o", cfg.Kvpool, "github.com/kvpool/kvpool/cmd/kvpool").CombinedOutput(); err != nil {
			return fmt.Errorf("go build: %v\n%s", err, out)
		}
	}
	rep, err := rolling.Run(context.Background(), cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		return rep.WriteJSON(os.Stdout)
	}
	if d := rep.Drain; d != nil {
		fmt.Printf("drain of %s: %d blocks (%d MiB), %d handed off in %.2f s (call %.2f s), %d already elsewhere, %d left with it; on no node now: %d\n",
			d.Node, d.Report.Blocks, d.Report.Bytes>>20, d.Report.HandedOffBlocks, d.Report.TookSeconds, d.Took, d.Report.ReplicatedBlocks, d.Report.KeptBlocks, d.Lost)
	}
	r := rep.Rolling
	fmt.Printf("rolling restart: %d puts (%d with a replica, %d leased), %d gets, %d retries, %d errors; lost: %d leased, %d replicated, %d other\n",
		r.Puts, r.Replicated, r.Leased, r.Gets, r.Retries, r.Errors, r.LostLeased, r.LostReplicated, r.LostOther)
	for _, e := range r.Samples {
		fmt.Printf("  error: %s\n", e)
	}
	for _, n := range rep.Nodes {
		fmt.Printf("  %s: SIGTERM to exit %.2f s (handed off %d, already elsewhere %d, left %d), start to serving %.2f s, to rejoined %.2f s\n",
			n.Node, n.StopS, n.HandedOff, n.Replicated, n.Kept, n.ServingS, n.RejoinedS)
	}
	return nil
}
