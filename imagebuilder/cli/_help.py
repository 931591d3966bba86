"""What ``--help`` and ``--list`` say, made from the facts the tasks run on (issue 61).

A help text states no channel, version, default or choice by hand where the catalog, the profile or the code has
it: it names the fact (``{=channels}``) and :func:`render` fills it in when the help is shown, from the same
:func:`~imagebuilder.release.catalog.load_catalog` a build plans with. So ``build --help`` cannot say that ubuntu
20.04 is the default while a plan builds 22.04. tests/unit/test_help.py checks what is left against the tasks.

The same module gives each flag's value placeholder (``--disk-gb=GIB``, ``--output-dir=DIR``) from the flag kinds
:data:`~imagebuilder.cli.flags.FLAG_KINDS` already names for the flag harness, the one-sentence line ``--list``
shows, and the examples each task's docstring ends with.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable

from invoke.collection import Collection

from imagebuilder.cli.flags import flag_kind

#: ``{=name}``: a fact filled in by :func:`render`
FIELD = re.compile(r"\{=([a-z0-9_]+)\}")


def _or(items: list[str], word: str = "or") -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {word} " + items[-1]


def _line_range(attribute: str) -> Callable[[], str]:
    """The oldest and the newest line, as ``attribute`` writes them (``name``: 1-18 .. 1-36, ``minor``: 1.18 ..)."""

    def fact() -> str:
        from imagebuilder.release.catalog import load_catalog

        lines = sorted(load_catalog().channels.values(), key=lambda c: c.minor_number)
        return f"{getattr(lines[0], attribute)} .. {getattr(lines[-1], attribute)}"

    return fact


def _newest(attribute: str) -> Callable[[], str]:
    def fact() -> str:
        from imagebuilder.release.catalog import load_catalog

        return str(getattr(load_catalog().newest_channel(), attribute))

    return fact


def _os_versions() -> str:
    """Each built OS's versions, and the default the newest line gives (a line that no longer builds the OS's own
    default gives its first: :meth:`~imagebuilder.release.catalog.ReleaseChannel.default_os_version`)."""
    from imagebuilder.release.catalog import load_catalog

    catalog = load_catalog()
    newest = catalog.newest_channel()
    parts = []
    for os in catalog.operating_systems.values():
        if not os.buildable or not os.versions:
            continue
        versions = [v.version + (f" ({', '.join(v.providers)})" if v.providers else "") for v in os.versions]
        default = newest.default_os_version(os) or (os.default_version.version if os.default_version else None)
        parts.append(f"{os.name} {_or(versions)}" + (f" (default on {newest.name}: {default})" if default else ""))
    return "; ".join(parts) + "; a line builds the versions config/release-channels.yaml gives it"


def _names(kind: str) -> Callable[[], str]:
    """The operating systems (``os``: all, ``built-os``: those built) or providers, each with its spec alias:
    ``ubuntu (os2)``."""

    def fact() -> str:
        from imagebuilder.release.catalog import load_catalog

        catalog = load_catalog()
        table = catalog.providers if kind == "provider" else catalog.operating_systems
        items = []
        for thing in table.values():
            if kind == "built-os" and not getattr(thing, "buildable", True):
                continue
            items.append(f"{thing.name} ({thing.aliases[0]})" if thing.aliases else thing.name)
        return _or(items)

    return fact


def _arches() -> str:
    from imagebuilder.core.arch import ARCH_NAMES

    return _or([f"{ARCH_NAMES[0]} (default)", *ARCH_NAMES[1:]])


def _arch_names() -> str:
    from imagebuilder.core.arch import ARCH_NAMES

    return _or(list(ARCH_NAMES))


def _product_release_env() -> str:
    from imagebuilder.release.product import env_name

    return "$" + env_name()


def _packers_tested() -> str:
    from imagebuilder.builder.packer_plugins import TESTED_PACKERS

    return _or(list(TESTED_PACKERS), "and")


def _demo(attribute: str) -> Callable[[], str]:
    def fact() -> str:
        from imagebuilder.flows import demo

        return str(getattr(demo, attribute))

    return fact


def _newest_containerd() -> str:
    from imagebuilder.release.catalog import load_catalog

    channel = load_catalog().newest_channel()
    return f"{channel.runtime.containerd} for {channel.name}"


def _oldest_source_release() -> str:
    from imagebuilder.release.k8sversion import OLDEST_MINOR

    return f"v1.{OLDEST_MINOR}.0"


def _template_name_example() -> str:
    """The name template.import gives ubuntu's template of the newest line (the profile's pattern)."""
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.vsphere.templates import default_name

    catalog = load_catalog()
    return default_name(catalog.os("ubuntu"), catalog.newest_channel())


def _build_vm(key: str) -> Callable[[], str]:
    def fact() -> str:
        from imagebuilder.release.catalog import load_catalog

        return str(load_catalog().build_vm[key])

    return fact


def _host(attribute: str) -> Callable[[], str]:
    def fact() -> str:
        from imagebuilder.host.config import load_host_config

        value: object = load_host_config()
        for part in attribute.split("."):
            value = getattr(value, part)
        return str(value)

    return fact


def _hardening_content() -> str:
    from imagebuilder.hardening.model import load_settings

    content = load_settings().content
    return f"{content.module} {content.version}"


def _hardening_min_pass() -> str:
    from imagebuilder.hardening.model import DEFAULT_MIN_PASS

    return f"{DEFAULT_MIN_PASS:g}"


#: every fact a help text may name, by its field name
FACTS: dict[str, Callable[[], str]] = {
    "channels": _line_range("name"),
    "minors": _line_range("minor"),
    "newest_channel": _newest("name"),
    "newest_minor": _newest("minor"),
    "newest_kubernetes": _newest("kubernetes_version"),
    "newest_containerd": _newest_containerd,
    "os_versions": _os_versions,
    "os_names": _names("os"),
    "built_os_names": _names("built-os"),
    "providers": _names("provider"),
    "arches": _arches,
    "arch_names": _arch_names,
    "product_release_env": _product_release_env,
    "packers_tested": _packers_tested,
    "demo_kubernetes": _demo("DEMO_KUBERNETES"),
    "disk_gb": _build_vm("disk_gb"),
    "min_disk_gb": _host("requirements.min_disk_gb"),
    "build_user": _host("user"),
    "oldest_source_release": _oldest_source_release,
    "template_name_example": _template_name_example,
    "demo_standin_channel": _demo("STANDIN_CHANNEL"),
    "hardening_content": _hardening_content,
    "hardening_min_pass": _hardening_min_pass,
}


@functools.cache
def fact(name: str) -> str:
    """One fact's text (computed once per process)."""
    return FACTS[name]()


def render(text: str) -> str:
    """``text`` with every ``{=name}`` filled in; an unknown name is a bug in a help text (tests/unit/test_help.py
    finds it), shown as it is rather than failing the help."""
    return FIELD.sub(lambda m: fact(m.group(1)) if m.group(1) in FACTS else m.group(0), text)


#: the placeholder of a flag's value, by its name where the kind says too little
PLACEHOLDERS: dict[str, str] = {
    "disk_gb": "GIB", "min_disk_gb": "GIB", "size_gb": "GIB", "port": "PORT", "jobs": "N", "threshold": "N",
    "ci_concurrency": "N", "ansible_verbosity": "0-6", "release_channel": "1-NN", "kubernetes": "VERSION",
    "insecure": "BOOL", "dhcp_server": "SERVER", "customize": "FILE",
    "output": "FORMAT", "skip_check": "CHECK", "roles": "ROLE=N,...", "expires": "ROLE=DAYS,...", "bind": "ADDRESS",
    "pairs": "OS:PROVIDER,...", "runs_on": "LABEL,...", "arch": "ARCH", "eksa_release": "vX.Y.Z",
    "containerd": "vX.Y.Z", "os_version": "VERSION", "sha256": "HEX", "root_sha512": "HEX", "template": "PATH",
    "ci_publish": "DIR|s3://BUCKET/PREFIX", "emit": "CI", "server": "HOST", "help": "TASK", "list": "NAMESPACE",
    "print_completion_script": "SHELL",
}  # fmt: skip
#: the placeholder of each flag kind (:func:`~imagebuilder.cli.flags.flag_kind`)
KIND_PLACEHOLDERS = {
    "document": "FILE", "path-in": "PATH", "path-out": "PATH", "key": "KEY", "url": "URL", "number": "N",
    "duration": "SECONDS", "version": "VERSION", "secret": "SECRET", "name": "NAME", "text": "TEXT",
}  # fmt: skip


def placeholder(name: str) -> str:
    """What a flag's value is, for its help line: ``--disk-gb=GIB``, ``--output-dir=DIR``, ``--os=OS``."""
    key = name.removeprefix("--").replace("-", "_")
    if key in PLACEHOLDERS:
        return PLACEHOLDERS[key]
    kind = flag_kind(key)
    if kind in ("path-in", "path-out") and re.search(r"(^|_)(dir|dest|repo|keys|root|prefix|folder)$", key):
        return "DIR"
    if kind == "choice":
        return key.upper().replace("_", "-")
    return KIND_PLACEHOLDERS.get(kind, "TEXT")


def summary(doc: str | None) -> str:
    """The line ``--list`` shows: the docstring's first sentence, whole (a sentence may run over several lines of
    the docstring; Invoke's own list shows the first line only and stops mid-sentence)."""
    paragraph = render(" ".join((doc or "").strip().split("\n\n")[0].split()))
    end = re.search(r"[.!?](\s|$)", paragraph)
    return paragraph[: end.end()].strip() if end else paragraph


EXAMPLES_HEADING = "Examples:"


def examples(doc: str | None) -> list[str]:
    """The example commands a task's docstring ends with (the lines under ``Examples:``, each ``image-builder
    <task> ...``): shown by ``--help``, checked by tests/unit/test_help.py, run by
    tests/integration/test_help_examples.py."""
    text = doc or ""
    if EXAMPLES_HEADING not in text:
        return []
    block = text.split(EXAMPLES_HEADING, 1)[1]
    return [line.strip() for line in block.splitlines() if line.strip().startswith("image-builder ")]


FLAGS_START = "<!-- flag-names:start (generated by `invoke docs` from the tasks; do not edit) -->"
FLAGS_END = "<!-- flag-names:end -->"


def flag_names_table(namespace: Collection) -> str:
    """Every flag of the tasks of ``namespace`` that answers to more than one name: its name, the older spellings it
    keeps, and its tasks."""
    rows: dict[tuple[str, str], list[str]] = {}
    for task in sorted(namespace.task_names):
        for arg in copy.deepcopy(namespace[task]).get_arguments():
            canonical = (arg.name or "").replace("_", "-")
            spellings = sorted(("-" if len(n) == 1 else "--") + n.replace("_", "-") for n in arg.names
                               if n.replace("_", "-") != canonical)  # fmt: skip
            if spellings:
                rows.setdefault((f"--{canonical}", ", ".join(f"`{o}`" for o in spellings)), []).append(task)
    out = [FLAGS_START, "", "| flag | also answers to | tasks |", "|---|---|---|"]
    for (flag, shown), tasks in sorted(rows.items()):
        out.append(f"| `{flag}` | {shown} | {', '.join(tasks)} |")
    out += ["", FLAGS_END]
    return "\n".join(out)


#: the generated sections of docs/ made from the tasks, which ``invoke docs`` writes beside imagebuilder.docs's: the
#: program registers them (it is the one module above the namespace; a task module importing it would be a cycle)
CLI_SECTIONS: list[tuple[str, str, str, Callable[[], str]]] = []
