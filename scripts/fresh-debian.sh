#!/usr/bin/env bash
# Runs a command in a clean clone of this project inside a brand-new minimal Debian 12 (bookworm)
# made with debootstrap: nothing installed but the base system, so a missing install step fails
# here as it would for a new user. Needs root and Debian's package servers (nothing else).
#
#   scripts/fresh-debian.sh                                   # bash scripts/test.sh
#   scripts/fresh-debian.sh 'bash scripts/run.sh --set train.max_steps=20'
#
# Environment: REPO (default: this project's git top level; its committed HEAD is what gets
# cloned, so commit first), ROOTFS (default /tmp/tetrad-fresh-debian; the pristine base is kept
# as a tarball between runs, each run starts from a fresh copy of it), KEEP=1 keeps the tree.
# Prints the command's output and its time; exits with its status.
set -euo pipefail
CMD=${1:-bash scripts/test.sh}
REPO=${REPO:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}
BASE=${ROOTFS:-/tmp/tetrad-fresh-debian}
TARBALL="$BASE.base.tar"
ROOT="$BASE.run"

[ "$(id -u)" -eq 0 ] || { echo "fresh-debian: needs root (debootstrap, chroot, mounts)"; exit 2; }
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }

if [ ! -f "$TARBALL" ]; then
  echo "== making a minimal Debian 12 base (once, ~1 min)"
  rm -rf "$BASE"
  debootstrap --variant=minbase bookworm "$BASE" >/dev/null
  tar -C "$BASE" -cf "$TARBALL" .
  rm -rf "$BASE"
fi

cleanup() {
  for m in dev/pts dev proc sys; do umount -l "$ROOT/$m" 2>/dev/null || true; done
  [ "${KEEP:-0}" = 1 ] || rm -rf "$ROOT"
}
trap cleanup EXIT
cleanup
mkdir -p "$ROOT"
tar -C "$ROOT" -xf "$TARBALL"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
mount -t proc proc "$ROOT/proc"
mount -t sysfs sys "$ROOT/sys"
mount --bind /dev "$ROOT/dev"
mount --bind /dev/pts "$ROOT/dev/pts"
git clone -q "$REPO" "$ROOT/root/project"
echo "== in a fresh Debian 12 ($(git -C "$REPO" rev-parse --short HEAD)): $CMD"
start=$(date +%s)
set +e
chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 CI=true /bin/bash -c "cd /root/project && $CMD"
rc=$?
set -e
echo "== exit $rc after $(( $(date +%s) - start )) s"
exit $rc
