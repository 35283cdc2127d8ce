#!/usr/bin/env bash
# Installs the Debian packages that kubevol's real-system tests use:
# etcd-server (serial volume access across driver replicas), bindfs and fuse3
# (a FUSE mount whose daemon dies = a corrupted mount), quota and xfsprogs
# (project quotas), e2fsprogs and util-linux (ext4 images on loop devices),
# glusterfs-server and glusterfs-client (a real network filesystem whose server can be
# frozen or killed: kubevol.testing.glusterfs), python3 (the system's Python, which the
# tests run as an unprivileged user: a virtualenv's may not be theirs to run), man-db
# (kubevol(1) is rendered by its test).
set -euo pipefail
packages=(etcd-server bindfs fuse3 quota xfsprogs e2fsprogs util-linux coreutils
          glusterfs-server glusterfs-client python3 man-db)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "kubevol tests need these Debian packages: ${missing[*]}" >&2
    echo "install them as root: apt-get install ${missing[*]}" >&2
    exit 1
fi
echo "installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q "${missing[@]}" >/dev/null
