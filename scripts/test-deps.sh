#!/usr/bin/env bash
# What `make test` needs on a fresh machine (Go, gcc and python3 given), installed
# once; a no-op where it is all there. Called by `make test-deps`.
#   - staticcheck at its pinned version at $STATICCHECK (go install into its directory,
#     so the Makefile runs what was installed whether or not GOBIN is set);
#   - tracefs mounted for eBPF block tracing (as root, where it is not);
#   - /dev/fuse and /dev/loop-control for the EIO fault tests (internal/faultfs,
#     runtime TestEIO*): modprobe where the node is missing;
#   - Debian packages of the tests against real servers and real tensors: etcd-server
#     (KV-event membership tests start /usr/bin/etcd on 127.0.0.1), python3-zmq and
#     python3-msgpack (a second implementation of the KV-event wire format),
#     python3-torch (CPU tensors for the Python binding's tests; /usr/bin/python3 sees it)
#     and python3-prometheus-client (the vLLM connector's metrics registered beside vLLM's own).
# Tests that need one of these skip, saying so, where it is missing and cannot be
# installed (not root, no apt-get); CI installs everything.
set -euo pipefail
STATICCHECK=${STATICCHECK:?}
STATICCHECK_VERSION=${STATICCHECK_VERSION:?}
GO=${GO:-go}
if [ ! -x "$STATICCHECK" ]; then
	echo "test-deps: installing staticcheck $STATICCHECK_VERSION"
	GOBIN=$(dirname "$STATICCHECK") "$GO" install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
fi
[ "$(id -u)" = 0 ] || exit 0
if [ -d /sys/kernel/tracing ] && [ ! -e /sys/kernel/tracing/events ]; then
	mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi
if command -v modprobe >/dev/null 2>&1; then
	[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
	[ -e /dev/loop-control ] || modprobe loop 2>/dev/null || true
fi
command -v apt-get >/dev/null 2>&1 || exit 0
pkgs=(etcd-server python3-zmq python3-msgpack python3-torch python3-prometheus-client)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} = 0 ] && exit 0
echo "test-deps: apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/tutti-test-deps.log 2>&1 ||
	{ apt-get update -q >>/tmp/tutti-test-deps.log 2>&1 &&
		apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/tutti-test-deps.log 2>&1; } ||
	{ echo "test-deps: apt-get failed (see /tmp/tutti-test-deps.log)"; tail -5 /tmp/tutti-test-deps.log; exit 1; }
