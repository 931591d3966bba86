"""No way around the untrusted-value layer (issue 60, ``imagebuilder/core/untrusted.py``): a file a user named or a
document pointed at is opened there, untrusted JSON and YAML are parsed there, and everything a task prints passes its
masking. The library is read (its AST) for the calls that would go around it; the ones that remain are ledgered by
module with why each is not a user's value: a new one anywhere fails here until it goes through the layer or is
reviewed into the ledger."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from tests.support.common import ROOT

PACKAGE = ROOT / "imagebuilder"
#: the layer itself and the loader built on it (modules of the package)
LAYER = {"core.untrusted", "core.files"}

#: json.load(s) / yaml.*load* outside the layer: each parses a program's own output or the tool's own file, never a
#: user's document or another machine's reply (those take :func:`imagebuilder.core.untrusted.parse_json`)
PARSE_LEDGER = {
    "imagebuilder.attest.packages": 1,  # dpkg-query / rpm output of the image being built
    # payload_of: a provenance this process just wrote (display, tests)
    "imagebuilder.attest.provenance": 1,  # payload_of: a provenance this process just wrote (display, tests)
    "imagebuilder.builder.chroot_mounts": 1,  # the spec file the chroot engine's parent wrote for its child
    "imagebuilder.builder.lint": 1,  # config/examples in the checkout
    "imagebuilder.builder.packer_plugins": 1,  # a plugin binary's own `describe` output
    "imagebuilder.cli.dhcp": 1,  # a round trip of data this process holds
    "imagebuilder.core.disk.attach": 1,  # sfdisk --json
    "imagebuilder.core.disk.deadruns": 2,  # this tool's own run markers; losetup --json
    "imagebuilder.core.disk.views": 1,  # qemu-img info --output=json
    "imagebuilder.core.hostinfo": 1,  # this tool's own cache of host facts
    "imagebuilder.customization.model": 1,  # seed meta-data this process rendered
    "imagebuilder.image.controlplane": 1,  # kubectl -o json of the control plane this process runs
    "imagebuilder.image.outputs": 1,  # Packer's manifest post-processor output of this build
    "imagebuilder.image.ova": 1,  # qemu-img info --output=json
    "imagebuilder.release.source": 3,  # go mod download -json / go mod edit -json
    "imagebuilder.vsphere.access": 1,  # config/privileges in the checkout
}
#: direct reads (open(), read_text(), read_bytes()) outside the layer: files this tool wrote or owns (workspaces,
#: caches, its checkout, a build's own outputs, /proc and /sys of this host); a file a user named or a document
#: pointed at is read by :func:`imagebuilder.core.untrusted.read_text` / ``read_bytes`` / ``open_regular``
READ_LEDGER = {
    "imagebuilder.builder.chroot_mounts": 2, "imagebuilder.builder.inputs": 1,
    "imagebuilder.builder.lint": 1, "imagebuilder.builder.matrix": 1, "imagebuilder.builder.packer_plugins": 2,
    "imagebuilder.cli.dev": 1, "imagebuilder.cli.serve": 1, "imagebuilder.core.arch": 2,
    "imagebuilder.core.disk.attach": 1, "imagebuilder.core.disk.chroot": 2, "imagebuilder.core.disk.deadruns": 3,
    "imagebuilder.core.disk.releasing": 3, "imagebuilder.core.disk.scratch": 1,
    "imagebuilder.core.hostinfo": 3, "imagebuilder.core.runs": 2, "imagebuilder.core.ssh": 1,
    "imagebuilder.docs": 2, "imagebuilder.flows.demo": 1,
    # its build log; the ARF and report OpenSCAP just wrote into the scan's own folder
    "imagebuilder.hardening.content": 1, "imagebuilder.hardening.scan": 1,
    "imagebuilder.host.dhcp.servers": 5, "imagebuilder.host.preflight": 2, "imagebuilder.host.prepare": 8,
    "imagebuilder.image.base": 3, "imagebuilder.image.boltdb": 1, "imagebuilder.image.controlplane": 2,
    "imagebuilder.image.diff": 2, "imagebuilder.image.emulation": 1, "imagebuilder.image.fsdelta": 2,
    "imagebuilder.image.gzipdisk": 4, "imagebuilder.image.outputs": 1, "imagebuilder.image.qemu": 1,
    "imagebuilder.image.reproducible": 1, "imagebuilder.plan.config": 1, "imagebuilder.publish.storage": 2,
    "imagebuilder.release.imagearchive": 1, "imagebuilder.release.source": 15, "imagebuilder.vsphere.access": 1,
}  # fmt: skip


def _tree(text: str) -> ast.Module:
    """A module's syntax tree without the copies of its functions ``invoke test --mutation`` plants (mutmut's
    ``x_<name>__mutmut_<n>``, each a copy of one function with one change, and ``x_<name>__mutmut_orig``: the
    function under its own name keeps its body), so that a mutated copy of the checkout counts each call once, as
    the checkout does."""
    tree = ast.parse(text)

    def planted(n: ast.stmt) -> bool:
        defined = isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        return defined and "__mutmut_" in n.name  # type: ignore[attr-defined]

    for node in list(ast.walk(tree)):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [n for n in body if not planted(n)]  # type: ignore[attr-defined]
    return tree


def calls_around_the_layer(root: Path, package: str) -> tuple[Counter[str], Counter[str]]:
    """Per module under ``root``: the JSON/YAML parses and the direct file reads it makes (the layer's own
    excluded)."""
    parses: Counter[str] = Counter()
    reads: Counter[str] = Counter()
    for path in sorted(root.rglob("*.py")):
        module = ".".join((package, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        if module.removeprefix(f"{package}.") in LAYER:
            continue
        for node in ast.walk(_tree(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute):
                base = ast.unparse(func.value)
                if (base == "json" and func.attr in ("load", "loads")) or (base == "yaml" and "load" in func.attr):
                    parses[module] += 1
                elif func.attr in ("read_text", "read_bytes") and base != "untrusted":  # the layer's own are its way in
                    reads[module] += 1
            elif isinstance(func, ast.Name) and func.id == "open":
                reads[module] += 1
    return parses, reads


def _over(found: Counter[str], ledger: dict[str, int]) -> list[str]:
    """Where ``found`` differs from ``ledger``: a new call, or a ledger line no call needs any more (the ledger is
    exact, so a read moved onto the layer cannot leave room for a new one around it)."""
    return [f"{m}: {found.get(m, 0)} (ledger: {ledger.get(m, 0)})" for m in sorted({*found, *ledger})
            if found.get(m, 0) != ledger.get(m, 0)]  # fmt: skip


def test_documents_are_parsed_only_through_the_layer() -> None:
    parses, _ = calls_around_the_layer(PACKAGE, "imagebuilder")
    assert sum(parses.values()) >= 10  # the tree is really read
    assert not _over(parses, PARSE_LEDGER), (
        "parse a user's document or another machine's reply with imagebuilder.core.untrusted.parse_json (then a "
        f"strict model), or review the new call into PARSE_LEDGER: {_over(parses, PARSE_LEDGER)}"
    )


def test_files_are_opened_only_through_the_layer() -> None:
    _, reads = calls_around_the_layer(PACKAGE, "imagebuilder")
    assert not _over(reads, READ_LEDGER), (
        "open a file a user named or a document pointed at with imagebuilder.core.untrusted (read_text, read_bytes, "
        f"open_regular), or review the new read of the tool's own file into READ_LEDGER: {_over(reads, READ_LEDGER)}"
    )


def test_the_ledger_finds_a_way_around(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "core").mkdir(parents=True)
    (pkg / "core" / "untrusted.py").write_text("import json\ndef parse_json(t):\n    return json.loads(t)\n")
    around = "def f(p):\n    return json.loads(Path(p).read_text()), yaml.safe_load(open(p))\n"
    (pkg / "cli.py").write_text("import json, yaml\nfrom pathlib import Path\n" + around)
    parses, reads = calls_around_the_layer(pkg, "pkg")
    assert parses == Counter({"pkg.cli": 2}) and reads == Counter({"pkg.cli": 2})


def test_every_task_prints_through_the_masking() -> None:
    """Every task's body runs inside cli_task, whose output streams mask every credential and replace every control
    character; nothing in the library writes around them (sys.__stdout__, os.write to 1 or 2)."""
    from imagebuilder.cli import namespace

    for name in namespace.task_names:
        assert getattr(namespace[name].body, "masked_output", False), f"{name} does not run inside cli_task"
    around = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if "sys.__stdout__" in text or "sys.__stderr__" in text:
            around.append(str(path))
        for node in ast.walk(_tree(text)):
            call = isinstance(node, ast.Call) and ast.unparse(node.func) == "os.write" and node.args
            if call and ast.unparse(node.args[0]) in ("1", "2"):  # type: ignore[attr-defined]
                around.append(f"{path}:{node.lineno}")  # type: ignore[attr-defined]
    assert not around, around


def test_output_is_masked_and_printable(capsys: object) -> None:
    """What a task prints, through the masking: a token, a PIN and an escape sequence a value carried never reach
    the terminal, and a line that carries none is printed as it is."""
    import sys

    from imagebuilder.cli._common import cli_task

    @cli_task
    def body() -> None:
        print("from http://h/debian?token=S3CRET, 4 GiB")
        print("key pkcs11:token=a;id=%01;PIN-VALUE=S3CRET\x1b]0;title\x07 and\ttab")
        sys.stdout.write("partial ")
        sys.stdout.write("line hsm:2?pin=S3CRET")

    body()
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "S3CRET" not in out and "\x1b" not in out and "\x07" not in out and "\ttab" in out
    assert out.splitlines()[0].startswith("from http://h/debian?token=********")
    assert out.endswith("partial line hsm:2?pin=********")


def test_the_dhcp_server_names_checked_early_are_the_servers() -> None:
    from imagebuilder.cli.dhcp import SERVER_NAMES
    from imagebuilder.host.dhcp import SERVERS

    assert set(SERVER_NAMES) == set(SERVERS)


def test_a_line_another_thread_writes_into_is_not_torn() -> None:
    """print() writes a line's text and its end in two calls: a thread that writes between them (seen under load in
    the suite) must not tear either line."""
    import io
    import threading

    from imagebuilder.cli._common import _Masked

    out = io.StringIO()
    stream = _Masked(out)
    written, resume = threading.Event(), threading.Event()

    def other() -> None:
        stream.write("second")
        written.set()
        resume.wait(5)
        stream.write("\n")

    stream.write("first")
    thread = threading.Thread(target=other)
    thread.start()
    written.wait(5)
    stream.write("\n")
    resume.set()
    thread.join()
    assert out.getvalue().splitlines() == ["first", "second"]


def test_output_from_threads_is_neither_lost_nor_torn(capsys: object) -> None:
    """build.matrix's builds print from their own threads: every line arrives whole, once."""
    import threading

    from imagebuilder.cli._common import cli_task

    @cli_task
    def body() -> None:
        def say(n: int) -> None:
            for i in range(200):
                print(f"thread {n} line {i} https://u:S3CRET@h/x")

        threads = [threading.Thread(target=say, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    body()
    lines = capsys.readouterr().out.splitlines()  # type: ignore[attr-defined]
    assert sorted(lines) == sorted(f"thread {n} line {i} https://u:********@h/x" for n in range(4) for i in range(200))
