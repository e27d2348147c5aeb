package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/coredns/caddy/caddyfile"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// upgradeOptions is what goes into the mcsannotations block.
type upgradeOptions struct {
	zone     string // the clusterset zone
	cluster  string
	snapshot string   // "" for none
	peers    []string // "NAME KUBECONFIG [CONTEXT]"
	verify   string
}

// defaultSnapshot is where the shipped manifests keep the snapshot.
const defaultSnapshot = "/var/lib/mcsannotations/table.db"

// runUpgradeCorefile reads a Corefile and prints it with the mcsannotations
// block added to the server block that serves the cluster domain (the one
// with the kubernetes plugin), plus `bufsize 1232` there if it has no
// bufsize. Everything else is kept byte for byte.
func runUpgradeCorefile(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flags("upgrade-corefile", stderr)
	file := fs.String("f", "-", "the Corefile to upgrade (- for stdin)")
	var o upgradeOptions
	fs.StringVar(&o.cluster, "cluster", "", "this cluster's ID (required)")
	fs.StringVar(&o.zone, "zone", "clusterset.local", "the clusterset zone")
	fs.StringVar(&o.snapshot, "snapshot", defaultSnapshot, "the snapshot file (\"\" for none)")
	fs.StringVar(&o.verify, "verify", "", "a folder of cluster public keys (verify word)")
	fs.Func("peer", "a peer cluster: \"NAME KUBECONFIG [CONTEXT]\" (repeat for each)", func(v string) error {
		f := strings.Fields(v)
		if len(f) < 2 || len(f) > 3 || !annotation.ValidClusterID(f[0]) {
			return errors.New(`want "NAME KUBECONFIG [CONTEXT]" with NAME a cluster ID`)
		}
		o.peers = append(o.peers, strings.Join(f, " "))
		return nil
	})
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 || o.cluster == "" {
		fmt.Fprintln(stderr, "usage: mcsctl upgrade-corefile [-f Corefile|-] --cluster ID [--snapshot FILE] [--peer \"NAME KUBECONFIG\"]... [--verify DIR]")
		return errUsage
	}
	if !annotation.ValidClusterID(o.cluster) {
		return fmt.Errorf("--cluster %q: must be an RFC 1123 subdomain of at most %d characters", o.cluster, annotation.MaxClusterIDLen)
	}
	name, in := *file, stdin
	if name == "-" {
		name = "stdin"
	} else {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	text, err := io.ReadAll(io.LimitReader(in, maxManifest))
	if err != nil {
		return err
	}
	out, err := upgradeCorefile(name, text, o)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

// bufsize is the EDNS buffer size our server block sets (DNS Flag Day 2020):
// answers larger than this go over TCP instead of being amplified over UDP.
const bufsize = "1232"

// upgradeCorefile returns text with our block placed. It refuses, with the
// reason, a Corefile it cannot parse or cannot place us in.
func upgradeCorefile(name string, text []byte, o upgradeOptions) ([]byte, error) {
	zone := strings.ToLower(strings.TrimSuffix(o.zone, "."))
	blocks, err := caddyfile.Parse(name, bytes.NewReader(text), nil)
	if err != nil {
		return nil, fmt.Errorf("not a Corefile CoreDNS can read: %w", err)
	}
	if len(blocks) == 0 {
		return nil, errors.New("the Corefile has no server block: nothing to add us to (write one by hand, see the plugin README)")
	}
	for _, b := range blocks {
		if _, ok := b.Tokens["mcsannotations"]; ok {
			return nil, fmt.Errorf("server block %s already has an mcsannotations block: nothing to do", strings.Join(b.Keys, " "))
		}
		for _, k := range b.Keys {
			if z := keyZone(k); z == zone || strings.HasSuffix(z, "."+zone) {
				return nil, fmt.Errorf("server block %s already serves %s: queries for it would not reach our block; merge by hand", strings.Join(b.Keys, " "), zone)
			}
		}
	}
	raw, err := rawBlocks(name, text)
	if err != nil {
		return nil, err
	}
	target, err := chooseBlock(raw)
	if err != nil {
		return nil, err
	}
	if target.closeLine == 0 {
		return nil, fmt.Errorf("server block %s has no braces: add { } around its directives first", strings.Join(target.keys, " "))
	}

	lines := splitLines(text)
	closing := lines[target.closeLine-1]
	if strings.TrimSpace(string(closing)) != "}" {
		return nil, fmt.Errorf("server block %s ends on line %d with other text beside its \"}\": put the \"}\" on its own line first", strings.Join(target.keys, " "), target.closeLine)
	}
	nl := "\n"
	if bytes.HasSuffix(lines[0], []byte("\r\n")) {
		nl = "\r\n"
	}
	indent, step := target.indent, target.indent
	if indent == "" {
		indent, step = "    ", "    "
	}
	zones := zone
	if target.clusterDomain != "" && target.clusterDomain != zone {
		// Alias names of importing Pods answer in the cluster domain too
		// (docs/DESIGN.md, "Answer rules"); every other name there falls through.
		zones += " " + target.clusterDomain
	}
	var add bytes.Buffer
	if !target.hasBufsize {
		fmt.Fprintf(&add, "%sbufsize %s%s", indent, bufsize, nl)
	}
	fmt.Fprintf(&add, "%smcsannotations %s {%s", indent, zones, nl)
	fmt.Fprintf(&add, "%s%scluster %s%s", indent, step, o.cluster, nl)
	if o.snapshot != "" {
		fmt.Fprintf(&add, "%s%ssnapshot %s%s", indent, step, o.snapshot, nl)
	}
	for _, p := range o.peers {
		fmt.Fprintf(&add, "%s%speer %s%s", indent, step, p, nl)
	}
	if o.verify != "" {
		fmt.Fprintf(&add, "%s%sverify %s%s", indent, step, o.verify, nl)
	}
	fmt.Fprintf(&add, "%s}%s", indent, nl)

	// A last line without its newline gets one before what follows it.
	prev := target.closeLine - 2
	var out bytes.Buffer
	for i, l := range lines {
		if i == target.closeLine-1 {
			out.Write(add.Bytes())
		}
		out.Write(l)
		if i == prev && len(l) > 0 && l[len(l)-1] != '\n' {
			out.WriteString(nl)
		}
	}
	if _, err := caddyfile.Parse(name, bytes.NewReader(out.Bytes()), nil); err != nil {
		return nil, fmt.Errorf("the upgraded Corefile does not parse (please report this): %w", err)
	}
	return out.Bytes(), nil
}

// keyZone is the zone of a server block key: "dns://Zone.:53" -> "zone".
func keyZone(k string) string {
	k = strings.ToLower(k)
	if i := strings.Index(k, "://"); i >= 0 {
		k = k[i+3:]
	}
	if i := strings.LastIndexByte(k, ':'); i >= 0 && !strings.Contains(k[:i], ":") {
		k = k[:i]
	}
	if k != "." {
		k = strings.TrimSuffix(k, ".")
	}
	return k
}

// rawBlock is a top-level block of the Corefile's own tokens (no imports
// expanded, so lines are the file's).
type rawBlock struct {
	keys          []string
	closeLine     int    // line of the closing "}"; 0 without braces
	indent        string // indentation of the first directive
	hasKubernetes bool
	clusterDomain string // the kubernetes plugin's first forward zone
	hasBufsize    bool
	snippet       bool // (name) { ... }
}

// rawBlocks walks the lexer's tokens, as the caddyfile parser does, keeping
// the line of each block's closing brace.
func rawBlocks(name string, text []byte) ([]rawBlock, error) {
	d := caddyfile.NewDispenser(name, bytes.NewReader(text))
	lines := splitLines(text)
	var out []rawBlock
	var cur *rawBlock
	depth, lastLine := 0, 0
	directive := false // the next token at depth 1 on a new line starts a directive
	for d.Next() {
		v, line := d.Val(), d.Line()
		newLine := line != lastLine
		lastLine = line
		switch {
		case depth == 0 && v != "{" && v != "}":
			if cur == nil || cur.closeLine != 0 {
				out = append(out, rawBlock{})
				cur = &out[len(out)-1]
			}
			cur.keys = append(cur.keys, strings.TrimSuffix(v, ","))
			cur.snippet = strings.HasPrefix(v, "(") && strings.HasSuffix(v, ")")
		case v == "{":
			depth++
			directive = depth == 1
		case v == "}":
			if depth == 0 {
				return nil, fmt.Errorf("line %d: unexpected }", line)
			}
			depth--
			if depth == 0 && cur != nil {
				cur.closeLine = line
			}
		case depth == 1 && (newLine || directive):
			directive = false
			if cur.indent == "" && line <= len(lines) {
				l := lines[line-1]
				cur.indent = string(l[:len(l)-len(bytes.TrimLeft(l, " \t"))])
			}
			switch v {
			case "kubernetes":
				cur.hasKubernetes = true
				for _, z := range d.RemainingArgs() {
					z = strings.TrimSuffix(strings.ToLower(z), ".")
					if !strings.HasSuffix(z, ".arpa") && cur.clusterDomain == "" {
						cur.clusterDomain = z
					}
				}
				lastLine = d.Line()
			case "bufsize":
				cur.hasBufsize = true
			}
		}
	}
	return out, nil
}

// chooseBlock picks the server block that serves the cluster's DNS: the one
// with the kubernetes plugin, else the root zone's.
func chooseBlock(blocks []rawBlock) (*rawBlock, error) {
	var kube, root []*rawBlock
	for i := range blocks {
		b := &blocks[i]
		if b.snippet {
			continue
		}
		if b.hasKubernetes {
			kube = append(kube, b)
		}
		for _, k := range b.keys {
			if keyZone(k) == "." {
				root = append(root, b)
				break
			}
		}
	}
	switch {
	case len(kube) == 1:
		return kube[0], nil
	case len(kube) > 1:
		return nil, fmt.Errorf("%d server blocks have the kubernetes plugin: cannot tell which serves the cluster; add the block by hand", len(kube))
	case len(root) == 1:
		return root[0], nil
	}
	return nil, errors.New("no server block has the kubernetes plugin or serves the root zone \".\": cannot tell where the cluster's DNS is served; add the block by hand")
}

// splitLines splits text after each "\n", keeping the line endings.
func splitLines(text []byte) [][]byte {
	lines := bytes.SplitAfter(text, []byte("\n"))
	if len(lines) > 1 && len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	return lines
}
