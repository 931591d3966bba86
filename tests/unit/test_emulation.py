"""The node check's emulated amd64 guest boots a throwaway copy with ``tsc=reliable`` added to each kernel command line
of its boot configuration (imagebuilder.image.emulation.with_kernel_parameter): GRUB's ``linux`` lines, a Boot Loader
Specification entry's ``options``, EXTLINUX's ``APPEND``; nothing else changes, and adding it twice adds it once.
(The copy's device wait, a systemd drop-in, is tested on real images: tests/integration/test_emulated_boot.py.)"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from imagebuilder.core.arch import arch
from imagebuilder.core.hostinfo import KvmStatus
from imagebuilder.image.emulation import CLOCK as TCG_CLOCK
from imagebuilder.image.emulation import emulated, with_kernel_parameter

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
    text, changed = with_kernel_parameter(entry, TCG_CLOCK, syntax="bls")
    assert changed == 1
    assert text == entry.replace("options root=/dev/sda2 ro\n", "options root=/dev/sda2 ro tsc=reliable\n")


def test_extlinux_append_lines_get_it_whatever_their_case_and_grub_words_there_do_not() -> None:
    conf = "DEFAULT linux\nLABEL linux\n  LINUX /boot/vmlinuz\n  APPEND root=UUID=a04a ro\n\tappend quiet\n"
    text, changed = with_kernel_parameter(conf, TCG_CLOCK, syntax="extlinux")
    assert changed == 2
    assert text == conf.replace("ro\n", f"ro {TCG_CLOCK}\n").replace("quiet\n", f"quiet {TCG_CLOCK}\n")
    # EXTLINUX's LINUX names the kernel: it is no command line there
    assert "/boot/vmlinuz\n" in text


def test_a_guest_is_emulated_without_usable_kvm_or_on_another_architecture() -> None:
    amd64, arm64 = arch("amd64"), arch("arm64")
    tcg, kvm = KvmStatus(False, "no /dev/kvm"), KvmStatus(True, "ok")
    assert emulated(amd64, tcg) and emulated(arm64, kvm) and emulated(arm64, tcg)
    assert not emulated(amd64, kvm)


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


def test_an_emulated_guest_gets_one_vcpu_per_two_host_cores_and_an_accelerated_one_what_it_asks() -> None:
    from imagebuilder.image.emulation import vcpus

    amd64, arm64 = arch("amd64"), arch("arm64")
    tcg, kvm = KvmStatus(False, "no /dev/kvm"), KvmStatus(True, "ok")
    assert vcpus(amd64, kvm, host_cores=2) == 2 and vcpus(amd64, kvm, wanted=4, host_cores=2) == 4
    assert [vcpus(amd64, tcg, host_cores=n) for n in (1, 2, 3, 4, 16)] == [1, 1, 1, 2, 2]
    assert vcpus(arm64, kvm, host_cores=2) == 1, "another architecture is emulated whatever KVM can do"
    assert vcpus(amd64, tcg, wanted=1, host_cores=16) == 1


def test_an_emulated_arm64_guest_computes_pointer_authentication_the_cheap_way_and_amd64_is_left_alone() -> None:
    """The architected QARMA algorithm, translated instruction by instruction, more than doubled the arm64 base's
    boot to cloud-init (306 s against 130, docs/arm64.md); QEMU's implementation-defined one keeps the feature."""
    from imagebuilder.image.emulation import machine_args

    tcg = KvmStatus(False, "no /dev/kvm")
    assert machine_args(arch("arm64"), tcg) == ("-machine", "virt", "-cpu", "max,pauth-impdef=on")
    assert machine_args(arch("amd64"), tcg) == arch("amd64").qemu_machine == ()
    assert arch("arm64").qemu_machine == ("-machine", "virt", "-cpu", "max"), "the table itself is unchanged"
