#!/usr/bin/env bash
# tools/install.sh: the tools the end-to-end tests need, installed only when missing.
#
#   - etcd            built from tools/etcd/go.mod  into .cache/tools/etcd-<version>/etcd
#   - kube-apiserver  built from tools/k8s/go.mod   into .cache/tools/kube-apiserver-<version>/kube-apiserver
#   - kubelet, kube-proxy, kube-controller-manager, kube-scheduler, kubectl (real nodes,
#                     `make e2e-node`): the same module, version and stamp, into
#                     .cache/tools/<name>-<version>/<name>; only with `node`
#   - containerd, runc, Debian packages containerd, runc, containernetworking-plugins,
#     CNI plugins,    iptables and conntrack (kube-proxy's iptables mode); only with `node`
#     iptables
#   - dig, dnsperf,   Debian packages bind9-dnsutils, dnsperf and valgrind (apt-get update
#     valgrind        only when needed); valgrind's callgrind counts instructions in `make bench`
#
# The versions come from the go.mod files, so bumping a version there makes a new
# cache folder and a rebuild; an existing binary is never rebuilt. Binaries are
# written under a temporary name and renamed into place, so an interrupted build
# never leaves a binary that looks complete. A lock serialises concurrent runs.
#
# Usage: tools/install.sh [all|etcd|kube-apiserver|dns|node]   (default: all)
#        tools/install.sh env     prints MCS_E2E_ETCD=..., MCS_E2E_APISERVER=... and the
#                                 node tools' MCS_E2E_KUBELET=... (built or not)
# Env:   MCS_TOOLS_CACHE  overrides the cache folder (default <repo>/.cache/tools)
#        GO               the go command (default go)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${MCS_TOOLS_CACHE:-$ROOT/.cache/tools}
GO=${GO:-go}

modversion() { # modversion <go.mod> <module path>
	awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"
}

ETCD_VERSION=$(modversion "$ROOT/tools/etcd/go.mod" go.etcd.io/etcd/server/v3)
K8S_VERSION=$(modversion "$ROOT/tools/k8s/go.mod" k8s.io/kubernetes)
[[ -n $ETCD_VERSION && -n $K8S_VERSION ]] || {
	echo "install.sh: cannot read versions from tools/etcd/go.mod and tools/k8s/go.mod" >&2
	exit 1
}
ETCD_BIN=$CACHE/etcd-$ETCD_VERSION/etcd
APISERVER_BIN=$CACHE/kube-apiserver-$K8S_VERSION/kube-apiserver
NODE_TOOLS=(kubelet kube-proxy kube-controller-manager kube-scheduler kubectl)
k8sbin() { echo "$CACHE/$1-$K8S_VERSION/$1"; }

PARTIAL= # a binary being built, removed if the script stops half-way
trap '[[ -z $PARTIAL ]] || rm -f "$PARTIAL"' EXIT

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

# build <module dir> <package> <output> [go build flags...]
build() {
	local dir=$1 pkg=$2 out=$3
	shift 3
	local name t0
	name=$(basename "$out")
	if [[ -x $out ]]; then
		echo "tools: $name present: $out"
		return
	fi
	t0=$(now)
	echo "tools: building $name into $out (a cold build takes minutes)"
	mkdir -p "$(dirname "$out")"
	PARTIAL=$out.tmp.$$
	(cd "$dir" && "$GO" build "$@" -o "$PARTIAL" "$pkg")
	mv -f "$PARTIAL" "$out"
	PARTIAL=
	echo "tools: built $name in $(since "$t0")"
}

build_etcd() {
	build "$ROOT/tools/etcd" go.etcd.io/etcd/server/v3 "$ETCD_BIN"
}

# build_k8s <command>: one of k8s.io/kubernetes/cmd/<command> from tools/k8s.
build_k8s() {
	# Stamp the version, or the server reports v0.0.0-master (RECIPES.md).
	local major minor v=k8s.io/component-base/version
	major=${K8S_VERSION#v}
	major=${major%%.*}
	minor=${K8S_VERSION#v*.}
	minor=${minor%%.*}
	build "$ROOT/tools/k8s" "k8s.io/kubernetes/cmd/$1" "$(k8sbin "$1")" \
		-ldflags "-X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=$major -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
}

build_apiserver() {
	build_k8s kube-apiserver
}

# apt_install <package>...: apt-get install, updating the package lists
# only when needed: when the packages are not known yet, or when installing
# from the lists we have fails (stale lists).
apt_install() {
	local t0 sudo=() updated=
	((EUID == 0)) || sudo=(sudo)
	t0=$(now)
	echo "tools: apt-get install $*"
	if ! apt-cache show "$@" >/dev/null 2>&1; then
		"${sudo[@]}" apt-get update -qq
		updated=1
	fi
	if ! DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "$@" >/dev/null; then
		[[ -z $updated ]] || return 1
		echo "tools: apt-get install failed; updating the package lists and trying again"
		"${sudo[@]}" apt-get update -qq
		DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "$@" >/dev/null
	fi
	echo "tools: installed $* in $(since "$t0")"
}

install_dns() {
	local missing=()
	command -v dig >/dev/null || missing+=(bind9-dnsutils)
	command -v dnsperf >/dev/null || missing+=(dnsperf)
	command -v callgrind_control >/dev/null || missing+=(valgrind)
	if ((${#missing[@]} == 0)); then
		echo "tools: dig, dnsperf and valgrind present"
		return
	fi
	apt_install "${missing[@]}"
}

# The node's runtime: containerd (with ctr), runc, the CNI plugins kubelet's
# bridge network uses (/usr/lib/cni), iptables and conntrack for kube-proxy.
install_runtime() {
	local missing=()
	command -v containerd >/dev/null || missing+=(containerd)
	command -v runc >/dev/null || missing+=(runc)
	[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || missing+=(containernetworking-plugins)
	command -v iptables >/dev/null || missing+=(iptables)
	command -v conntrack >/dev/null || missing+=(conntrack)
	if ((${#missing[@]} == 0)); then
		echo "tools: containerd, runc, CNI plugins, iptables and conntrack present"
		return
	fi
	apt_install "${missing[@]}"
}

build_node() {
	local t
	for t in "${NODE_TOOLS[@]}"; do
		build_k8s "$t"
	done
	install_runtime
}

what=${1:-all}
if [[ $what == env ]]; then
	echo "MCS_E2E_ETCD=$ETCD_BIN"
	echo "MCS_E2E_APISERVER=$APISERVER_BIN"
	for t in "${NODE_TOOLS[@]}"; do
		v=${t//-/_}
		echo "MCS_E2E_${v^^}=$(k8sbin "$t")"
	done
	exit 0
fi

T0=$(now)
mkdir -p "$CACHE"
exec 9>"$CACHE/.install.lock"
if ! flock -w 1800 9; then
	echo "install.sh: another install holds $CACHE/.install.lock for 30 min; giving up" >&2
	exit 1
fi
case $what in
all) build_etcd && build_apiserver && install_dns ;;
etcd) build_etcd ;;
kube-apiserver) build_apiserver ;;
dns) install_dns ;;
node) build_etcd && build_apiserver && build_node ;;
*)
	echo "usage: $0 [all|etcd|kube-apiserver|dns|node|env]" >&2
	exit 2
	;;
esac
echo "tools: done in $(since "$T0")"
