"""Lease files as hostile input (issue 43): what a DHCP client sent (its host name) reaches a terminal only as
printable text, and a lease file with an expiry out of any date's range, an address that is not one or a field past
the CSV reader's limit gets an answer (listed, left out, or exit 2 naming the file), never an internal error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagebuilder.core.untrusted import printable
from imagebuilder.host.dhcp.servers import parse_dhcpd_leases, parse_kea_leases
from tests.support.inproc import cli

KEA_HEADER = "address,hwaddr,client_id,valid_lifetime,expire,subnet_id,fqdn_fwd,fqdn_rev,hostname,state,user_context"
ESCAPES = "\x1b[2J\x1b]0;owned\x07evil\x1b[31m\u202eexe.txt\x00\x9b"


def _kea(tmp_path: Path, *rows: str) -> Path:
    lease_file = tmp_path / "var/lib/kea/kea-leases4.csv"
    lease_file.parent.mkdir(parents=True, exist_ok=True)
    lease_file.write_text("\n".join((KEA_HEADER, *rows)) + "\n")
    return tmp_path


def _isc(tmp_path: Path, body: str) -> Path:
    lease_file = tmp_path / "var/lib/dhcp/dhcpd.leases"
    lease_file.parent.mkdir(parents=True, exist_ok=True)
    lease_file.write_text(body)
    return tmp_path


def _no_control(text: str) -> bool:
    return not any((ord(ch) < 32 and ch != "\n") or 0x7F <= ord(ch) <= 0x9F or ch == "\u202e" for ch in text)


@pytest.mark.parametrize("output", ["text", "json"])
def test_a_client_sent_host_name_is_printed_without_its_escape_codes(tmp_path: Path, output: str) -> None:
    name = ESCAPES.replace(",", "").replace(";", " ")  # the separators of the two files' own syntax
    _kea(tmp_path, f"10.0.0.5,52:54:00:00:00:05,,3600,4102444800,1,0,0,{name},0,")
    _isc(tmp_path, f'lease 10.0.0.6 {{\n  ends 4 2099/12/31 00:00:00;\n  binding state active;\n'
                   f'  hardware ethernet 52:54:00:00:00:06;\n  client-hostname "{name}";\n}}\n')  # fmt: skip
    for server in ("kea", "isc"):
        res = cli("dhcp.leases", "--server", server, "--prefix", str(tmp_path), "--output", output)
        assert res.code == 0, res.text
        text = res.out if output == "text" else json.dumps(json.loads(res.out), ensure_ascii=False)
        assert _no_control(text), repr(res.out)
        assert "evil" in text and "owned" in text, "the printable part of the name is kept"


@pytest.mark.parametrize(
    "row",
    [
        "10.0.0.7,52:54:00:00:00:07,,3600,99999999999999999999,1,0,0,far,0,",  # past any date
        "10.0.0.7,52:54:00:00:00:07,,3600,-5,1,0,0,before,0,",
        "10.0.0.7,52:54:00:00:00:07,,3600,٣٣٣,1,0,0,foreign-digits,0,",
        "not-an-address,52:54:00:00:00:07,,3600,4102444800,1,0,0,x,0,",
        "999.1.1.1,52:54:00:00:00:07,,3600,4102444800,1,0,0,x,0,",
    ],
)
def test_kea_rows_out_of_range_get_an_answer(tmp_path: Path, row: str) -> None:
    _kea(tmp_path, row, "10.0.0.8,52:54:00:00:00:08,,3600,4102444800,1,0,0,good,0,")
    res = cli("dhcp.leases", "--server", "kea", "--prefix", str(tmp_path), "--all")
    assert res.code == 0 and "internal error" not in res.text, res.text
    assert "10.0.0.8" in res.out and "not-an-address" not in res.out and "999.1.1.1" not in res.out


def test_a_field_past_the_csv_limit_exits_2_naming_the_file(tmp_path: Path) -> None:
    _kea(tmp_path, "10.0.0.9,52:54:00:00:00:09,,3600,4102444800,1,0,0," + "h" * 200_000 + ",0,")
    res = cli("dhcp.leases", "--server", "kea", "--prefix", str(tmp_path))
    assert res.code == 2 and "kea-leases4.csv" in res.err and "internal error" not in res.text, res.text[:500]
    assert "h" * 1000 not in res.text, "the row is never echoed"


@given(st.text(max_size=80))
def test_printable_leaves_no_control_character(text: str) -> None:
    said = printable(text)
    assert _no_control(said.replace("\n", "?")) and len(said) <= 253


@given(name=st.text(max_size=40).filter(lambda t: '"' not in t and "\n" not in t and ";" not in t))
def test_parsed_leases_hold_printable_text_only(name: str) -> None:
    kea = parse_kea_leases(f'{KEA_HEADER}\n10.0.0.5,52:54:00:00:00:05,,3600,4102444800,1,0,0,"{name}",0,\n')
    isc = parse_dhcpd_leases(f'lease 10.0.0.6 {{\n  client-hostname "{name}";\n}}\n')
    for lease in (*kea, *isc):
        assert _no_control(lease.hostname.replace("\n", "?")), repr(lease.hostname)
