"""Jinja2 rendering of the project's templates (Packer HCL, cloud-init, kickstart, OVF, dhcpd.conf).

Templates receive already-validated values and only lay them out; the ``hcl`` filter makes HCL2 literals.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import jinja2

ROOT = Path(__file__).resolve().parent.parent


def hcl(value: Any) -> str:
    """A Python value as an HCL2 literal (strings escaped, including ``${`` and ``%{`` template openers)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value).replace("${", "$${").replace("%{", "%%{")
    if isinstance(value, list | tuple):
        return "[" + ", ".join(hcl(v) for v in value) + "]"
    raise TypeError(f"no HCL literal for {type(value).__name__}")


def template_env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(ROOT)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # noqa: S701 - renders HCL, YAML and kickstart, not HTML
    )
    env.filters["hcl"] = hcl
    env.filters["tojson"] = json.dumps
    env.filters["b64encode"] = lambda text: base64.b64encode(text.encode()).decode()
    return env
