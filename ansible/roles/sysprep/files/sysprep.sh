#!/bin/sh
# Make the image safe to clone (spec 4.8 step 6): no identity of the build machine survives. One script, not a
# task per step: every task is a module run (about a quarter of a second each, in a VM or a chroot).
set -eu

# an empty machine-id (each clone makes its own at first boot), and dbus's copy a link to it
: > /etc/machine-id
chmod 0444 /etc/machine-id
if [ -d /var/lib/dbus ]; then
  ln -sfn /etc/machine-id /var/lib/dbus/machine-id
fi

# the SSH host keys (each clone generates its own)
rm -f /etc/ssh/ssh_host_*

# cloud-init's state, logs and seed (and the machine-id, where this cloud-init can)
if cloud-init clean --help | grep -q -- '--machine-id'; then
  cloud-init clean --logs --seed --machine-id
else
  cloud-init clean --logs --seed
fi

# the hostname (cloud-init sets each clone's) and the network config cloud-init wrote for the build machine
: > /etc/hostname
chmod 0644 /etc/hostname
rm -f /etc/netplan/50-cloud-init.yaml

# old logs
find /var/log -type f \( -name '*.gz' -o -name '*.[0-9]' -o -name '*.old' \) -delete

# cloud-init sets each clone's hostname
cfg=/etc/cloud/cloud.cfg
if grep -q '^preserve_hostname:' "$cfg"; then
  sed -i 's/^preserve_hostname:.*$/preserve_hostname: false/' "$cfg"
else
  printf 'preserve_hostname: false\n' >> "$cfg"
fi

# the seal script (removes the build user, then powers off), rendered by the controller: the script's first argument
if [ -n "${1:-}" ]; then
  umask 022
  printf '%s\n' "$1" > /usr/local/sbin/image-builder-seal.tmp
  chmod 0755 /usr/local/sbin/image-builder-seal.tmp
  mv -f /usr/local/sbin/image-builder-seal.tmp /usr/local/sbin/image-builder-seal
fi
