// Command kvpool is the kvpool node and its command-line tools. Commands
// are <noun> <verb>: node serve runs a daemon; block, chain, node, cluster
// and policy talk to one; cluster demo shows the whole flow.
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
	// The first signal asks for a graceful stop (a drain, with node serve
	// --drain-on-stop); a second one then takes its default action and
	// ends the process at once.
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError marks bad flags or arguments: exit status 2. printed is set
// when the message and usage were already written.
type usageError struct {
	error
	printed bool
}

func (e usageError) Unwrap() error { return e.error }

// usage marks err as a usage error (nil stays nil).
func usage(err error) error {
	if err == nil {
		return nil
	}
	var ue usageError
	if errors.As(err, &ue) {
		return err
	}
	return usageError{error: err}
}

// usagef is a usage error with a formatted message.
func usagef(format string, args ...any) error { return usageError{error: fmt.Errorf(format, args...)} }

// exitCode is 0 for success, 2 for a usage error (bad flags or arguments,
// found before anything was asked of a node), 1 for everything else: a
// node's refusal, even InvalidArgument, is not a usage error.
func exitCode(err error) int {
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		return 2
	}
	return 1
}

// env is what commands read and write instead of globals.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

// run runs the command line args and returns the exit status, having
// written any error to stderr.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr}
	root := rootCmd(e)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	var ue usageError
	switch {
	case err == nil:
	case errors.As(err, &ue) && ue.printed:
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "kvpool: %v\nRun 'kvpool --help' for usage.\n", err)
	default:
		fmt.Fprintln(stderr, "kvpool:", err)
	}
	return exitCode(err)
}

func rootCmd(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "kvpool",
		Short: "A distributed pool of LLM KV-cache blocks",
		Long: `kvpool keeps LLM KV-cache blocks in shared host memory on every inference node,
so engines can map them, fetch them from each other, and decide per request
whether fetching beats recomputing.

Commands are <noun> <verb>. Run "kvpool cluster demo" to see a cluster at work,
"kvpool node serve" to run a node.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
		Args:          noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		fmt.Fprintf(c.ErrOrStderr(), "kvpool %s: %v\n\n%s", c.Name(), err, c.UsageString())
		return usageError{err, true}
	})
	root.AddCommand(
		noun("node", "Run a node, and ask one about itself", nodeServeCmd(e), nodeStatsCmd(e), nodeBenchCmd(e)),
		noun("block", "Store, read, find and move blocks on a node",
			blockPutCmd(e), blockGetCmd(e), blockExistsCmd(e), blockRemoveCmd(e), blockLocateCmd(e), blockFetchCmd(e)),
		chainCmd(e),
		noun("cluster", "Ask any daemon about the whole cluster: nodes, block locality, blocks, stats, links; drain a node; or run a demo cluster",
			clusterNodesCmd(e), clusterLocateCmd(e), clusterBlocksCmd(e), clusterStatsCmd(e), clusterLinksCmd(e), clusterDrainCmd(e), clusterDemoCmd(e)),
		policyCmd(e),
		simCmd(e),
		replayCmd(e),
		authCmd(e),
	)
	// The verbs of the previous release, hidden, for one release more.
	root.AddCommand(
		alias(e, nodeServeCmd(e), "node serve"), alias(e, nodeStatsCmd(e), "node stats"), alias(e, nodeBenchCmd(e), "node bench"),
		alias(e, blockPutCmd(e), "block put"), alias(e, blockGetCmd(e), "block get"), alias(e, blockExistsCmd(e), "block exists"),
		alias(e, blockRemoveCmd(e), "block remove"), alias(e, blockLocateCmd(e), "block locate"), alias(e, blockFetchCmd(e), "block fetch"),
		alias(e, chainPlanCmd(e), "chain plan", "plan"), alias(e, clusterDemoCmd(e), "cluster demo"),
		alias(e, noun("admin", "Former name of cluster and policy",
			alias(e, clusterNodesCmd(e), "cluster nodes"), alias(e, clusterLocateCmd(e), "cluster locate"),
			alias(e, clusterBlocksCmd(e), "cluster blocks"), alias(e, clusterStatsCmd(e), "cluster stats"),
			alias(e, clusterLinksCmd(e), "cluster links"), alias(e, clusterDrainCmd(e), "cluster drain"), alias(e, policyCmd(e), "policy")), ""),
	)
	return root
}

// noun is a command that only groups verbs.
func noun(name, short string, verbs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   name,
		Short: short,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var names []string
			for _, v := range cmd.Commands() {
				if !v.Hidden {
					names = append(names, v.Name())
				}
			}
			return usagef("%s needs a verb: %s", cmd.CommandPath(), strings.Join(names, ", "))
		},
	}
	c.AddCommand(verbs...)
	return c
}

// alias hides c under its old name (the first word of its Use, or name
// when given) and says on stderr what the command is called now.
func alias(e *env, c *cobra.Command, now string, name ...string) *cobra.Command {
	if len(name) > 0 {
		c.Use = name[0] + strings.TrimPrefix(c.Use, c.Name())
	}
	c.Hidden = true
	if now != "" {
		c.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
			rest := strings.TrimPrefix(cmd.CommandPath(), c.CommandPath())
			fmt.Fprintf(e.stderr, "kvpool: %q is now %q; the old name goes in the next release\n", cmd.CommandPath(), "kvpool "+now+rest)
			return nil
		}
	}
	return c
}

// noArgs rejects positional arguments as a usage error, suggesting the
// command that was perhaps meant.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usagef("%s", msg)
}
