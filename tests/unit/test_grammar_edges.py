"""Every grammar, exactly (issue 63): what each function of :mod:`imagebuilder.core.grammar` returns for a value at
each edge of its rule, and the whole message it refuses the others with.

The properties (tests/unit/test_properties.py) show the grammars hold for any value; they cannot say that a bound is
``<=`` and not ``<``, that a canonical form is lower-cased, or that a message names what was expected and shows at
most so many characters of what was given. Mutation testing found those gaps: a bound moved by one, a message
emptied or a unit's factor changed all passed the suite. Each row here is one such edge, and a message is compared
whole, as the user reads it."""

from __future__ import annotations

from typing import Any

import pytest

from imagebuilder.core import grammar

#: (function, arguments, ("ok", what it returns) or ("err", the whole message))
CASES: list[tuple[str, tuple[Any, ...], tuple[str, Any]]] = [
    ("integer", ("7", 1, 10), ("ok", 7)),
    ("integer", ("-3", -5, 5), ("ok", -3)),
    ("integer", (10, 1, 10), ("ok", 10)),
    ("integer", (1, 1, 10), ("ok", 1)),
    ("integer", ("11", 1, 10), ("err", "11 is out of range (expected 1 to 10)")),
    ("integer", ("0", 1, 10), ("err", "0 is out of range (expected 1 to 10)")),
    ("integer", (True, 0, 1), ("err", "expected a whole number from 0 to 1, got True")),
    ("integer", ("1_0", 1, 99), ("err", "expected a whole number from 1 to 99, got '1_0'")),
    ("integer", (" 5", 1, 9), ("err", "expected a whole number from 1 to 9, got ' 5'")),
    ("integer", ("--5", -9, 9), ("err", "expected a whole number from -9 to 9, got '--5'")),
    ("integer", ("5-", -9, 9), ("err", "expected a whole number from -9 to 9, got '5-'")),
    ("integer", ("x" * 50, 1, 2), ("err", "expected a whole number from 1 to 2, got '" + "x" * 40 + "'")),
    ("integer", (2.0, 1, 3), ("err", "expected a whole number from 1 to 3, got '2.0'")),
    ("integer", ("1" * 19, 1, 2), ("err", "expected a whole number from 1 to 2, got '" + "1" * 19 + "'")),
    ("integer", ("1" * 18, 1, 1000000000000000000), ("ok", 111111111111111111)),
    ("percentage", ("90",), ("ok", 90.0)),
    ("percentage", ("87.5",), ("ok", 87.5)),
    ("percentage", ("100",), ("ok", 100.0)),
    ("percentage", ("100.01",), ("err", "expected a percentage from 0 to 100 (90, 87.5)")),
    ("percentage", ("0",), ("ok", 0.0)),
    ("percentage", ("1.234",), ("err", "expected a percentage from 0 to 100 (90, 87.5)")),
    ("percentage", (" 50 ",), ("ok", 50.0)),
    ("percentage", ("1000",), ("err", "expected a percentage from 0 to 100 (90, 87.5)")),
    ("port", ("1",), ("ok", 1)),
    ("port", ("65535",), ("ok", 65535)),
    ("port", ("0",), ("err", "expected a port from 1 to 65535, got '0'")),
    ("port", ("65536",), ("err", "expected a port from 1 to 65535, got '65536'")),
    ("port", (443,), ("ok", 443)),
    ("port", ("y" * 50,), ("err", "expected a port from 1 to 65535, got '" + "y" * 40 + "'")),
    ("duration", ("90", 1, 7200), ("ok", 90)),
    ("duration", ("2m", 1, 7200), ("ok", 120)),
    ("duration", ("2h", 1, 7200), ("ok", 7200)),
    ("duration", ("5s", 5, 10), ("ok", 5)),
    ("duration", (30, 1, 60), ("ok", 30)),
    ("duration", ("10", 1, 10), ("ok", 10)),
    ("duration", ("2", 3, 10), ("err", "2 s is out of range (expected 3 to 10 s)")),
    ("duration", ("11", 1, 10), ("err", "11 s is out of range (expected 1 to 10 s)")),
    ("duration", ("1d", 1, 10), ("err", "expected seconds (1 to 10) or a number with s, m or h, got '1d'")),
    ("duration", (True, 0, 10), ("err", "expected seconds (0 to 10) or a number with s, m or h, got 'True'")),
    (
        "duration",
        ("q" * 50, 1, 2),
        ("err", "expected seconds (1 to 2) or a number with s, m or h, got '" + "q" * 40 + "'"),
    ),
    ("duration", ("3H", 1, 99999), ("err", "expected seconds (1 to 99999) or a number with s, m or h, got '3H'")),
    ("duration", ("1M", 1, 99999), ("err", "expected seconds (1 to 99999) or a number with s, m or h, got '1M'")),
    ("duration", ("1S", 1, 99999), ("err", "expected seconds (1 to 99999) or a number with s, m or h, got '1S'")),
    ("duration", (None, 1, 2), ("err", "expected seconds (1 to 2) or a number with s, m or h, got 'None'")),
    ("duration", (2.5, 1, 9), ("err", "expected seconds (1 to 9) or a number with s, m or h, got '2.5'")),
    ("is_ip", ("10.0.0.1",), ("ok", True)),
    ("is_ip", ("10.0.0.1", 4), ("ok", True)),
    ("is_ip", ("10.0.0.1", 6), ("ok", False)),
    ("is_ip", ("::1", 6), ("ok", True)),
    ("is_ip", ("x",), ("ok", False)),
    ("ip_address", ("10.0.0.01",), ("err", "expected an IPv4 or IPv6 address, got '10.0.0.01'")),
    ("ip_address", ("::0001",), ("ok", "::1")),
    ("ip_address", ("b" * 70,), ("err", "expected an IPv4 or IPv6 address, got '" + "b" * 60 + "'")),
    ("hostname", ("Example.COM.",), ("ok", "example.com")),
    ("hostname", ("[::1]",), ("ok", "::1")),
    ("hostname", ("10.0.0.1",), ("ok", "10.0.0.1")),
    ("hostname", ("",), ("err", "expected a host name or IP address, got nothing")),
    ("hostname", ("a..b",), ("err", "expected a host name (letters, digits, '-', dots) or an IP address, got 'a..b'")),
    ("hostname", ("-a.b",), ("err", "expected a host name (letters, digits, '-', dots) or an IP address, got '-a.b'")),
    (
        "hostname",
        ("a.123",),
        ("err", "expected a host name (letters, digits, '-', dots) or an IP address, got 'a.123'"),
    ),
    (
        "hostname",
        ("a" * 64,),
        ("err", "expected a host name (letters, digits, '-', dots) or an IP address, got '" + "a" * 60 + "'"),
    ),
    (
        "hostname",
        ("a" * 63 + "." + "a" * 63 + "." + "a" * 63 + "." + "a" * 63,),
        ("err", "expected a host name (letters, digits, '-', dots) or an IP address, got '" + "a" * 60 + "'"),
    ),
    (
        "hostname",
        ("c" * 70,),
        ("err", "expected a host name (letters, digits, '-', dots) or an IP address, got '" + "c" * 60 + "'"),
    ),
    ("hostname", ("a_b",), ("err", "expected a host name (letters, digits, '-', dots) or an IP address, got 'a_b'")),
    ("hostname", (None,), ("err", "expected a host name or IP address, got nothing")),
    (
        "hostname",
        ("1.2.3.4.5",),
        ("err", "expected a host name (letters, digits, '-', dots) or an IP address, got '1.2.3.4.5'"),
    ),
    ("hostname", ("fe80::1%eth0",), ("ok", "fe80::1%eth0")),
    ("host_port", ("vc.local",), ("ok", ("vc.local", None))),
    ("host_port", ("vc.local", 443), ("ok", ("vc.local", 443))),
    ("host_port", ("vc.local:8443",), ("ok", ("vc.local", 8443))),
    ("host_port", ("[::1]:443",), ("ok", ("::1", 443))),
    ("host_port", ("[::1]",), ("ok", ("::1", None))),
    ("host_port", ("[::1]", 5), ("ok", ("::1", 5))),
    ("host_port", ("[::1",), ("err", "expected [IPv6]:port, got '[::1'")),
    ("host_port", ("[::1]x",), ("err", "expected [IPv6]:port, got '[::1]x'")),
    ("host_port", ("",), ("err", "expected host or host:port, got nothing")),
    ("host_port", ("h:0",), ("err", "expected a port from 1 to 65535, got '0'")),
    ("host_port", ("::1",), ("ok", ("::1", None))),
    ("host_port", ("[" + "d" * 70,), ("err", "expected [IPv6]:port, got '[" + "d" * 59 + "'")),
    ("url", ("https://h.example/x",), ("ok", "https://h.example/x")),
    ("url", ("HTTPS://h.example",), ("ok", "https://h.example")),
    ("url", ("http://h.example",), ("err", "expected a https URL, got 'http://h.example'")),
    ("url", ("http://h.example", ("http", "https")), ("ok", "http://h.example")),
    (
        "url",
        ("https://u:p@h.example",),
        ("err", "the URL 'https://u:********@h.example' carries credentials; give them in the environment instead"),
    ),
    (
        "url",
        ("https://h.example:0",),
        ("err", "expected a URL (https), got 'https://h.example:0': bad port or address"),
    ),
    (
        "url",
        ("https://h.example:99999",),
        ("err", "expected a URL (https), got 'https://h.example:99999': bad port or address"),
    ),
    ("url", ("https:///x",), ("err", "the URL 'https:///x' has no host")),
    ("url", ("https://h x",), ("err", "a URL may not contain spaces or control characters")),
    ("url", ("",), ("err", "expected a URL, got nothing")),
    (
        "url",
        ("https://a_b/",),
        ("err", "expected a host name (letters, digits, '-', dots) or an IP address, got 'a_b'"),
    ),
    ("url", ("ftp://h", ("http", "https")), ("err", "expected a http or https URL, got 'ftp://h'")),
    (
        "url",
        ("https://" + "e" * 90 + ".x:0",),
        ("err", "expected a URL (https), got 'https://" + "e" * 72 + "': bad port or address"),
    ),
    ("interface_name", ("eth0",), ("ok", "eth0")),
    ("interface_name", ("a" * 15,), ("ok", "a" * 15)),
    ("interface_name", ("a" * 16,), ("err", "'" + "a" * 16 + "' is not a network interface name")),
    ("interface_name", (".",), ("err", "'.' is not a network interface name")),
    ("interface_name", ("..",), ("err", "'..' is not a network interface name")),
    ("interface_name", ("eth0:1",), ("err", "'eth0:1' is not a network interface name")),
    ("interface_name", ("f" * 50,), ("err", "'" + "f" * 40 + "' is not a network interface name")),
    ("interface_name", (None,), ("err", "'None' is not a network interface name")),
    ("linux_user", ("builder",), ("ok", "builder")),
    ("linux_user", ("_x",), ("ok", "_x")),
    ("linux_user", ("-x",), ("err", "'-x' is not a Linux user name ([a-z_][a-z0-9_-]*, 32 at most)")),
    ("linux_user", ("a" * 33,), ("err", "'" + "a" * 33 + "' is not a Linux user name ([a-z_][a-z0-9_-]*, 32 at most)")),
    ("linux_user", ("a" * 32,), ("ok", "a" * 32)),
    ("linux_user", ("Root",), ("err", "'Root' is not a Linux user name ([a-z_][a-z0-9_-]*, 32 at most)")),
    ("linux_user", ("u" * 50,), ("err", "'" + "u" * 40 + "' is not a Linux user name ([a-z_][a-z0-9_-]*, 32 at most)")),
    ("no_proxy_list", ("localhost, 10.0.0.0/8,.svc",), ("ok", "localhost, 10.0.0.0/8,.svc")),
    (
        "no_proxy_list",
        ("n;" * 40,),
        ("err", "'" + "n;" * 30 + "' is not a no_proxy list (hosts, domains, CIDRs, comma-separated)"),
    ),
    ("no_proxy_list", ("",), ("err", "'' is not a no_proxy list (hosts, domains, CIDRs, comma-separated)")),
    ("cluster_name", ("mgmt-1",), ("ok", "mgmt-1")),
    (
        "cluster_name",
        ("a",),
        ("err", "'a' is not a cluster name (a letter, then letters, digits and '-', 2 to 80 characters)"),
    ),
    ("cluster_name", ("ab",), ("ok", "ab")),
    ("cluster_name", ("a" * 80,), ("ok", "a" * 80)),
    (
        "cluster_name",
        ("a" * 81,),
        (
            "err",
            "'" + "a" * 60 + "' is not a cluster name (a letter, then letters, digits and '-', 2 to 80 characters)",
        ),
    ),
    (
        "cluster_name",
        ("1a",),
        ("err", "'1a' is not a cluster name (a letter, then letters, digits and '-', 2 to 80 characters)"),
    ),
    (
        "cluster_name",
        (7,),
        ("err", "'7' is not a cluster name (a letter, then letters, digits and '-', 2 to 80 characters)"),
    ),
    ("cluster_name", ("k" * 70,), ("ok", "k" * 70)),
    ("domain_name", ("Corp.Example",), ("ok", "corp.example")),
    ("domain_name", ("1.2.3",), ("err", "'1.2.3' is not a domain name")),
    ("domain_name", ("",), ("err", "'' is not a domain name")),
    ("domain_name", (5,), ("err", "'5' is not a domain name")),
    ("domain_name", ("a..b",), ("err", "'a..b' is not a domain name (labels of letters, digits and '-', dots)")),
    (
        "domain_name",
        ("m" * 70 + ".",),
        ("err", "'" + "m" * 60 + "' is not a domain name (labels of letters, digits and '-', dots)"),
    ),
    ("domain_name", ("9" * 70,), ("err", "'" + "9" * 60 + "' is not a domain name")),
    ("display_name", ("ubuntu 22.04 node", "template"), ("ok", "ubuntu 22.04 node")),
    ("display_name", (" x", "template"), ("err", "expected a template name (1-255 printable characters), got ' x'")),
    ("display_name", ("x\u200by", "image"), ("err", "expected an image name (1-255 printable characters), got 'x?y'")),
    (
        "display_name",
        ("x" * 11, "image", 10),
        ("err", "expected an image name (1-10 printable characters), got '" + "x" * 11 + "'"),
    ),
    ("display_name", ("x" * 10, "image", 10), ("ok", "x" * 10)),
    ("display_name", ("", "image"), ("err", "expected an image name (1-255 printable characters), got ''")),
    ("display_name", ("", "OS type"), ("err", "expected an OS type name (1-255 printable characters), got ''")),
    (
        "display_name",
        ("y" * 70, "zone", 64),
        ("err", "expected a zone name (1-64 printable characters), got '" + "y" * 60 + " ... (10 more characters)'"),
    ),
    ("display_name", ("x\ty", "image"), ("err", "expected an image name (1-255 printable characters), got 'x?y'")),
    ("is_hex_digest", ("a" * 64, "sha256"), ("ok", True)),
    ("is_hex_digest", ("A" * 64, "sha256"), ("ok", True)),
    ("is_hex_digest", ("a" * 63, "sha256"), ("ok", False)),
    ("is_hex_digest", ("a" * 128, "sha512"), ("ok", True)),
    ("is_hex_digest", ("a" * 64, "md5"), ("ok", False)),
    ("is_hex_digest", ("g" * 64, "sha256"), ("ok", False)),
    ("digest_in_sums", ("A" * 64 + "\n", "f"), ("ok", "a" * 64)),
    ("digest_in_sums", ("b" * 64 + "  dir/f\n" + "c" * 64 + " *g\n", "g"), ("ok", "c" * 64)),
    ("digest_in_sums", ("b" * 64 + "  f\n", "g"), ("ok", None)),
    ("digest_in_sums", ("b" * 64 + "  f\n" + "C" * 64 + "  f2\n", "f"), ("ok", "b" * 64)),
    ("digest_in_sums", ("x", "f"), ("ok", None)),
    ("digest_in_sums", ("d" * 128, "f", "sha512"), ("ok", "d" * 128)),
    ("digest_in_sums", ("d" * 64 + "  f", "f", "sha512"), ("ok", None)),
    ("s3_bucket", ("my-bucket.1",), ("ok", "my-bucket.1")),
    ("s3_bucket", ("ab",), ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got 'ab'")),
    ("s3_bucket", ("a" * 63,), ("ok", "a" * 63)),
    ("s3_bucket", ("a" * 64,), ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got '" + "a" * 64 + "'")),
    ("s3_bucket", ("a..b",), ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got 'a..b'")),
    ("s3_bucket", ("1.2.3.4",), ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got '1.2.3.4'")),
    ("s3_bucket", ("xn--abc",), ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got 'xn--abc'")),
    ("s3_bucket", ("sthree-x",), ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got 'sthree-x'")),
    (
        "s3_bucket",
        ("amzn-s3-demo-x",),
        ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got 'amzn-s3-demo-x'"),
    ),
    ("s3_bucket", ("x-s3alias",), ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got 'x-s3alias'")),
    ("s3_bucket", ("x--ol-s3",), ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got 'x--ol-s3'")),
    ("s3_bucket", ("x--x-s3",), ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got 'x--x-s3'")),
    ("s3_bucket", ("Abc",), ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got 'Abc'")),
    ("s3_bucket", ("-abc",), ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got '-abc'")),
    ("s3_bucket", ("B" * 80,), ("err", "expected an S3 bucket name (3-63 of a-z 0-9 . -), got '" + "B" * 70 + "'")),
    ("s3_prefix", ("exports/node-images/",), ("ok", "exports/node-images")),
    ("s3_prefix", ("",), ("ok", "")),
    ("s3_prefix", ("/x",), ("err", "expected a key prefix such as exports/node-images, got '/x'")),
    ("s3_prefix", ("a//b",), ("err", "expected a key prefix such as exports/node-images, got 'a//b'")),
    ("s3_prefix", ("a/./b",), ("err", "expected a key prefix such as exports/node-images, got 'a/./b'")),
    ("s3_prefix", ("a/../b",), ("err", "expected a key prefix such as exports/node-images, got 'a/../b'")),
    ("s3_prefix", ("a\nb",), ("err", "expected a key prefix such as exports/node-images, got 'a\\nb'")),
    ("s3_prefix", ("p" * 900,), ("ok", "p" * 900)),
    ("s3_prefix", ("p" * 901,), ("err", "expected a key prefix such as exports/node-images, got '" + "p" * 70 + "'")),
    ("s3_prefix", ("/",), ("err", "expected a key prefix such as exports/node-images, got '/'")),
    ("s3_prefix", ("a//",), ("ok", "a")),
    ("aws_region", ("us-west-2",), ("ok", "us-west-2")),
    ("aws_region", ("us-gov-west-1",), ("ok", "us-gov-west-1")),
    ("aws_region", ("us-isob-east-1",), ("ok", "us-isob-east-1")),
    ("aws_region", ("US-west-2",), ("err", "expected an AWS region such as us-west-2, got 'US-west-2'")),
    ("aws_region", ("r" * 80,), ("err", "expected an AWS region such as us-west-2, got '" + "r" * 70 + "'")),
    ("iam_role_name", ("vmimport",), ("ok", "vmimport")),
    ("iam_role_name", ("a" * 64,), ("ok", "a" * 64)),
    (
        "iam_role_name",
        ("a" * 65,),
        ("err", "expected an IAM role name (1-64 of A-Z a-z 0-9 + = , . @ _ -), got '" + "a" * 65 + "'"),
    ),
    ("iam_role_name", ("é",), ("err", "expected an IAM role name (1-64 of A-Z a-z 0-9 + = , . @ _ -), got 'é'")),
    ("ami_id", ("ami-0123abcd",), ("ok", "ami-0123abcd")),
    ("ami_id", ("ami-0123456789abcdef0",), ("ok", "ami-0123456789abcdef0")),
    ("ami_id", ("ami-0123ABCD",), ("err", "expected an AMI ID such as ami-0123456789abcdef0, got 'ami-0123ABCD'")),
    ("ami_id", ("ami-012",), ("err", "expected an AMI ID such as ami-0123456789abcdef0, got 'ami-012'")),
    ("digest_in_sums", ("b" * 64 + "  my file.img\n", "my file.img"), ("ok", "b" * 64)),
    ("host_port", ("[::1]]",), ("err", "expected [IPv6]:port, got '[::1]]'")),
    ("host_port", ("[::1]" + "x" * 70,), ("err", "expected [IPv6]:port, got '[::1]" + "x" * 55 + "'")),
    ("hostname", ("::1]",), ("err", "expected a host name (letters, digits, '-', dots) or an IP address, got '::1]'")),
    ("hostname", ("hostX.",), ("ok", "hostx")),
    (
        "hostname",
        ("a" * 63 + "." + "a" * 63 + "." + "a" * 63 + "." + "a" * 61,),
        ("ok", "a" * 63 + "." + "a" * 63 + "." + "a" * 63 + "." + "a" * 61),
    ),
    (
        "hostname",
        ("a" * 63 + "." + "a" * 63 + "." + "a" * 63 + "." + "a" * 62,),
        ("err", "expected a host name (letters, digits, '-', dots) or an IP address, got '" + "a" * 60 + "'"),
    ),
    ("integer", ("X5", 1, 9), ("err", "expected a whole number from 1 to 9, got 'X5'")),
    ("no_proxy_list", ("a, ,b",), ("err", "'a, ,b' is not a no_proxy list (hosts, domains, CIDRs, comma-separated)")),
    ("s3_prefix", ("exportsX/",), ("ok", "exportsX")),
    ("url", ("https://h.example/!",), ("ok", "https://h.example/!")),
    ("url", ("https://h.example/\x7f",), ("err", "a URL may not contain spaces or control characters")),
    (
        "url",
        ("http://h.example:0", ("http", "https")),
        ("err", "expected a URL (http/https), got 'http://h.example:0': bad port or address"),
    ),
    (
        "url",
        ("http://h.example/" + "z" * 90,),
        ("err", "expected a https URL, got 'http://h.example/" + "z" * 63 + "'"),
    ),
    ("url", ("https:///" + "z" * 90,), ("err", "the URL 'https:///" + "z" * 71 + "' has no host")),
    (
        "url",
        ("https://u:p@h.example/" + "z" * 90,),
        (
            "err",
            "the URL 'https://u:********@h.example/"
            + "z" * 51
            + "' carries credentials; give them in the environment instead",
        ),
    ),
    (
        "url",
        ("https://u@h.example",),
        ("err", "the URL 'https://********@h.example' carries credentials; give them in the environment instead"),
    ),
]


@pytest.mark.parametrize(("function", "args", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_grammar_at_its_edges(function: str, args: tuple[Any, ...], expected: tuple[str, Any]) -> None:
    try:
        result = getattr(grammar, function)(*args)
    except ValueError as exc:
        assert expected == ("err", str(exc))
        return
    if function == "url":
        result = result.geturl()
    assert expected == ("ok", result)
    assert type(result) is type(expected[1]), "the canonical form's type (a percentage is a float, a port an int)"


def test_every_public_grammar_has_its_edges_here() -> None:
    """A grammar added later gets rows here too, or this fails naming it."""
    public = {
        name
        for name, value in vars(grammar).items()
        if callable(value)
        and not name.startswith("_")
        and getattr(value, "__module__", "") == grammar.__name__
        and "__mutmut" not in name
    }  # fmt: skip  (mutmut's copies of each function, under --mutation)
    assert public - {c[0] for c in CASES} == set()
