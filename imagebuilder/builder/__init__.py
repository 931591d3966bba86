"""Building node images: resolving a request into a plan (``resolve``; the request and the plan are ``plan``'s), the
build's inputs and their digest (``inputs``), the run (``runner``) through Packer (``packer``, ``packer_plugins``) or
the chroot engine (``chroot``, ``chroot_mounts``), many images at once (``matrix``, ``ci_emit``), the room a build
needs (``disk_need``), the template check (``lint``) and the check of a built image against its plan (``verify``).

May import: ``core``, ``release``, ``attest``, ``publish``, ``customization``, ``image``, ``hardening``, ``vsphere``,
``plan``,
``providers``.
"""
