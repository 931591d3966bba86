"""``template.import --from-file``'s list, read through the one validation layer (issue 47): a strict model per
entry, every problem of every entry in one report naming the entry and its field, and the values the list's users
write (an unquoted ``kubernetes: 1.24``, an empty optional name, OVA paths relative to the list) read as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuilder.core.errors import InputError, InputErrors
from imagebuilder.vsphere.templates import load_import_list


def listing(tmp_path: Path, text: str) -> str:
    (tmp_path / "a.ova").write_bytes(b"")
    path = tmp_path / "templates.yaml"
    path.write_text(text)
    return str(path)


def test_what_users_write_is_read(tmp_path: Path) -> None:
    url = "https://images.example/r.ova"
    path = listing(tmp_path, f"- {{ova: a.ova, os: ubuntu, kubernetes: 1.24, name: ''}}\n"
                             f"- {{ova: '{url}', os: os3, kubernetes: '1.25', name: rh}}\n")  # fmt: skip
    first, second = load_import_list(path)
    assert (first.source, first.os.name, first.channel.minor, first.name) == (str(tmp_path / "a.ova"), "ubuntu",
                                                                               "1.24", None)  # fmt: skip
    assert (second.source, second.os.name, second.channel.minor, second.name) == (
        url, "redhat", "1.25", "rh")  # fmt: skip


def test_every_problem_of_every_entry_is_reported_at_once(tmp_path: Path) -> None:
    path = listing(tmp_path, "- {ova: '', os: ubuntu, kubernetes: '1.25'}\n"
                             "- {ova: missing.ova, os: os9}\n"
                             "- {ova: a.ova, os: ubuntu, kubernets: '1.24'}\n"
                             "- notamap\n"
                             "- {ova: 'ftp://x/y.ova', os: redhat, kubernetes: 1.24}\n"
                             "- {ova: a.ova, os: ubuntu, kubernetes: 1.24}\n"
                             "- {ova: a.ova, os: ubuntu, kubernetes: 1.24}\n"
                             "- {ova: a.ova, os: ubuntu, kubernetes: 1.24, name: 'a/b'}\n")  # fmt: skip
    with pytest.raises(InputErrors) as err:
        load_import_list(path)
    found = [(e.field, e.detail) for e in err.value.errors]
    assert all(e.source == path for e in err.value.errors)
    assert found[:7] == [
        ("[0].ova", "required field is missing"),
        ("[1].kubernetes", "required field is missing"),
        ("[1].ova", f"{tmp_path / 'missing.ova'} does not exist"),
        ("[2].kubernets", "unknown field; did you mean 'kubernetes'?"),
        ("[2].kubernetes", "required field is missing"),
        ("[3]", "must be a mapping"),
        ("[4].ova", "expected a http or https URL, got 'ftp://x/y.ova'"),
    ]
    assert found[7][0] == "[7].name" and "a/b" in found[7][1]
    assert found[8:] == [("name", "template name ubuntu-kubernetes-1-24-eks-36 appears twice")]


@pytest.mark.parametrize("text", ["", "{ova: a.ova}\n", "[]\n", "- {ova: a.ova}\n---\n- {ova: a.ova}\n"])
def test_a_file_that_is_not_one_non_empty_list_is_refused(tmp_path: Path, text: str) -> None:
    path = listing(tmp_path, text)
    with pytest.raises(InputError) as err:
        load_import_list(path)
    assert err.value.source == path and "must be a non-empty YAML list" in str(err.value)
