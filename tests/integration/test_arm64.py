"""arm64 node images on this amd64 host (issue 46), against the real components: Debian's arm64 packages installed
by debootstrap through qemu-user-static and binfmt_misc, GRUB's arm64 EFI loader, and a boot under
qemu-system-aarch64 with AAVMF (TCG) to a login prompt; ``build --arch arm64``'s plan against a mirror."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagebuilder.core.arch import arch, elf_machine
from imagebuilder.core.disk import mounted_root, raw_view
from imagebuilder.image.bootcheck import check_raw
from tests.support.common import run

ARM64 = arch("arm64")
# the arm64 base may still be in the making (setup.sh --test starts it in the background): its fixture waits for it
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(5400)]


@pytest.fixture(scope="module")
def arm64_base() -> Path:
    """``image.base --arch arm64`` for real, by the CLI (debootstrap runs every package script under qemu-user: half
    an hour, so it is kept in ~/.cache by its inputs and setup.sh --test makes it beside its other builds)."""
    from tests.support.sources import arm64_base

    image = arm64_base()
    log = (image.parent / "build.log").read_text()
    assert "--arch=arm64" in log and "-O arm64-efi" in log and "BOOTAA64.EFI" in log, log[-3000:]
    return image


def test_the_arm64_base_is_an_arm64_system_that_boots_by_uefi_only(arm64_base: Path) -> None:
    with raw_view(arm64_base) as raw:
        check = check_raw(raw)
        assert check.ok, check.problems
        assert check.uefi_arches == ["arm64"] and "UEFI only: no BIOS boot code" in check.notes, check.notes
        with mounted_root(raw) as root:
            for program in ("usr/bin/bash", "usr/lib/systemd/systemd", "usr/sbin/sshd", "usr/bin/python3"):
                assert elf_machine((root / program).resolve()) == ARM64.elf_machine, program
            assert sorted(p.name for p in (root / "boot").glob("vmlinuz-*"))[-1].endswith("-arm64")
            grub = (root / "boot/grub/grub.cfg").read_text()
            assert "console=ttyAMA0" in grub and "serial --unit" not in grub
            assert not (root / "boot/extlinux").exists()
            assert (root / "usr/lib/grub/arm64-efi/linux.mod").is_file()
            # dpkg's fsyncs were skipped while the root was made, and the setting is not shipped
            assert not list((root / "etc/dpkg/dpkg.cfg.d").glob("image-builder-*"))


def test_the_dry_run_says_what_an_arm64_base_is(tmp_path: Path) -> None:
    res = run("image.base", "--arch", "arm64", "--dest", str(tmp_path / "b.qcow2"), "--dry-run")
    assert res.code == 0, res.err
    assert "bookworm arm64" in res.out and "linux-image-arm64" in res.out and "grub-efi-arm64-bin" in res.out
    assert "UEFI only" in res.out and "ttyAMA0" in res.out
    assert not (tmp_path / "b.qcow2").exists()
    bad = run("image.base", "--arch", "aarch64", "--dest", str(tmp_path / "b.qcow2"), "--dry-run")
    assert bad.code == 2 and "did you mean 'arm64'" in bad.err


def test_build_plans_arm64_from_the_manifest_and_refuses_an_install_from_the_iso(mirror_dir: Path) -> None:
    """The plan resolves arm64 first (the release's arm64 artifacts, the line's runtime for arm64: a mirror made for
    amd64 lacks it, and says so), then refuses a build with no arm64 source image: the Packer engine would install
    from the OS version's installer ISO, an amd64 one."""
    args = ["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--arch", "arm64",
            "--dry-run", "--mirror", str(mirror_dir), "--offline"]  # fmt: skip
    res = run(*args)
    assert res.code == 2 and "containerd-1.7.28-linux-arm64.tar.gz.sha256sum" in res.err, res.out + res.err
    assert "not found" in res.err and "--mirror" in res.err
    res = run(*args, "--runtime", "os")
    assert res.code == 2, res.out + res.err
    assert "--arch: arm64 images are built from an arm64 disk image, and this build installs" in res.err, res.err
    assert "an arm64 source_image_url in --baremetal-config" in res.err, res.err


@pytest.mark.qemu
def test_packer_starts_arm64_in_an_emulated_virt_machine_and_ctrl_c_leaves_nothing(
    arm64_base: Path, tmp_path: Path
) -> None:
    """``build --arch arm64 --engine packer``: Debian's Packer 1.6.6 starts qemu-system-aarch64's ``virt`` machine
    under TCG with AAVMF and the arm64 base (cloud-init's seed on a SCSI CD: the machine has no IDE), and waits for
    its SSH; there the user presses Ctrl-C: the build ends with 130 and leaves nothing but its log. A stand-in release
    with the OS's runtime (its scripts are named for arm64): this proves the engine's plan and its VM's command
    line, not a release's images.

    CI time (issue 46: "one boot per CI", and that boot is the matrix test's, below): the whole build took 338 to
    900 s of the CI's machine (362 to 655 s of CPU), and running it to its Ansible's first task 241 to 306 s, most of
    it the guest's boot under TCG. The boot, SSH, Ansible in the arm64 guest, the seal and the packaging are
    ``bench/run.py --only arm64``'s: it runs this build to its end, checks its image (every node program an aarch64
    ELF, arm64's UEFI loader) and times it against the chroot engine."""
    from imagebuilder.core.files import sha256_file
    from tests.support import packers
    from tests.support.common import BIN, ArgvWatcher, run_folders, tagged
    from tests.support.offline import ns_env

    config = tmp_path / "bm.json"
    config.write_text(json.dumps({"source_image_url": str(arm64_base),
                                  "source_image_checksum": f"sha256:{sha256_file(arm64_base)}"}))  # fmt: skip
    # a long HOME (the test's folder): Ansible's SSH control sockets once went under it, past a socket path's 108 bytes
    out, home = tmp_path / "out", tmp_path / "home"
    home.mkdir()
    args = ["build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--arch", "arm64",
            "--engine", "packer", "--baremetal-config", str(config), "--mirror", str(standin(tmp_path)), "--offline",
            "--runtime", "os", "--disk-gb", "4", "--min-disk-gb", "10", "--output-dir", str(out)]  # fmt: skip
    env = ns_env(home)  # the build VM gets one vCPU (tests.support.offline.one_vcpu_config)
    dry = run(*args, "--dry-run", env=env)
    assert dry.code == 0, dry.out[-3000:] + dry.err[-3000:]
    assert "engine              packer (--engine packer)" in dry.out and "UEFI only" in dry.out, dry.out

    with ArgvWatcher() as argv:

        def vms() -> set[str]:
            return {c for c in argv.seen if c.split(" ", 1)[0].endswith("qemu-system-aarch64") and str(home) in c}

        # Packer waits for the guest's SSH: its VM runs (seen by the watcher), then Ctrl-C
        done = packers.ctrl_c_at([str(BIN / "image-builder"), *args], env, at="Waiting for SSH", ready=vms)
    assert done.code == 130, (done.code, done.output[-3000:])
    [vm] = vms()
    assert "type=virt,accel=tcg" in vm and f"-bios {ARM64.uefi[0]} " in vm and "pauth-impdef=on" in vm, vm
    # the seed's CD on SCSI (the virt machine has no IDE), the system disk on virtio
    assert "-device virtio-scsi-device -device scsi-cd,drive=cdrom0" in vm and ",if=virtio," in vm, vm
    assert not done.tasks, done.tasks
    assert tagged(done.pid) == [] and run_folders(done.pid) == [], (tagged(done.pid), run_folders(done.pid))
    assert sorted(p.name for p in out.iterdir()) == ["logs"], sorted(p.name for p in out.iterdir())
    [log] = (out / "logs").iterdir()
    text = log.read_text()
    assert text.rstrip().endswith("Cleanly cancelled builds after being interrupted."), text[-2000:]


#: the release the arm64 image carries: Kubernetes built from upstream source, cross-compiled for arm64
SOURCE_MANIFEST = "https://kubernetes-source.invalid/kubernetes-1-36/kubernetes-1-36-source-3.yaml"


@pytest.mark.qemu
def test_the_matrix_builds_both_arches_and_the_arm64_image_boots_under_aavmf(
    arm64_base: Path, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``build.matrix --arch amd64,arm64`` on this amd64 host, one command: each architecture from its own source
    image (``--baremetal-config AMD64,arm64=ARM64``) and OS layer, by the chroot engine; the arm64 image's programs
    run by qemu-user in the chroot (containerd too, importing the images). The release is Kubernetes v1.36.3 with its
    containerd 2 runtime, built from source for both architectures by ``release.build --arch amd64,arm64`` (cached:
    setup.sh --test builds it) and mirrored with ``mirror.create --arch amd64,arm64``. Each image is named for its
    architecture and its programs are that architecture's ELF; both go into one new version of a TUF repository, each
    under its own name, and a client downloads the arm64 one by name; it boots under qemu-system-aarch64 with AAVMF
    to its login prompt (the node check of both architectures' images: bench/nodes.py; CI's amd64 one is the
    offline test's)."""
    from imagebuilder.builder.verify import verify_image
    from imagebuilder.core.files import sha256_file
    from tests.support.common import vm_turn
    from tests.support.sources import SOURCE_RELEASE

    release, mirror = tmp_path / "release", tmp_path / "mirror"
    built = run("release.build", "--kubernetes", SOURCE_RELEASE, "--arch", "amd64,arm64", "--dest", str(release),
                timeout=3600)  # fmt: skip
    assert built.code == 0 and "architectures: amd64, arm64" in built.out, built.out[-2000:] + built.err[-2000:]
    made = run("mirror.create", "--release-channel", "1-36", "--release-manifest", SOURCE_MANIFEST, "--source",
               str(release), "--dest", str(mirror), "--arch", "amd64,arm64")  # fmt: skip
    assert made.code == 0 and "(amd64, arm64)" in made.out, made.out + made.err
    # the amd64 base only now: the first worker makes it at the run's start, and this one lays out the release and
    # its mirror meanwhile instead of waiting for it
    base_image: tuple[Path, str] = request.getfixturevalue("base_image")
    configs = {}
    for name, image in (("amd64", base_image[0]), ("arm64", arm64_base)):
        configs[name] = tmp_path / f"bm-{name}.json"
        configs[name].write_text(json.dumps({"source_image_url": str(image),
                                             "source_image_checksum": f"sha256:{sha256_file(image)}"}))  # fmt: skip
    out = tmp_path / "out"
    from imagebuilder.attest.keys import generate

    generate(tmp_path / "build.pem")  # the key both builds sign their provenance with (image.publish checks it)
    args = ["build.matrix", "--pairs", "ubuntu:baremetal", "--release-channel", "1-36", "--arch", "amd64,arm64",
            "--release-manifest", SOURCE_MANIFEST, "--baremetal-config", f"{configs['amd64']},arm64={configs['arm64']}",
            "--mirror", str(mirror), "--offline", "--engine", "chroot", "--disk-gb", "6", "--output-dir", str(out),
            "--layer-cache", str(tmp_path / "layers"), "--signing-key", str(tmp_path / "build.pem")]  # fmt: skip
    dry = run(*args, "--dry-run")
    assert dry.code == 0, dry.out[-3000:] + dry.err[-3000:]
    res = run(*args, timeout=5000)
    assert res.code == 0, res.out[-3000:] + res.err[-3000:]
    names = sorted(p.name for p in out.glob("*.gz"))
    assert names == ["ubuntu-v1.36.3-source-3-amd64.gz", "ubuntu-v1.36.3-source-3-arm64.gz"], names
    for name, machine in (("amd64", arch("amd64")), ("arm64", ARM64)):
        with raw_view(out / f"ubuntu-v1.36.3-source-3-{name}.gz") as raw:
            check = check_raw(raw)
            assert check.ok and check.uefi_arches == [name], check.summary()
            with mounted_root(raw) as root:
                for program in ("usr/bin/kubelet", "usr/local/bin/containerd", "usr/local/sbin/runc",
                                "opt/cni/bin/bridge"):  # fmt: skip
                    assert elf_machine(root / program) == machine.elf_machine, (name, program)
    # both architectures in one new repository version, each under its own name; a client takes the arm64 one by name
    repo, keys = tmp_path / "repo", tmp_path / "keys"
    assert run("repo.keygen", "--dest", str(keys)).code == 0
    assert run("repo.init", "--repo", str(repo), "--keys", str(keys)).code == 0
    each = [a for name in names for a in ("--image", str(out / name))]
    published = run("image.publish", *each, "--repo", str(repo), "--keys", str(keys), "--public-key",
                    str(tmp_path / "build.pem.pub"), timeout=1200)  # fmt: skip
    assert published.code == 0, published.out + published.err
    versions = sorted(int(p.name.split(".")[0]) for p in (repo / "metadata").glob("*.targets.json"))
    assert versions == [1, 2], versions  # consistent snapshots: the first version, and one new one for both images
    targets = json.loads((repo / "metadata" / "2.targets.json").read_text())["signed"]["targets"]
    assert set(names) <= set(targets), sorted(targets)
    image = out / "ubuntu-v1.36.3-source-3-arm64.gz"
    got = run("download.image", "--repo", str(repo), "--root", str(repo / "metadata" / "1.root.json"), "--target",
              image.name, "--dest", str(tmp_path / "down"), timeout=1200,
              env={"IMAGE_BUILDER_WORKSPACE": str(tmp_path / "ws")})  # fmt: skip
    assert got.code == 0, got.out + got.err
    assert sha256_file(tmp_path / "down" / image.name) == sha256_file(image)
    # image.verify: the files (every node program aarch64, the release's versions, the images imported) and a boot
    # by the architecture the build manifest records, to its login prompt: CI's one arm64 boot (issue 46). Its node
    # check (image.verify --node-check: the image joins its own control plane, turns Ready, runs a pod) is
    # bench/run.py --only nodes's, against amd64's: in CI it cost 9 more minutes of CPU at the machine's slow speed,
    # past the budget the issue runs it in CI within (docs/testing.md). A shared turn: the throwaway copy's systemd
    # waits 900 s for devices (emulating arm64 under TCG beside the light modules once slowed its udev past systemd's
    # 90 s wait for /dev/ttyAMA0, and the console's getty never started)
    with vm_turn():
        findings = {f.name: f for f in verify_image(image, boot_timeout=1800, expected_arch="arm64")}
    assert all(f.ok for f in findings.values()), [(f.name, f.detail) for f in findings.values() if not f.ok]
    assert findings["architecture"].detail.endswith("node programs are aarch64 ELF"), findings["architecture"].detail
    assert "v1.36.3" in findings["kubelet version"].detail and "v2.3.1" in findings["containerd"].detail
    assert "all 7 in containerd" in findings["preloaded images"].detail
    assert "BOOTAA64.EFI" in findings["UEFI loader"].detail and "UEFI, AAVMF" in findings["boot"].detail
    assert "systemd waits 900 s for devices" in findings["boot"].detail, findings["boot"].detail


def standin(tmp_path: Path) -> Path:
    """A stand-in release of 1-24 with amd64 and arm64 artifacts, at its upstream URL paths (a mirror's layout)."""
    from imagebuilder.release.catalog import load_catalog
    from imagebuilder.release.standin import make_standin_release

    make_standin_release(tmp_path / "upstream", load_catalog().channel("1-24"), arches=("amd64", "arm64"))
    return tmp_path / "upstream"


def test_an_amd64_source_for_an_arm64_build_is_refused_naming_it(
    base_image: tuple[Path, str], arm64_base: Path, tmp_path: Path
) -> None:
    image, digest = base_image
    # image.diff tells the two apart, and compares them only when asked: every package and binary differs
    res = run("image.diff", "--image", str(image), "--against", str(arm64_base), timeout=600)
    assert res.code == 2 and "is amd64 and debian-arm64.qcow2 is arm64" in res.err and "--any-arch" in res.err
    res = run("image.diff", "--image", str(image), "--against", str(arm64_base), "--any-arch", timeout=600)
    assert res.code == 1 and "arch       /usr/bin/env: amd64  |  arm64" in res.out, res.out[-2000:] + res.err
    config = tmp_path / "bm.json"
    config.write_text(f'{{"source_image_url": "{image}", "source_image_checksum": "sha256:{digest}"}}')
    res = run("build", "--os", "ubuntu", "--hypervisor", "baremetal", "--release-channel", "1-24", "--arch", "arm64",
              "--baremetal-config", str(config), "--offline", "--runtime", "os", "--disk-gb", "4",
              "--output-dir", str(tmp_path / "out"), "--mirror", str(standin(tmp_path)))  # fmt: skip
    assert res.code == 2, res.out[-2000:] + res.err[-2000:]
    assert "source_image_url" in res.err and "boots amd64 machines (its EFI loader)" in res.err, res.err
    assert "image.base --arch arm64" in res.err
    assert not list((tmp_path / "out").glob("*.gz")), "no image (the refused run's log is kept, as every run's)"
    # an image without an EFI loader to tell is refused once mounted, by its programs' ELF machine
    from imagebuilder.builder.chroot_mounts import _check_arch
    from imagebuilder.core.errors import InputError

    with raw_view(image) as raw, mounted_root(raw) as root:
        _check_arch(root, "amd64")
        with pytest.raises(
            InputError, match=r"its programs are for amd64 \(/usr/bin/env\), and the build is for arm64"
        ):
            _check_arch(root, "arm64")
