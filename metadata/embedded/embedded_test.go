package embedded

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func TestStartServesClientsUntilClose(t *testing.T) {
	e, err := Start(Config{Dir: t.TempDir(), ClientURL: "http://127.0.0.1:0", Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Wait(context.Background()); err != nil {
		t.Fatalf("Wait on a started server: %v", err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.ClientURL()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/k", "v"); err != nil {
		t.Fatalf("put through %s: %v", e.ClientURL(), err)
	}
	resp, err := cli.Get(ctx, "/k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get /k: %v %v", resp, err)
	}
	if e.PeerURL() == "http://127.0.0.1:0" {
		t.Fatalf("PeerURL %s does not name the bound port", e.PeerURL())
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// The server is gone: a request fails instead of being answered.
	sctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := cli.Get(sctx, "/k"); err == nil {
		t.Fatal("get after Close succeeded")
	}
}

func TestStartNeedsADataDir(t *testing.T) {
	if _, err := Start(Config{ClientURL: "http://127.0.0.1:0"}); err == nil {
		t.Fatal("Start without Dir succeeded")
	}
}
