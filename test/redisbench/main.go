// Command redisbench compares kvpool with Redis on this machine: the same
// value size, the same number of clients, each server in its own process
// on loopback, each driven by its own load generator (redis-benchmark for
// Redis, `kvpool bench --server` for kvpool). It prints kvpool's ratio to
// Redis for GET and for SET/PUT.
//
//	go run ./test/redisbench --block-size 2MiB --clients 1,4 --duration 5s
//
// It needs redis-server and redis-benchmark (Debian: apt-get install
// redis-server redis-tools).
package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "redisbench:", err)
		os.Exit(1)
	}
}

type row struct {
	Op          string  `json:"op"`
	Path        string  `json:"path"`
	BlockBytes  int     `json:"block_bytes"`
	Clients     int     `json:"clients"`
	KvpoolGBps  float64 `json:"kvpool_gbps"`
	RedisGBps   float64 `json:"redis_gbps"`
	RedisOpsPS  float64 `json:"redis_ops_per_s"`
	KvpoolOpsPS float64 `json:"kvpool_ops_per_s"`
	Ratio       float64 `json:"ratio"`
}

func run() error {
	blockFlag := flag.String("block-size", "2MiB", "value size: 4KiB, 256KiB, 2MiB, ... or bytes")
	clientsFlag := flag.String("clients", "1,4", "comma-separated client counts")
	duration := flag.Duration("duration", 5*time.Second, "how long each kvpool measurement runs; redis-benchmark gets a request count for about as long")
	kvpoolBin := flag.String("kvpool", "", "kvpool binary (default: build ./cmd/kvpool)")
	asJSON := flag.Bool("json", false, "print JSON")
	paths := flag.String("paths", "data,shm", "kvpool client paths to measure: data (TCP, like redis-benchmark) and/or shm (same-host shared memory)")
	flag.Parse()

	size, err := parseSize(*blockFlag)
	if err != nil {
		return err
	}
	var clients []int
	for _, s := range strings.Split(*clientsFlag, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 1 {
			return fmt.Errorf("--clients %q: want positive integers", *clientsFlag)
		}
		clients = append(clients, c)
	}
	redisServer, err := findTool("redis-server")
	if err != nil {
		return err
	}
	redisBench, err := findTool("redis-benchmark")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "redisbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := *kvpoolBin
	if bin == "" {
		bin = filepath.Join(dir, "kvpool")
		fmt.Fprintln(os.Stderr, "building kvpool ...")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/kvpool/kvpool/cmd/kvpool").CombinedOutput(); err != nil {
			return fmt.Errorf("go build: %v\n%s", err, out)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	redisPort, err := freePort()
	if err != nil {
		return err
	}
	redis := exec.CommandContext(ctx, redisServer, "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--protected-mode", "no", "--dir", dir, "--proto-max-bulk-len", strconv.Itoa(max(size*2, 512<<20)))
	if err := redis.Start(); err != nil {
		return err
	}
	defer redis.Process.Kill()
	if err := waitTCP(fmt.Sprintf("127.0.0.1:%d", redisPort)); err != nil {
		return fmt.Errorf("redis-server: %w", err)
	}
	kv, addr, err := startKvpool(ctx, bin, filepath.Join(dir, "shm.sock"))
	if err != nil {
		return err
	}
	defer kv.Process.Kill()

	var rows []row
	for _, c := range clients {
		// Calibrate the request count so redis-benchmark runs about as long
		// as the kvpool measurement.
		probe, err := redisRPS(ctx, redisBench, redisPort, size, c, 20*c)
		if err != nil {
			return err
		}
		n := int(min(probe["SET"], probe["GET"]) * duration.Seconds())
		rps, err := redisRPS(ctx, redisBench, redisPort, size, c, max(n, 50))
		if err != nil {
			return err
		}
		for _, path := range strings.Split(*paths, ",") {
			for _, op := range []struct{ redis, kvpool string }{{"GET", "get"}, {"SET", "put"}} {
				res, err := kvpoolBench(ctx, bin, addr, path, op.kvpool, size, c, *duration)
				if err != nil {
					return err
				}
				r := row{Op: op.kvpool, Path: path, BlockBytes: size, Clients: c, KvpoolGBps: res.GBps, KvpoolOpsPS: res.OpsPerS,
					RedisOpsPS: rps[op.redis], RedisGBps: rps[op.redis] * float64(size) / 1e9}
				r.Ratio = r.KvpoolGBps / r.RedisGBps
				rows = append(rows, r)
				fmt.Fprintf(os.Stderr, "%s %s %d clients: kvpool %.2f GB/s, redis %.2f GB/s\n", op.kvpool, path, c, r.KvpoolGBps, r.RedisGBps)
			}
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	fmt.Printf("%-4s %-5s %10s %8s %12s %12s %8s\n", "op", "path", "block", "clients", "kvpool GB/s", "redis GB/s", "ratio")
	for _, r := range rows {
		fmt.Printf("%-4s %-5s %10d %8d %12.2f %12.2f %8.2f\n", r.Op, r.Path, r.BlockBytes, r.Clients, r.KvpoolGBps, r.RedisGBps, r.Ratio)
	}
	return nil
}

func findTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/bin", "/usr/sbin", "/usr/local/bin"} {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found: apt-get install redis-server redis-tools", name)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func waitTCP(addr string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not accept connections within 10 s", addr)
}

// startKvpool runs `kvpool node serve` in its own process; the load generator
// (another process) reaches it over TCP or through its shm socket.
func startKvpool(ctx context.Context, bin, shm string) (*exec.Cmd, string, error) {
	cmd := exec.CommandContext(ctx, bin, "node", "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--capacity", "4GiB",
		"--node-id", "redisbench", "--shm-socket", shm, "--log-format", "json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "kvpool node starting" {
			addr, _ := rec["listen"].(string)
			go io.Copy(io.Discard, stderr)
			return cmd, addr, nil
		}
	}
	cmd.Process.Kill()
	return nil, "", errors.New("kvpool serve exited before it was ready")
}

// redisRPS runs redis-benchmark's SET then GET test and returns requests/s
// for each.
func redisRPS(ctx context.Context, bin string, port, size, clients, n int) (map[string]float64, error) {
	out, err := exec.CommandContext(ctx, bin, "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-t", "set,get", "-d", strconv.Itoa(size),
		"-c", strconv.Itoa(clients), "-P", "1", "-n", strconv.Itoa(n), "--csv").Output()
	if err != nil {
		return nil, fmt.Errorf("redis-benchmark: %w", err)
	}
	recs, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("redis-benchmark output: %w\n%s", err, out)
	}
	rps := map[string]float64{}
	for _, r := range recs {
		if len(r) < 2 || r[0] == "test" {
			continue
		}
		v, err := strconv.ParseFloat(r[1], 64)
		if err == nil {
			rps[r[0]] = v
		}
	}
	if rps["SET"] == 0 || rps["GET"] == 0 {
		return nil, fmt.Errorf("redis-benchmark reported no SET/GET rate:\n%s", out)
	}
	return rps, nil
}

type benchResult struct {
	GBps    float64 `json:"gbps"`
	OpsPerS float64 `json:"ops_per_s"`
}

func kvpoolBench(ctx context.Context, bin, addr, path, op string, size, clients int, d time.Duration) (benchResult, error) {
	out, err := exec.CommandContext(ctx, bin, "node", "bench", "--server", addr, "--path", path, "--op", op, "--block-size", strconv.Itoa(size),
		"--clients", strconv.Itoa(clients), "--duration", d.String(), "--no-baseline", "--quiet", "--json").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return benchResult{}, fmt.Errorf("kvpool bench: %v\n%s", err, ee.Stderr)
		}
		return benchResult{}, err
	}
	var r benchResult
	if err := json.Unmarshal(out, &r); err != nil {
		return benchResult{}, fmt.Errorf("kvpool bench output: %w\n%s", err, out)
	}
	return r, nil
}

func parseSize(s string) (int, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1
	for _, u := range []struct {
		suf string
		m   int
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"b", 1}} {
		if strings.HasSuffix(t, u.suf) {
			t, mult = strings.TrimSuffix(t, u.suf), u.m
			break
		}
	}
	n, err := strconv.Atoi(t)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("--block-size %q: want e.g. 2MiB", s)
	}
	return n * mult, nil
}
