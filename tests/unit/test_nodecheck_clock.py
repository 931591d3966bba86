"""The node check's throwaway copy under TCG boots with ``tsc=reliable`` added to each kernel command line of its
boot configuration (imagebuilder.image.nodecheck.with_kernel_parameter): GRUB's ``linux`` lines, a Boot Loader
Specification entry's ``options``; nothing else changes, and adding it twice adds it once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from imagebuilder.image.nodecheck import TCG_CLOCK, with_kernel_parameter

GRUB = """set default=0
menuentry 'Debian' {
  search --no-floppy --fs-uuid --set=root a04a
  linux /boot/vmlinuz-6.1.0-50-amd64 root=UUID=a04a ro console=tty0 console=ttyS0,115200n8
  initrd /boot/initrd.img-6.1.0-50-amd64
}
menuentry 'Debian (recovery)' {
\tlinuxefi /boot/vmlinuz root=UUID=a04a ro single\r
\tinitrd /boot/initrd.img
}
# linux in a comment is not a command line
"""


def test_every_grub_kernel_line_gets_the_parameter_and_nothing_else_changes() -> None:
    text, changed = with_kernel_parameter(GRUB, TCG_CLOCK)
    assert changed == 2
    before, after = GRUB.splitlines(keepends=True), text.splitlines(keepends=True)
    assert len(before) == len(after)
    differing = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert [a for _, a in differing] == [
        "  linux /boot/vmlinuz-6.1.0-50-amd64 root=UUID=a04a ro console=tty0 console=ttyS0,115200n8 tsc=reliable\n",
        "\tlinuxefi /boot/vmlinuz root=UUID=a04a ro single tsc=reliable\r\n",
    ]
    # a second pass finds it there already
    assert with_kernel_parameter(text, TCG_CLOCK) == (text, 0)


def test_a_bls_entry_gets_it_on_its_options_line_only() -> None:
    entry = "title Red Hat Enterprise Linux\nversion 5.14.0\nlinux /vmlinuz-5.14.0\noptions root=/dev/sda2 ro\n"
    text, changed = with_kernel_parameter(entry, TCG_CLOCK, bls=True)
    assert changed == 1
    assert text == entry.replace("options root=/dev/sda2 ro\n", "options root=/dev/sda2 ro tsc=reliable\n")


def test_a_configuration_without_a_kernel_line_is_left_as_it_is() -> None:
    assert with_kernel_parameter("set timeout=5\nconfigfile /boot/grub/real.cfg\n", TCG_CLOCK) == (
        "set timeout=5\nconfigfile /boot/grub/real.cfg\n",
        0,
    )


_lines = st.lists(
    st.one_of(
        st.builds(
            lambda ws, args: f"{ws}linux /vmlinuz {args}",
            st.sampled_from(["", "  ", "\t"]),
            st.text(st.characters(whitelist_categories=("Ll", "Nd"), whitelist_characters="=/._- "), max_size=30),
        ),
        st.text(st.characters(blacklist_characters="\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), max_size=40),
    ),
    max_size=12,
)


@given(_lines, st.sampled_from(["\n", "\r\n"]))
def test_the_parameter_is_on_every_kernel_line_once_and_other_lines_are_untouched(lines: list[str], eol: str) -> None:
    text = "".join(line + eol for line in lines)
    out, changed = with_kernel_parameter(text, TCG_CLOCK)
    before, after = text.splitlines(keepends=True), out.splitlines(keepends=True)
    assert len(before) == len(after)
    for b, a in zip(before, after, strict=True):
        words = b.split()
        if words and words[0] == "linux":
            assert a.split().count(TCG_CLOCK) == 1 and a.endswith(eol)
            assert a.split()[: len(words)] == words or TCG_CLOCK in words
        else:
            assert a == b
    assert changed == sum(1 for b, a in zip(before, after, strict=True) if b != a)
    assert with_kernel_parameter(out, TCG_CLOCK) == (out, 0)
