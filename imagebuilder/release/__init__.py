"""What is built from: the product profile and the catalog (OS, providers, release channels), Kubernetes release
manifests and product releases, the air-gap mirror, the stand-in and from-source releases, OS-1 images over TUF,
the bare-metal hook.

May import: ``core``.
"""
