"""What an image says about itself: its SBOM (SPDX 2.3, from the image's own package database), its signed
provenance (an in-toto statement with a SLSA v1 predicate in a DSSE envelope), and the signing keys both use.

May import: ``core``, ``release``.
"""
