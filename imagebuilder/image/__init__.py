"""Disk images themselves: the base image (debootstrap), boot and filesystem checks, the member-per-MiB gzip, OVAs,
QEMU guests, packaging of outputs, image diffs, the node check, and customization applied to a local image.

May import: ``core``, ``release``, ``attest``, ``publish``, ``customization``.
"""
