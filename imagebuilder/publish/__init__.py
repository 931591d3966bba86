"""Publishing images with proof: a TUF repository (python-tuf's Metadata API) in a folder or in S3-compatible
object storage, which ``image.publish`` adds images, SBOMs and provenance to, and ``repo.*`` creates, rotates and
refreshes. Readers use :mod:`imagebuilder.release.tufclient`, the path OS-1 downloads take.

May import: ``core``, ``release``, ``attest``.
"""
