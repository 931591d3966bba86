#!/bin/sh
# install-runtime.sh TARBALL [RUNC] [ROOT]
#
# The release's container runtime, from its containerd tarball in any layout a release ships it in, to fixed places
# under ROOT (default /): containerd, ctr and containerd-shim-runc-v2 to /usr/local/bin, runc to /usr/local/sbin,
# containerd's unit to /etc/systemd/system. The layouts:
#   release.build's:                 usr/local/bin/..., usr/local/sbin/runc, etc/systemd/system/containerd.service
#   the reference's bundle (EKS-A):  usr/local/bin/..., sbin/runc; no unit
#   containerd's own release:        bin/...; no runc (RUNC names runc's binary) and no unit
# Where the tarball has no unit, containerd's own unit is written. The tarball is unpacked in a folder of its own,
# never over /: GNU tar replaces a symlink to a directory by the directory it extracts, so a tarball's ./sbin would
# take the place of a merged-/usr system's /sbin -> usr/sbin. Only regular files are taken from it (a link in it
# could name any file of the host), and nothing is written outside the paths above.
set -eu
tarball=$1 runc=${2:-} root=${3:-}
stage=$(mktemp -d)
trap 'rm -rf -- "$stage"' EXIT
tar -xzf "$tarball" --no-same-owner --no-same-permissions -C "$stage"

# the first regular file (not a link) of that name in these folders of the tarball
pick() {
  name=$1; shift
  for d in "$@"; do
    if [ -f "$stage/$d/$name" ] && [ ! -L "$stage/$d/$name" ]; then
      echo "$stage/$d/$name"
      return 0
    fi
  done
  return 1
}

mkdir -p -m 0755 "$root/usr/local/bin" "$root/usr/local/sbin" "$root/etc/systemd/system"
for b in containerd ctr containerd-shim-runc-v2; do
  src=$(pick "$b" usr/local/bin bin) || { echo "install-runtime: $tarball holds no $b (usr/local/bin/ or bin/)" >&2; exit 1; }
  install -m 0755 "$src" "$root/usr/local/bin/$b"
done
if src=$(pick runc usr/local/sbin sbin usr/sbin usr/local/bin bin); then
  :
elif [ -n "$runc" ] && [ -f "$runc" ] && [ ! -L "$runc" ]; then
  src=$runc
else
  echo "install-runtime: no runc: $tarball holds none and no runc binary was staged beside it" >&2
  exit 1
fi
install -m 0755 "$src" "$root/usr/local/sbin/runc"
if src=$(pick containerd.service etc/systemd/system usr/local/lib/systemd/system lib/systemd/system); then
  install -m 0644 "$src" "$root/etc/systemd/system/containerd.service"
else
  cat > "$root/etc/systemd/system/containerd.service" <<'EOF'
[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=network.target dbus.service

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
EOF
  chmod 0644 "$root/etc/systemd/system/containerd.service"
fi
