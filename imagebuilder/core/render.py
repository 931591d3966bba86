"""Jinja2 rendering of the project's templates (Packer HCL, cloud-init, kickstart, OVF, dhcpd.conf).

Templates receive already-validated values and only lay them out; the ``hcl`` filter makes HCL2 literals.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import jinja2

from imagebuilder.core.paths import BUNDLE

ROOT = BUNDLE


_HCL_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _hcl_char(ch: str) -> str:
    if ch in _HCL_ESCAPES:
        return _HCL_ESCAPES[ch]
    code = ord(ch)
    if code < 0x20 or 0x7F <= code < 0xA0 or 0xD800 <= code < 0xE000:
        return f"\\u{code:04x}"  # HCL knows \n \r \t \" \\ and \uNNNN, not JSON's \b or \f
    return ch


def hcl_string(value: str) -> str:
    """A string as an HCL2 quoted literal: escapes HCL defines, and ``${``/``%{`` doubled so nothing interpolates."""
    body = "".join(_hcl_char(ch) for ch in value).replace("${", "$${").replace("%{", "%%{")
    return f'"{body}"'


def hcl(value: Any) -> str:
    """A Python value as an HCL2 literal (strings escaped, including ``${`` and ``%{`` template openers)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise TypeError("no HCL literal for NaN or infinity")
        return json.dumps(value)
    if isinstance(value, str):
        return hcl_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(hcl(v) for v in value) + "]"
    raise TypeError(f"no HCL literal for {type(value).__name__}")


def nginx_string(value: str) -> str:
    """A value as an nginx quoted string. nginx expands ``$name`` even inside quotes and has no escape for it, and a
    control character has no business in a path: both are refused rather than escaped."""
    if "$" in value or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise ValueError(f"{value[:60]!r} cannot be written into an nginx configuration ('$' or a control character)")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


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
    env.filters["nginx"] = nginx_string
    env.filters["tojson"] = json.dumps
    env.filters["b64encode"] = lambda text: base64.b64encode(text.encode()).decode()
    return env
