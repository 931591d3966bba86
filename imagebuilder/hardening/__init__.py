"""Hardened node images (issue 62): ComplianceAsCode's content (built from its source release, or a site's own),
the tailoring that keeps what a Kubernetes node needs, its remediation (applied in a chroot build, or by Packer's
Ansible in the build VM), and OpenSCAP's scan of a finished image, offline.

May import: ``core``, ``release``, ``attest``, ``publish``, ``customization``, ``image``.
"""
