#!/usr/bin/env python3
"""Print what an image's package database says, as JSON, for its SBOM (image-builder's attest.packages parses it).

Run on the build VM by the sbom role (``inventory.py / FILE``), and by image-builder itself on a mounted image
(``inventory.py ROOT``, to standard output): one collector, so an SBOM reads the same whichever way the image was
made. Raw data only (the dpkg status file, the
declared license line of each machine-readable copyright file, or rpm's query); the parsing is done on the build host.
Python 3.6 compatible: it runs on every target OS's own interpreter.
"""

import glob
import hashlib
import json
import os
import subprocess
import sys

#: the container runtime's binaries, where a release's tarball puts them (/usr/local) or an OS package does (/usr):
#: their digests go into the SBOM and image.diff compares them
RUNTIME = (
    "usr/local/bin/containerd",
    "usr/local/bin/ctr",
    "usr/local/bin/containerd-shim-runc-v2",
    "usr/local/sbin/runc",
    "usr/bin/containerd",
    "usr/bin/ctr",
    "usr/bin/containerd-shim-runc-v2",
    "usr/sbin/runc",
    "usr/bin/runc",
    "usr/bin/crictl",
    "usr/local/bin/crictl",
)
RPM_QUERY = "%{NAME}\\t%{EPOCHNUM}\\t%{VERSION}\\t%{RELEASE}\\t%{ARCH}\\t%{LICENSE}\\t%{SOURCERPM}\\n"


def read(root, name):
    try:
        with open(os.path.join(root, name), encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def declared_license(path):
    """The machine-readable copyright file's ``Format:`` line and the ``License:`` of its ``Files: *`` paragraph
    (what the package as a whole is under), or None for a free-form file."""
    lines = []
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            first = fh.readline()
            if not first.startswith("Format:"):
                return None
            lines.append(first.strip()[:200])
            in_all = False
            for line in fh:
                if line.startswith("Files:"):
                    in_all = line.split(":", 1)[1].strip() == "*"
                elif in_all and line.startswith("License:"):
                    lines.append(line.strip()[:200])
                    break
    except OSError:
        return None
    return "\n".join(lines)


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def runtime(root):
    """Path (from /) -> sha256 of each runtime binary the image holds (a link is read through only inside it)."""
    found = {}
    for rel in RUNTIME:
        path = os.path.join(root, rel)
        if os.path.isfile(path) and not os.path.islink(path):
            found["/" + rel] = sha256(path)
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "/"
    out = {"format": 1, "os_release": read(root, "etc/os-release") or read(root, "usr/lib/os-release") or ""}
    out["runtime"] = runtime(root)
    status = read(root, "var/lib/dpkg/status")
    if status is not None:
        out["dpkg_status"] = status
        licenses = {}
        for path in sorted(glob.glob(os.path.join(root, "usr/share/doc/*/copyright"))):
            text = declared_license(path)
            if text:
                licenses[os.path.basename(os.path.dirname(path))] = text
        out["copyright"] = licenses
    elif os.path.isdir(os.path.join(root, "var/lib/rpm")) or os.path.isdir(os.path.join(root, "usr/lib/sysimage/rpm")):
        command = ["rpm", "-qa", "--qf", RPM_QUERY]
        if root != "/":
            command[1:1] = ["--root", root]
        out["rpm"] = subprocess.check_output(command).decode("utf-8", "replace")
    if len(sys.argv) > 2:  # the role's form: into a file it then fetches (0600: nothing else reads it meanwhile)
        fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(out, fh)
    else:
        json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
