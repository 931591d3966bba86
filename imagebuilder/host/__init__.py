"""The machines around the builds: the build host's preparation (``prepare``, from ``config``) and its check before a
build (``preflight``), the cluster network's DHCP host (``dhcp``) and the image server for bare metal (``serve``).

May import: ``core``, ``release``, ``attest``, ``publish``, ``customization``, ``image``, ``hardening``, ``vsphere``,
``plan``,
``providers``, ``builder``.
"""
