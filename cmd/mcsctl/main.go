// Command mcsctl is the operator's tool for mcsannotations. It needs no API
// server for anything but `explain --kubeconfig`:
//
//	mcsctl snapshot FILE [-o json]        what a CoreDNS snapshot file holds
//	mcsctl explain NAME --snapshot FILE   why a name answers what it answers
//	mcsctl explain NAME --kubeconfig K --cluster ID
//	mcsctl keys --cluster ID [--out DIR]  an ed25519 key pair for signing
//	mcsctl validate VALUE | -f pod.yaml   an annotation value or a Pod manifest
//	mcsctl upgrade-corefile [-f Corefile] --cluster ID
//
// Installed on the PATH as kubectl-mcs it is also `kubectl mcs ...`.
// It uses the plugin's own packages: the annotation parser, the snapshot
// store and its codecs, the record store and the answer table.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// errUsage is returned for a wrong command line; the message was printed.
var errUsage = errors.New("usage")

// errFound is returned when a command's answer is "no" (validate found
// rejections): the exit status is 1 without an error line.
var errFound = errors.New("problems found")

type command struct {
	name, args, help string
	run              func(args []string, stdin io.Reader, stdout, stderr io.Writer) error
}

var commands = []command{
	{"snapshot", "FILE [-o text|json]", "print what a snapshot file holds: sources, their state and last contact, every service with its endpoints per cluster", runSnapshot},
	{"explain", "NAME (--snapshot FILE | --kubeconfig K --cluster ID)", "why NAME answers what it answers: which Pods of which clusters, which were rejected and why", runExplain},
	{"keys", "--cluster ID [--out DIR]", "write an ed25519 key pair: ID.key for mcs-annotator --sign-key, ID.pub for the plugin's verify folder", runKeys},
	{"validate", "[--import] [--namespace NS] [--cluster ID] VALUE | -f pod.yaml", "check an annotation value or a Pod manifest with the plugin's parser", runValidate},
	{"upgrade-corefile", "[-f Corefile|-] --cluster ID [...]", "add the mcsannotations block to an existing Corefile, keeping the rest byte for byte", runUpgradeCorefile},
}

func main() {
	os.Exit(run(os.Args, os.Stdin, os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit status.
func run(argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	prog := progName(argv[0])
	if len(argv) < 2 || argv[1] == "-h" || argv[1] == "--help" || argv[1] == "help" {
		usage(prog, stderr)
		if len(argv) < 2 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name != argv[1] {
			continue
		}
		err := c.run(argv[2:], stdin, stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			return 2
		case errors.Is(err, errFound):
			return 1
		default:
			fmt.Fprintf(stderr, "%s %s: %v\n", prog, c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\n\n", prog, argv[1])
	usage(prog, stderr)
	return 2
}

// progName is "kubectl mcs" when run as the kubectl plugin kubectl-mcs.
func progName(arg0 string) string {
	if strings.HasPrefix(filepath.Base(arg0), "kubectl-mcs") {
		return "kubectl mcs"
	}
	return "mcsctl"
}

func usage(prog string, w io.Writer) {
	fmt.Fprintf(w, "Usage: %s COMMAND [ARGS]\n\nCommands (none needs an API server but explain --kubeconfig):\n", prog)
	for _, c := range commands {
		fmt.Fprintf(w, "  %s %s\n      %s\n", c.name, c.args, c.help)
	}
	fmt.Fprintf(w, "\nInstalled as kubectl-mcs on the PATH, it is also `kubectl mcs COMMAND`.\n")
}

// flags returns a flag set for a command that prints its errors to stderr.
func flags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseInterspersed parses args allowing flags after positional arguments
// (`mcsctl snapshot FILE -o json`), and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, errUsage
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
