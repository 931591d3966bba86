"""image-builder: build, download and register Kubernetes node images.

The package is the library behind the Invoke tasks in :mod:`imagebuilder.cli`; tasks parse flags, call into
these modules and print. The library reports through return values, exceptions (:mod:`imagebuilder.core.errors`) and
the progress protocol of :mod:`imagebuilder.core.progress`; only the CLI prints and draws progress bars.
"""

__version__ = "0.1.2"
