"""The OS-1 image variants spec 4.5 publishes, in a module of their own: ``download.bottlerocket`` checks its
``--variant`` against them before python-tuf and the product profile are loaded (a bad flag is answered in a fraction
of the start-up a download needs)."""

from __future__ import annotations

#: vsphere: the OVA; baremetal: the raw disk (lz4 upstream, written as gzip)
VARIANTS = ("vsphere", "baremetal")
