"""image-builder: build, download and register Kubernetes node images.

The package is the library behind the Invoke tasks in :mod:`imagebuilder.cli`; tasks parse flags, call into
these modules and print. Nothing here prints on its own except through :mod:`imagebuilder.ui`.
"""

__version__ = "0.1.2"
