package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kubeadmCorefile is kubeadm's default Corefile (cmd/kubeadm/app/phases/addons/dns).
const kubeadmCorefile = `.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30
    loop
    reload
    loadbalance
}
`

const ourBlock = `    bufsize 1232
    mcsannotations clusterset.local cluster.local {
        cluster edge-a
        snapshot /var/lib/mcsannotations/table.db
    }
`

func TestUpgradeCorefile(t *testing.T) {
	opts := upgradeOptions{zone: "clusterset.local", cluster: "edge-a", snapshot: defaultSnapshot}
	tests := []struct {
		name   string
		in     string
		opts   *upgradeOptions
		want   string // the whole output
		errSub string
	}{
		{name: "kubeadm default", in: kubeadmCorefile,
			want: strings.TrimSuffix(kubeadmCorefile, "}\n") + ourBlock + "}\n"},
		{name: "peers and verify", in: kubeadmCorefile,
			opts: &upgradeOptions{zone: "clusterset.local.", cluster: "edge-a", peers: []string{"edge-b /etc/mcs/peers/edge-b.kubeconfig"}, verify: "/etc/mcs/keys"},
			want: strings.TrimSuffix(kubeadmCorefile, "}\n") + `    bufsize 1232
    mcsannotations clusterset.local cluster.local {
        cluster edge-a
        peer edge-b /etc/mcs/peers/edge-b.kubeconfig
        verify /etc/mcs/keys
    }
}
`},
		{name: "other blocks, comments and a custom cluster domain kept",
			in: "# site DNS\nexample.org:53 {\n\tfile /etc/db.example.org   # zone\n}\n\n.:53 {\n\terrors\n\tbufsize 512\n\tkubernetes edge.example in-addr.arpa\n\tforward . 10.0.0.1\n}\n# end\n",
			want: "# site DNS\nexample.org:53 {\n\tfile /etc/db.example.org   # zone\n}\n\n.:53 {\n\terrors\n\tbufsize 512\n\tkubernetes edge.example in-addr.arpa\n\tforward . 10.0.0.1\n" +
				"\tmcsannotations clusterset.local edge.example {\n\t\tcluster edge-a\n\t\tsnapshot /var/lib/mcsannotations/table.db\n\t}\n}\n# end\n"},
		{name: "CRLF line endings", in: strings.ReplaceAll(kubeadmCorefile, "\n", "\r\n"),
			want: strings.ReplaceAll(strings.TrimSuffix(kubeadmCorefile, "}\n")+ourBlock+"}\n", "\n", "\r\n")},
		{name: "no newline at the end", in: ". {\n  forward . 1.1.1.1\n}",
			want: ". {\n  forward . 1.1.1.1\n  bufsize 1232\n  mcsannotations clusterset.local {\n    cluster edge-a\n    snapshot /var/lib/mcsannotations/table.db\n  }\n}"},
		{name: "snippet and import", in: "(common) {\n    errors\n}\n.:53 {\n    import common\n    kubernetes cluster.local\n}\n",
			want: "(common) {\n    errors\n}\n.:53 {\n    import common\n    kubernetes cluster.local\n" + ourBlock + "}\n"},
		{name: "a server block for the clusterset zone", in: kubeadmCorefile + "clusterset.local:53 {\n    forward . 10.1.1.1\n}\n",
			errSub: "server block clusterset.local:53 already serves clusterset.local"},
		{name: "a subzone block with a scheme", in: kubeadmCorefile + "dns://Foo.ClusterSet.Local. {\n    whoami\n}\n",
			errSub: "already serves clusterset.local"},
		{name: "already upgraded", in: strings.TrimSuffix(kubeadmCorefile, "}\n") + ourBlock + "}\n",
			errSub: "already has an mcsannotations block"},
		{name: "unbalanced braces", in: ".:53 {\n    errors\n", errSub: "not a Corefile CoreDNS can read"},
		{name: "empty", in: "# nothing\n", errSub: "has no server block"},
		{name: "two kubernetes blocks", in: "a.:53 {\n kubernetes a\n}\nb.:53 {\n kubernetes b\n}\n", errSub: "2 server blocks have the kubernetes plugin"},
		{name: "no cluster DNS block", in: "example.org {\n whoami\n}\n", errSub: "no server block has the kubernetes plugin"},
		{name: "closing brace with text beside it", in: ". {\n    whoami\n} # end\n", errSub: "put the \"}\" on its own line"},
		{name: "no braces", in: ".\nwhoami\n", errSub: "has no braces"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := opts
			if tc.opts != nil {
				o = *tc.opts
			}
			got, err := upgradeCorefile("Corefile", []byte(tc.in), o)
			if tc.errSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errSub) {
					t.Fatalf("error %v, want one containing %q; output:\n%s", err, tc.errSub, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestUpgradeCorefileCommand(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(in, []byte(kubeadmCorefile), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if rc := run([]string{"mcsctl", "upgrade-corefile", "-f", in, "--cluster", "edge-a"}, nil, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	if want := strings.TrimSuffix(kubeadmCorefile, "}\n") + ourBlock + "}\n"; out.String() != want {
		t.Errorf("got:\n%s", out.String())
	}
	// From stdin, and refused with the reason and status 1.
	out.Reset()
	errb.Reset()
	if rc := run([]string{"kubectl-mcs", "upgrade-corefile", "--cluster", "edge-a"}, strings.NewReader(out.String()+"clusterset.local {\n}\n"), &out, &errb); rc != 1 ||
		!strings.Contains(errb.String(), "kubectl mcs upgrade-corefile: server block clusterset.local already serves") {
		t.Errorf("exit %d, stderr %q", rc, errb.String())
	}
	if out.Len() != 0 {
		t.Errorf("a refused Corefile printed %q", out.String())
	}
	// Without --cluster: usage, status 2.
	if rc := run([]string{"mcsctl", "upgrade-corefile", "-f", in}, nil, &out, &errb); rc != 2 {
		t.Errorf("without --cluster: exit %d", rc)
	}
	if rc := run([]string{"mcsctl", "upgrade-corefile", "-f", in, "--cluster", "Not_An_ID"}, nil, &out, &errb); rc != 1 {
		t.Errorf("bad --cluster: exit %d", rc)
	}
}
