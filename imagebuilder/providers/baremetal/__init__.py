"""Bare metal: the raw disk build (``provider``), by Packer or the chroot engine."""
