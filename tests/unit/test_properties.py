"""Property-based tests (Hypothesis) for the parsers and renderers of the input boundary, in process: the grammars,
the safe join, byte ranges, nginx strings and the YAML round trip keep their invariants on any text, and DHCP pools,
SBOMs, licence expressions, TUF target names and hardware.csv rows on any input. The renderers checked by the
programs that read what they write (``dhcpd -t``, ``kea-dhcp4 -t``, ``packer console``) are in
tests/integration/test_properties.py."""

from __future__ import annotations

import ipaddress
import json
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from imagebuilder.core import grammar
from imagebuilder.core.errors import InputError
from imagebuilder.core.files import parse_yaml_documents
from imagebuilder.core.render import nginx_string
from imagebuilder.core.safepath import safe_join
from imagebuilder.host.serve import ByteRange, parse_range
from tests.support.properties import SLOW, accepted, branch, reaches

FAST = settings(max_examples=300, deadline=None)

# --- DHCP: any accepted config renders a file dhcpd accepts, with exactly the statements it implies -------------


# --- HCL: any string or number is one literal that Packer evaluates back to the same value -------------------------


# --- YAML: what safe_dump writes comes back equal; any text is data or an InputError -----------------------------

yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


@FAST
@given(yaml_values)
def test_yaml_round_trip(value: object) -> None:
    text = yaml.safe_dump({"v": value})
    assert parse_yaml_documents(text, "x.yaml") == [{"v": value}]


@FAST
@given(st.text(max_size=200))
def test_any_yaml_text_is_data_or_an_input_error(text: str) -> None:
    try:
        docs = parse_yaml_documents(text, "x.yaml")
    except InputError as exc:
        assert "x.yaml" in str(exc)
        return
    assert isinstance(docs, list)


# --- grammars, safe-join, ranges ------------------------------------------------------------------------------------


@st.composite
def one_change(draw: st.DrawFn, valid: st.SearchStrategy[str], hostile: str) -> str:
    """A value the grammar accepts, and one time in three the same with one character of ``hostile`` put in it."""
    text = draw(valid)
    if draw(st.sampled_from((False, False, True))):  # Hypothesis favours the first: valid
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(hostile)) + text[at:]
    return text


#: a DNS label as RFC 1123 has it
labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
dns_names = st.lists(labels, min_size=1, max_size=4).map(".".join).filter(lambda n: not n.split(".")[-1].isdigit())
url_hosts = dns_names | st.ip_addresses(v=4).map(str) | st.ip_addresses(v=6).map(lambda a: f"[{a}]")
url_paths = st.lists(st.from_regex(r"[A-Za-z0-9._~%-]{0,12}", fullmatch=True), max_size=4).map(
    lambda parts: "".join("/" + p for p in parts)
)
#: digits of other scripts and forms ``int()`` or ``isdigit()`` take, signs, spaces, underscores
NOT_ASCII_DIGITS = "\u0663\u00b2\uff11+-_ .\n"


@reaches(0.5)
@FAST
@given(st.integers(1, 65535).map(str) | st.integers(1, 65535) | one_change(st.integers(0, 99999).map(str),
                                                                         NOT_ASCII_DIGITS) | st.booleans())  # fmt: skip
def test_ports_are_1_to_65535_from_digits_only(value: object) -> None:
    try:
        port = grammar.port(value)
    except ValueError:
        branch("refused")
        return
    branch("positive")
    assert 1 <= port <= 65535 and not isinstance(value, bool)
    assert isinstance(value, int) or (isinstance(value, str) and value.isascii() and value.isdigit())
    assert port == int(value)


@reaches(0.5)
@FAST
@given(one_change(dns_names | st.ip_addresses().map(str), "_ /@:\u00e9\u200b*\x00") | st.text(max_size=40))
def test_hostnames_are_dns_names_or_ip_addresses(text: str) -> None:
    try:
        name = grammar.hostname(text)
    except ValueError:
        branch("refused")
        return
    branch("positive")
    try:
        ipaddress.ip_address(name)
    except ValueError:
        assert re.fullmatch(r"[a-z0-9.-]{1,253}", name), name
        assert name == text.rstrip(".").lower()


@st.composite
def urls(draw: st.DrawFn) -> tuple[str, tuple[str, ...], str | None]:
    """(url, schemes allowed, what is wrong with it or None): a URL valid by construction, then, one time in three,
    one part of it broken (its scheme, its host, its port, credentials, a space)."""
    schemes = draw(st.sampled_from([("https",), ("http", "https")]))
    scheme, host = draw(st.sampled_from(schemes)), draw(url_hosts)
    port = draw(st.none() | st.integers(1, 65535))
    path, query = draw(url_paths), draw(st.none() | st.from_regex(r"[a-z]{1,6}=[A-Za-z0-9]{0,10}", fullmatch=True))
    broken = draw(st.none() | st.none() | st.sampled_from(["scheme", "host", "port", "credentials", "space"]))
    # userinfo as RFC 3986 spells it (a ``/`` would end the authority: the URL would name another host)
    password = draw(st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijk0123456789+@:%", min_size=8, max_size=20))
    if broken == "scheme":
        scheme = draw(st.sampled_from(["ftp", "file", "gopher", "s3", "javascript"]))
    elif broken == "host":
        host = draw(st.sampled_from(["", "-bad", "a..b", "bad_host", "x" * 64, "1.2.3.999", "[::g]"]))
    elif broken == "port":
        port = draw(st.sampled_from([0, 65536, 99999]))
    userinfo = f"user:{password}@" if broken == "credentials" else ""
    text = (
        f"{scheme}://{userinfo}{host}{'' if port is None else f':{port}'}{path}{'' if query is None else '?' + query}"
    )
    if broken == "space":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from([" ", "\t", "\n", "\x7f"])) + text[at:]
    return text, schemes, password if broken == "credentials" else broken


@reaches(0.5)
@FAST
@given(urls())
def test_urls_have_an_allowed_scheme_a_host_and_no_credentials(case: tuple[str, tuple[str, ...], str | None]) -> None:
    """A URL built valid is accepted as it is; each broken part is refused, and a password is never repeated."""
    text, schemes, broken = case
    try:
        parts = grammar.url(text, schemes)
    except ValueError as exc:
        branch("refused")
        assert broken is not None, f"a valid URL refused: {text!r}: {exc}"
        assert len(broken) < 8 or broken not in str(exc), "the password is repeated in the message"
        return
    branch("positive")
    assert broken is None, f"{text!r} accepted, broken at its {broken}"
    assert parts.scheme.lower() in schemes and parts.hostname and parts.password is None


@reaches(0.5)
@FAST
@given(st.text(max_size=300))
def test_safe_join_never_leaves_the_destination(name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp) / "dest"
        try:
            path = safe_join(dest, name)
        except InputError:
            branch("refused")
            return
        branch("positive")
        assert dest.resolve() in path.parents


@FAST
@given(st.text(max_size=40) | st.from_regex(r"bytes=[0-9]{0,6}-[0-9]{0,6}", fullmatch=True), st.integers(0, 10**6))
def test_ranges_are_inside_the_file_or_none(header: str, size: int) -> None:
    got = parse_range(header, size)
    if isinstance(got, ByteRange):
        assert 0 <= got.start <= got.end < size
        assert re.fullmatch(r"\s*bytes=[0-9]*-[0-9]*\s*", header)
    else:
        assert got in (None, "unsatisfiable")


@reaches(0.5)
@FAST
@given(st.text(max_size=60))
def test_nginx_strings_are_quoted_or_refused(value: str) -> None:
    try:
        quoted = nginx_string(value)
    except ValueError:
        branch("refused")
        assert "$" in value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
        return
    branch("positive")
    inner = quoted[1:-1]
    assert quoted[0] == quoted[-1] == '"' and not re.search(r'(?<!\\)(\\\\)*"', inner)


# --- manifests of any shape: data or an InputError, never a crash ----------------------------------------------------


# --- Packer templates: any accepted provider config renders a template Packer parses and formats as is ------------


# --- issue 32: subnets, ranges, exclusions and fixed leases: the pools hold exactly what is free ------------------


@st.composite
def multi_subnet_configs(draw: st.DrawFn) -> dict[str, object]:
    """Valid configs (subnets in their own /24, routers outside the range, held addresses distinct and each held the
    way its place allows), and one time in three a config drawn with collisions on purpose (an address held twice,
    a fixed lease outside every subnet, an 'outside' control-plane IP inside the range): the arithmetic of the pools
    and of the refusals is what is under test."""
    collide = draw(st.sampled_from((False, False, True)))  # Hypothesis favours the first: a valid config
    subnets, hosts_all, free = [], [], []
    for k in range(draw(st.integers(1, 3))):
        prefix = draw(st.integers(24, 29))
        net = ipaddress.IPv4Network(((10 << 24) + (draw(st.integers(0, 7)) << 16) + (k << 8), prefix))
        hosts = [str(net.network_address + i) for i in range(1, net.num_addresses - 1)]
        router = draw(st.integers(0, len(hosts) - 1))
        lo = draw(st.integers(0, len(hosts) - 1).filter(lambda i, r=router: i != r))
        hi = draw(st.integers(lo, len(hosts) - 1).filter(lambda i, r=router, start=lo: i < r or start > r))
        others = hosts if collide else [h for i, h in enumerate(hosts) if i != router]
        held = draw(st.lists(st.sampled_from(others), max_size=4, unique=True)) if others else []
        hosts_all += hosts
        free += [h for h in others if h not in held]
        cps = []
        for ip in held[1:2]:
            inside = lo <= hosts.index(ip) <= hi
            methods = ["outside", "shrink", "reserve"] if collide or not inside else ["reserve"]
            cps.append({"ip": ip, "method": draw(st.sampled_from(methods))})
        subnets.append({
            "interface": draw(st.sampled_from(["eth0", "eth1"])), "subnet": str(net),
            "range": {"start": hosts[lo], "end": hosts[hi]}, "routers": [hosts[router]],
            "exclude": held[:1], "control_plane_ips": cps,
        })  # fmt: skip
    pick = st.sampled_from(hosts_all) | st.just("192.0.2.1") if collide else st.sampled_from(free or hosts_all)
    fixed_ips = draw(st.lists(pick, max_size=4, unique=True))
    fixed = [{"mac": f"02:00:00:00:00:{i:02x}", "ip": ip, "hostname": f"node-{i}"} for i, ip in enumerate(fixed_ips)]
    rest = [h for h in free if h not in fixed_ips]
    exclude = draw(st.lists(st.sampled_from(hosts_all if collide else rest or hosts_all), max_size=2, unique=True))
    return {"dns_servers": ["192.0.2.53"], "subnets": subnets, "fixed_leases": fixed, "exclude": exclude}


@reaches(0.5)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(multi_subnet_configs())
def test_pools_are_the_ranges_less_every_held_address_and_nothing_else(data: dict[str, object]) -> None:
    pool = accepted(data)
    if pool is None:
        branch("refused")
        return
    branch("positive")
    config = pool.config
    for s in pool.subnets:
        rng = {int(s.subnet.range.start) + i for i in range(int(s.subnet.range.end) - int(s.subnet.range.start) + 1)}
        held = {int(ip) for ip in (*config.exclude, *s.subnet.exclude, *(f.ip for f in config.fixed_leases))}
        held |= {int(cp.ip) for cp in s.subnet.control_plane_ips if (cp.method or "outside") == "reserve"}
        pooled = [n for lo, hi in s.ranges for n in range(int(lo), int(hi) + 1)]
        assert len(pooled) == len(set(pooled)), "pools overlap"
        assert set(pooled) <= rng - held, "a held address is in a pool"
        shrunk = {int(cp.ip) for cp in s.subnet.control_plane_ips if cp.method == "shrink"}
        if not shrunk:
            assert set(pooled) == rng - held, "a free address of the range is in no pool"
        assert all(lo <= hi and lo in s.subnet.subnet and hi in s.subnet.subnet for lo, hi in s.ranges)
        for cp in s.subnet.control_plane_ips:
            assert not any(lo <= cp.ip <= hi for lo, hi in s.ranges), "a control-plane IP is in a pool"
    nets = [s.subnet.subnet for s in pool.subnets]
    assert not any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[:i])
    assert len({f.ip for f in config.fixed_leases}) == len(config.fixed_leases)


# --- issue 31: the SBOM and the TUF target names --------------------------------------------------------------

package_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30).filter(
    lambda t: "\n" not in t and not t[0].isspace() and ": " not in t and t.strip() == t
)


@SLOW
@given(st.lists(st.tuples(package_text, package_text, st.sampled_from(["amd64", "all", "a b", "x%y"])),
                min_size=1, max_size=6, unique_by=lambda t: t[0]))  # fmt: skip
def test_an_sbom_of_any_package_database_is_valid_spdx_and_its_purls_decode_to_the_names(
    packages: list[tuple[str, str, str]],
) -> None:
    """Whatever names and versions a package database holds, the document the SPDX project's validator reads is
    valid (SPDX IDs are sanitized, licenses are only known identifiers) and each PURL decodes back to the package."""
    from urllib.parse import unquote

    from imagebuilder.attest.packages import Inventory, parse_dpkg_status
    from imagebuilder.attest.sbom import document
    from tests.support.attest import spdx_problems

    status = "\n\n".join(f"Package: {n}\nStatus: install ok installed\nArchitecture: {a}\nVersion: {v}"
                         for n, v, a in packages)  # fmt: skip
    parsed = parse_dpkg_status(status)
    assert {p.name for p in parsed} == {n for n, _, _ in packages}
    runtime = {"/usr/local/bin/containerd": "a" * 64, "/usr/local/sbin/runc": "b" * 64, "/usr/bin/crictl": "c" * 64}
    inventory = Inventory("deb", "ubuntu", "22.04", tuple(parsed), runtime)
    doc = document(name="x.gz", sha256="0" * 64, inventory=inventory, runtime_versions={"containerd": "v2.3.1"})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.spdx.json"
        path.write_text(json.dumps(doc))
        assert spdx_problems(path) == []
    listed = {p["name"]: p for p in doc["packages"] if p["SPDXID"].startswith("SPDXRef-Runtime-")}
    assert {n: p["checksums"][0]["checksumValue"] for n, p in listed.items()} == {
        "containerd": "a" * 64, "runc": "b" * 64, "crictl": "c" * 64}  # fmt: skip
    assert listed["containerd"]["versionInfo"] == "v2.3.1" and "versionInfo" not in listed["runc"]
    for pkg in doc["packages"][1 : 1 + len(parsed)]:
        locator = pkg["externalRefs"][0]["referenceLocator"]
        name = unquote(locator.split("/", 2)[2].split("@", 1)[0])
        assert name == pkg["name"], locator


@FAST
@given(st.text(max_size=60))
@example("GPL-2+ or AFL-2.1, and Expat")
@example("LGPL-2+ and LGPL-2.1+ and CC0-1.0")
def test_a_license_becomes_an_expression_of_known_identifiers_or_nothing(text: str) -> None:
    from imagebuilder.attest.packages import SPDX_IDS, spdx_license

    expression = spdx_license(text)
    if expression is not None:
        tokens = set(re.findall(r"[^\s()]+", expression)) - {"AND", "OR"}
        assert tokens <= SPDX_IDS, expression


@reaches(0.5)
@FAST
@given(one_change(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,60}", fullmatch=True), "/\\\x00 :@\u00e9")
       | st.sampled_from(["../x.gz", "a/b.gz", ".hidden", "..", "ok-1.2_3+4.gz", "x\x00y"]))  # fmt: skip
def test_a_target_name_is_one_file_name_inside_targets(name: str) -> None:
    from imagebuilder.publish.repository import target_name

    try:
        accepted = target_name(name)
    except InputError:
        branch("refused")
        return
    branch("positive")
    assert accepted == name and "/" not in name and not name.startswith(".") and name not in ("", "..")
    assert safe_join(Path("/repo/targets"), accepted).parent == Path("/repo/targets")


# --- issue 43: a hardware.csv of any shape: leases or problems, never a row quoted ---------------------------------

csv_field = st.text(st.sampled_from('ab0:.,-"\n x\\;'), max_size=12)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.lists(csv_field, min_size=0, max_size=9), max_size=6), secret_at=st.integers(0, 5))
@example(rows=[["node-a", "10.0.9.1", "admin", "pw", "10.77.0.12", "255.255.255.0"]], secret_at=0)  # one short
def test_any_hardware_csv_gives_leases_or_problems_and_never_quotes_a_password(
    tmp_path_factory: pytest.TempPathFactory, rows: list[list[str]], secret_at: int
) -> None:
    """Rows of any shape (commas, quotes, line breaks inside fields, too few or too many fields) under the product's
    header: every row is a lease or a problem naming its row or line, and the password column of no row reaches any
    message, whatever shifts it."""
    import csv
    import io

    from imagebuilder.host.dhcp.model import read_hardware_csv

    secret = "PW-x,Never-Shown-77"  # its comma shifts the row: its second half lands in the next column
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["hostname", "bmc_ip", "bmc_username", "bmc_password", "mac", "ip_address", "netmask"])
    for i, row in enumerate(rows):
        if i == secret_at % max(1, len(rows)) and len(row) > 3:
            row = [*row[:3], secret, *row[4:]]
        buf.write(",".join(row) + "\n")  # as a careless editor writes it: not quoted
    path = tmp_path_factory.mktemp("csv") / "hardware.csv"
    path.write_text(buf.getvalue())
    leases, where, problems = read_hardware_csv(path)
    assert len(leases) == len(where)
    for problem in problems:
        text = str(problem)
        assert "PW-x" not in text and "Never-Shown" not in text, text
        assert problem.field and problem.field.startswith(("row ", "line ", "header")), problem.field


# --- issue 63: a checksum file's digest in either case, in each form a checksum file takes ---------------------------


@st.composite
def checksum_files(draw: st.DrawFn) -> tuple[str, str, str | None]:
    """(text of a checksum file, the file it is asked about, the digest it gives for it or None)."""
    digest = draw(st.binary(min_size=32, max_size=32)).hex()
    cased = draw(st.sampled_from([str.lower, str.upper, lambda h: "".join(
        c.upper() if i % 2 else c for i, c in enumerate(h))]))(digest)  # fmt: skip
    name = draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,30}", fullmatch=True))
    form = draw(st.sampled_from(["lone", "text", "binary", "among", "path", "other"]))
    other = draw(st.binary(min_size=32, max_size=32)).hex()
    text = {"lone": f"{cased}\n", "text": f"{cased}  {name}\n", "binary": f"{cased} *{name}\n",
            "among": f"{other}  a-{name}\n{cased}  {name}\n", "path": f"{cased}  ./out/{name}\n",
            "other": f"{cased}  a-{name}\n{other}  b-{name}\n"}[form]  # fmt: skip
    return text, name, None if form == "other" else digest


@reaches(0.5)
@FAST
@given(checksum_files())
def test_a_checksum_file_gives_the_digest_of_its_file_in_lower_case(case: tuple[str, str, str | None]) -> None:
    text, name, digest = case
    got = grammar.digest_in_sums(text, name)
    if digest is None:
        branch("names another file")
        assert got is None
        return
    branch("positive")
    assert got == digest, (text, got)
