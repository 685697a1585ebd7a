// Command kvpool is the kvpool node and its command-line tools: serve runs a
// node, put/get/locate/exists/remove/stats talk to one, bench measures one
// against the physical baseline, and demo shows the whole flow.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		var ue usageError
		if !errors.As(err, &ue) || !ue.printed {
			fmt.Fprintln(os.Stderr, "kvpool:", err)
		}
		os.Exit(exitCode(err))
	}
}

// usageError marks bad flags or arguments: exit status 2. printed is set
// when the message and usage were already written.
type usageError struct {
	error
	printed bool
}

func (e usageError) Unwrap() error { return e.error }

func exitCode(err error) int {
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// env is what commands read and write instead of globals.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "kvpool",
		Short: "A distributed pool of LLM KV-cache blocks",
		Long: `kvpool keeps LLM KV-cache blocks in shared host memory on every inference node,
so engines can map them, fetch them from each other, and decide per request
whether fetching beats recomputing.

Run "kvpool demo" to see a node at work, "kvpool serve" to run one.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		fmt.Fprintf(stderr, "kvpool %s: %v\n\n%s", c.Name(), err, c.UsageString())
		return usageError{err, true}
	})
	root.AddCommand(serveCmd(e), benchCmd(e), demoCmd(e), adminCmd(e), planCmd(e))
	root.AddCommand(dataCmds(e)...)
	err := root.ExecuteContext(ctx)
	if err != nil && isCobraUsage(err) {
		fmt.Fprintf(stderr, "kvpool: %v\nRun 'kvpool --help' for usage.\n", err)
		return usageError{err, true}
	}
	return err
}

// isCobraUsage recognizes cobra's own argument errors (unknown command,
// wrong argument count), which it returns as plain errors.
func isCobraUsage(err error) bool {
	var ue usageError
	if errors.As(err, &ue) {
		return false
	}
	for _, p := range []string{"unknown command", "accepts ", "requires ", "unknown flag", "unknown shorthand", "invalid argument"} {
		if strings.Contains(err.Error(), p) {
			return true
		}
	}
	return false
}
