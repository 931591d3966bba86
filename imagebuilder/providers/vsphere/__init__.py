"""vSphere (platform): the OVA build (``provider``), on vCenter or locally; the vCenter side of templates is the
``imagebuilder.vsphere`` package."""
