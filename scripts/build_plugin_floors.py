"""Build the floor version of every Packer plugin the templates require, from its release source on the Go module
proxy, so the test suite can prove that every pair validates with the lowest versions ``required_plugins`` allows.

    .venv/bin/python scripts/build_plugin_floors.py [--dest DIR] [--newest DIR]

Writes ``DIR/packer-plugin-<type>`` and ``DIR/<type>.source`` ("<source address> <version>"), the layout
``--packer-plugins DIR`` reads (default DIR: ~/.cache/image-builder/packer-plugin-floors). A binary already built
at the floor version is kept, so a rerun takes a second. A floor the module proxy does not serve is taken from
``--newest DIR`` (the plugins built from ../shared/packer-src) when that is the same version. The version is set
the way the plugins' release builds set it (ldflags on their ``version`` package).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagebuilder.builder.packer_plugins import PLUGINS, describe, requirements_for  # noqa: E402


def go_binary() -> str:
    for candidate in ("/usr/local/go/bin/go", shutil.which("go", path=f"{ROOT / '.venv/bin'}:{os.environ['PATH']}")):
        if candidate and Path(candidate).is_file():
            return candidate
    sys.exit("build_plugin_floors: no Go toolchain (run ./scripts/setup.sh)")


def module_of(source: str) -> str:
    """``github.com/hashicorp/qemu`` -> ``github.com/hashicorp/packer-plugin-qemu`` (the plugin's Go module)."""
    host_ns, _, kind = source.rpartition("/")
    return f"{host_ns}/packer-plugin-{kind}"


def build(go: str, module: str, version: str, out: Path) -> bool:
    """Build ``module@v<version>`` into ``out``; False when the module proxy does not serve that version."""
    env = {**os.environ, "GOFLAGS": "-buildvcs=false -mod=mod", "CGO_ENABLED": "0"}
    with tempfile.TemporaryDirectory(prefix="plugin-floor-") as tmp:
        info = subprocess.run([go, "mod", "download", "-json", f"{module}@v{version}"], capture_output=True,
                              text=True, env=env, cwd=tmp, check=False)  # fmt: skip
        data = json.loads(info.stdout or "{}")
        if "Dir" not in data:
            print(f"  {module}@v{version}: not on the module proxy ({data.get('Error', info.stderr)[:160]})")
            return False
        work = Path(tmp) / "src"
        shutil.copytree(data["Dir"], work)
        for path in [work, *work.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
        ldflags = f"-s -w -X {module}/version.Version={version} -X {module}/version.VersionPrerelease="
        subprocess.run([go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(out) + ".tmp", "."], cwd=work,
                       env={**env, "GOFLAGS": "-buildvcs=false"}, check=True)  # fmt: skip
    Path(str(out) + ".tmp").rename(out)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path.home() / ".cache/image-builder/packer-plugin-floors")
    parser.add_argument("--newest", type=Path, default=Path.home() / ".cache/packer-from-source/plugins")
    args = parser.parse_args()
    args.dest.mkdir(parents=True, exist_ok=True)
    go = go_binary()
    for req in requirements_for(PLUGINS):
        floor = req.constraint.floor
        assert floor is not None, f"{req.name}: {req.version} has no floor"
        out = args.dest / f"packer-plugin-{req.type}"
        stamp = args.dest / f"{req.type}.source"
        wanted = f"{req.source} {floor}"
        if out.is_file() and stamp.is_file() and stamp.read_text().strip() == wanted:
            print(f"kept  {out} ({floor})")
            continue
        print(f"build {req.type} {floor}")
        if not build(go, module_of(req.source), str(floor), out):
            newest = args.newest / f"packer-plugin-{req.type}"
            if not newest.is_file() or describe(newest)["version"] != str(floor):
                sys.exit(f"build_plugin_floors: {req.type} {floor} is neither on the module proxy nor in {args.newest}")
            shutil.copy2(newest, out)
        if describe(out)["version"] != str(floor):
            sys.exit(f"build_plugin_floors: {out} does not describe itself as {floor}")
        stamp.write_text(wanted + "\n")
        print(f"built {out} ({floor})")
    print(f"done: {args.dest}")


if __name__ == "__main__":
    main()
