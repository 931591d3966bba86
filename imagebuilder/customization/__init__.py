"""The customization family's common part: ``model`` (the customize.yaml file: users, CA certificates, registries,
files, and the seed documents it becomes) and ``roles`` (runs the customize role over SSH on a booted guest). It is
applied three ways, each named ``apply_customization`` in its own package: on a vSphere template
(``vsphere.apply_customization``), on a local image (``image.apply_customization``), and during a build (the node
roles take it, through the build's inputs).

May import: ``core``, ``release``, ``attest``, ``publish``.
"""
