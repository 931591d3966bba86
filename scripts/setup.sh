#!/usr/bin/env bash
# Install what image-builder needs on a fresh Debian machine. Run as root (or with sudo available). Safe to rerun:
# every step converges, and a cache that is partial is completed, never trusted as whole.
#
#   ./scripts/setup.sh           what the user tasks need (build, demo, release.build, dhcp.*, template.*...):
#                                system packages, the project virtualenv, Go where the machine has none
#   ./scripts/setup.sh --test    and what only the test suite needs: its tools (pytest, ruff, mypy...), the
#                                vCenter simulator and govc, tuftool, the modern Packers and their plugins
#   ./scripts/setup.sh --bench   and, beside the test tools, the benchmarks' peers (nginx, the lz4 CLI)
set -euo pipefail
cd "$(dirname "$0")/.."

TEST=0 BENCH=0
for arg in "$@"; do
  case "$arg" in
    --test) TEST=1 ;;
    --bench) TEST=1 BENCH=1 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (expected --test or --bench; --help says what each installs)" >&2
       exit 2 ;;
  esac
done

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# System packages of the user tasks. Grouped by the issue that needs them; apt-get skips what is already installed.
APT_PACKAGES=(
  ca-certificates curl git jq unzip make
  # builds (issue: Packer bundle): Packer 1.6.6, QEMU for bare metal / CloudStack, ssh-keygen for build keys
  packer qemu-system-x86 qemu-utils openssh-client
  # host.prepare and image.base: a Debian root, a bootable disk (extlinux), seeds (xorriso), gzip (pigz)
  debootstrap extlinux syslinux-common xorriso pigz e2fsprogs fdisk
  # the KVM probe: a syslinux floppy made without root
  syslinux mtools dosfstools
  # DHCP host (spec 4.9, issue 32): both servers (ISC dhcpd, Kea; dhcp.render checks its files with them),
  # dhcp.verify's capture (tcpdump), namespaces
  isc-dhcp-server kea-dhcp4-server tcpdump iproute2
  # UEFI (--firmware efi): OVMF for QEMU (the builds' and image.verify's firmware); image.base's EFI loader
  ovmf grub-efi-amd64-bin
  # arm64 images on this host (issue 46): their programs run through qemu-user-static (binfmt_misc, registered
  # below), they boot under qemu-system-aarch64 with AAVMF (qemu-efi-aarch64)
  qemu-user-static qemu-system-arm qemu-efi-aarch64
  # release.build: the pause binary is upstream's C source compiled static (gcc, glibc's static libc); runc links
  # libseccomp statically (cgo, found by pkg-config)
  gcc libc6-dev libseccomp-dev pkg-config
  # release.build --arch arm64: Debian's cross gcc for those C parts (arm64's libseccomp comes from its own package,
  # downloaded by release.build through an apt state of that architecture)
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross
  # build --hardening (issue 62): OpenSCAP's scanner (oscap, oscap-chroot), and what ComplianceAsCode's content
  # is built with from its source release (CMake, xsltproc, xmllint; its Python is the venv's)
  openscap-scanner openscap-utils cmake xsltproc libxml2-utils
)
# ... and of the tests alone
TEST_APT_PACKAGES=(
  # DHCP tests: a client in a namespace (busybox udhcpc)
  busybox
  # node customization (spec 4.8) tests: real containerd checks the configs the customize role writes
  containerd
  # reference-tool parity tests: a local APT repository for extra_debs/extra_repos (dpkg-scanpackages), and a
  # real HTTP proxy with a password for http_proxy (the tests start their own; the system service is stopped)
  dpkg-dev tinyproxy
  # the Satellite activation key over RHSM's D-Bus API: a bus and the system Python's D-Bus bindings for its test
  dbus-daemon python3-dbus python3-gi
  # release.build's tests: file(1) tells a static binary
  file
  # the emitted CI pipelines run for real (issue 44): gitlab-ci-local copies each job's checkout with rsync
  rsync
  # keys on a PKCS#11 token (issue 45): SoftHSM2, a real PKCS#11 module, and its softhsm2-util
  softhsm2
)
[ "$TEST" -eq 0 ] || APT_PACKAGES+=("${TEST_APT_PACKAGES[@]}")
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "==> apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  if [[ " ${missing[*]} " == *" tinyproxy "* ]] && command -v systemctl >/dev/null; then
    $SUDO systemctl disable --now tinyproxy >/dev/null 2>&1 || true   # only the tests' own proxies run
  fi
  if [[ " ${missing[*]} " == *"-dhcp"* ]] && command -v systemctl >/dev/null; then
    # only the DHCP servers the tests (or dhcp.install) start run; a package's own would answer on every link
    $SUDO systemctl disable --now kea-dhcp4-server isc-dhcp-server >/dev/null 2>&1 || true
  fi
fi

# arm64 programs run here through qemu-user-static's handler, registered with binfmt_misc from the package's own
# definition (its F flag: the kernel opens the emulator once, so it also runs inside a chroot). Where systemd runs,
# systemd-binfmt registered it when the package was installed; a container has no systemd: mount and register here.
register_binfmt() {  # register_binfmt NAME: /usr/lib/binfmt.d/NAME.conf into the kernel, unless it is there
  local name=$1 dir=/proc/sys/fs/binfmt_misc
  [ -f "/usr/lib/binfmt.d/$name.conf" ] || { echo "error: /usr/lib/binfmt.d/$name.conf is missing" >&2; return 1; }
  [ -e "$dir/register" ] || $SUDO mount -t binfmt_misc binfmt_misc "$dir"
  [ -e "$dir/$name" ] || grep -v '^#' "/usr/lib/binfmt.d/$name.conf" | $SUDO tee "$dir/register" >/dev/null
  grep -qx enabled "$dir/$name"
}
if [ "$(uname -m)" != aarch64 ]; then
  register_binfmt qemu-aarch64 || { echo "error: cannot register qemu-aarch64 with binfmt_misc (arm64 builds need it)" >&2; exit 1; }
fi

# Python virtualenv with the project (editable) and its dev tools.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv || {
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv
    "$PY" -m venv .venv
  }
fi
EXTRAS=""
[ "$TEST" -eq 0 ] || EXTRAS="[dev]"
echo "==> pip install -e .$EXTRAS"
.venv/bin/pip install -q --upgrade pip
# --no-compile: Python compiles a module when it first imports it; compiling all of them at install time (the
# ansible package's collections alone are 21,000 files, for the one connection plugin the chroot engine uses) took
# more CPU than the install itself: 80 s against 36 on this machine, paid again by every job of an emitted pipeline
.venv/bin/pip install -q --no-compile -e ".$EXTRAS"
# Go: release.build (Kubernetes from upstream source) and vcsim/govc below. Go 1.21 or newer fetches the toolchain
# a module asks for from the Go module proxy by itself (GOTOOLCHAIN=auto); an older or missing Go (Debian 12 has
# 1.19) is used once to fetch a current one, which the proxy also serves as a module (golang.org/toolchain), and
# that one is linked into .venv/bin, where the tasks look first.
GO_TOOLCHAIN=1.25.4
export PATH="$PWD/.venv/bin:$PATH"   # a toolchain fetched by an earlier run is found there
go_ok() { command -v go >/dev/null && go version | grep -Eq ' go1\.(2[1-9]|[3-9][0-9])(\.|rc| )'; }
if ! go_ok; then
  if ! command -v go >/dev/null; then
    echo "==> apt-get install golang-go (only to fetch Go $GO_TOOLCHAIN from the Go module proxy)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends golang-go
  fi
  echo "==> Go $GO_TOOLCHAIN from the Go module proxy (golang.org/toolchain)"
  fetch=$(mktemp -d)
  (cd "$fetch" && go mod init fetch >/dev/null 2>&1 &&
     go mod download -json "golang.org/toolchain@v0.0.1-go$GO_TOOLCHAIN.linux-amd64" > toolchain.json)
  moddir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$fetch/toolchain.json")
  rm -rf "$fetch"
  [ -f "$moddir/bin/go" ] || { echo "error: no Go toolchain at '$moddir'" >&2; exit 1; }
  # a module keeps no file modes: the toolchain is copied out and its programs made executable, as Go does itself
  goroot="$PWD/.tools/go-$GO_TOOLCHAIN"
  rm -rf "$goroot"
  mkdir -p .tools
  cp -r "$moddir" "$goroot"
  chmod -R u+w "$goroot"
  chmod +x "$goroot"/bin/* "$goroot"/pkg/tool/*/*
  ln -sf "$goroot/bin/go" .venv/bin/go
  ln -sf "$goroot/bin/gofmt" .venv/bin/gofmt
  go_ok || { echo "error: $(command -v go) is not Go 1.21 or newer" >&2; exit 1; }
fi

if [ "$TEST" -eq 0 ]; then
  echo "==> setup done: the user tasks are ready (.venv/bin/invoke --list); ./scripts/setup.sh --test adds the test tools"
  exit 0
fi

TOOLS_BIN="$PWD/.tools/bin"
mkdir -p "$TOOLS_BIN"
# go_tool NAME MODULE/PATH VERSION: a test tool built from source through the Go module proxy into .tools/bin, pinned
# (a stamp names the version built; another version is built again)
go_tool() {
  local name=$1 package=$2 version=$3
  local stamp="$TOOLS_BIN/.$name-$version"
  if [ ! -x "$TOOLS_BIN/$name" ] || [ ! -e "$stamp" ]; then
    command -v go >/dev/null || { echo "error: Go is needed to install $name (go install $package@$version)" >&2; exit 1; }
    echo "==> go install $package@$version"
    GOBIN="$TOOLS_BIN" GOFLAGS=-mod=mod go install "$package@$version"
    rm -f "$TOOLS_BIN/.$name-"*
    touch "$stamp"
  fi
}
# vcsim (the vCenter simulator the vSphere tests run against) and govc (the benchmark's peer), one pinned govmomi
# release (>= v0.45: older ones lack the SSO admin simulator and reject ContentLibrary/Tagging privileges)
GOVMOMI_VERSION=v0.46.0
go_tool vcsim github.com/vmware/govmomi/vcsim "$GOVMOMI_VERSION"
go_tool govc github.com/vmware/govmomi/govc "$GOVMOMI_VERSION"
# actionlint: the emitted GitHub workflow is checked by it (issue 44)
go_tool actionlint github.com/rhysd/actionlint/cmd/actionlint v1.7.12
# local-kms (issue 45): a KMS-compatible server for the KMS signing tests, because moto does not implement Sign with
# MessageType=DIGEST (what securesystemslib's AWSSigner sends)
go_tool local-kms github.com/nsmithuk/local-kms v0.0.0-20260228092603-2a5e92d09ab6
# bbolt's own CLI (issue 45): the tests check with its `check` the containerd databases a reproducible build writes
go_tool bbolt go.etcd.io/bbolt/cmd/bbolt v1.4.3
# gitlab-ci-local (the emitted GitLab pipeline runs for real, its jobs in the shell, issue 44), from the npm registry,
# pinned: 4.69.0 is the newest that runs on Node 20 (4.70 and later use Node 22's Set methods)
GITLAB_CI_LOCAL_VERSION=4.69.0
GCL_PREFIX="$PWD/.tools/gitlab-ci-local-$GITLAB_CI_LOCAL_VERSION"
if [ ! -x "$GCL_PREFIX/node_modules/.bin/gitlab-ci-local" ]; then
  if ! command -v npm >/dev/null; then  # Node and npm: Debian's, unless the machine has its own
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
  fi
  echo "==> npm install gitlab-ci-local@$GITLAB_CI_LOCAL_VERSION"
  npm install --silent --no-audit --no-fund --prefix "$GCL_PREFIX" "gitlab-ci-local@$GITLAB_CI_LOCAL_VERSION"
fi
ln -sf "$GCL_PREFIX/node_modules/.bin/gitlab-ci-local" "$TOOLS_BIN/gitlab-ci-local"

# The long builds of the test setup run side by side (measured on a fresh machine of this kind: done 33 minutes
# after the setup began, where one after the other took 80.6), each into its own log, cached across clones so that
# a rerun finds them and takes seconds:
#   - tuftool, the TUF client of Bottlerocket's tooling: the publishing tests download with it beside our own client
#     (issue 31), and the OS-1 benchmark measures against it (cargo);
#   - the modern Packers the tests build on (1.9.4, 1.16.0) and their plugins, newest and floors: built from
#     ../shared/packer-src by ../shared/tools/build-packer.sh and from the Go module proxy, into ~/.cache (only what is
#     missing is built). Without ../shared (a clone on its own) the tests that need them skip, and fail in CI;
#   - what the tests build from upstream source (Kubernetes v1.36.3 with containerd 2, a containerd 1.7 runtime:
#     tests/support/sources.py), so that the first test run does not build them inside its end-to-end tests.
TUFTOOL_VERSION=0.17.0
TUFTOOL_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/image-builder/tuftool-$TUFTOOL_VERSION"
install_tuftool() {
  # a cargo that cannot run is none (rustup's proxy on PATH with no toolchain for this user: another HOME's)
  CARGO=$(command -v cargo || true)
  [ -z "$CARGO" ] || "$CARGO" --version >/dev/null 2>&1 || CARGO=""
  [ -n "$CARGO" ] || ! "$HOME/.cargo/bin/cargo" --version >/dev/null 2>&1 || CARGO="$HOME/.cargo/bin/cargo"
  if [ -z "$CARGO" ]; then
    echo "installing Rust (rustup, minimal profile) for cargo"
    curl --proto '=https' -sSfL -o /tmp/rustup-init \
      https://static.rust-lang.org/rustup/dist/x86_64-unknown-linux-gnu/rustup-init
    chmod +x /tmp/rustup-init && /tmp/rustup-init -y --profile minimal --no-modify-path && rm -f /tmp/rustup-init
    CARGO="$HOME/.cargo/bin/cargo"
  fi
  "$CARGO" install --quiet --locked --root "$TUFTOOL_CACHE" tuftool --version "$TUFTOOL_VERSION"
}
if [ ! -x ../shared/tools/build-packer.sh ] && [ -n "${CI:-}" ]; then
  echo "error: ../shared/tools/build-packer.sh is not there: CI builds the modern Packers with it" >&2
  exit 1
fi
LOGS="$PWD/.tools/setup-logs"
mkdir -p "$LOGS"
logs=() names=() pids=()
start() {  # start LOG WHAT COMMAND...: COMMAND in the background, its output in $LOGS/LOG.log
  local log=$1 what=$2; shift 2
  echo "==> $what (beside the others; log: .tools/setup-logs/$log.log)"
  "$@" > "$LOGS/$log.log" 2>&1 &
  logs+=("$log") names+=("$what") pids+=("$!")
}
trap 'kill "${pids[@]}" 2>/dev/null || true' INT TERM
[ -x "$TUFTOOL_CACHE/bin/tuftool" ] || start tuftool "cargo install tuftool $TUFTOOL_VERSION" install_tuftool
if [ -x ../shared/tools/build-packer.sh ]; then
  start packers "the modern Packers and their plugins" ./scripts/modern-packers.sh
else
  echo "==> no ../shared/tools/build-packer.sh: the modern-Packer tests will skip (docs/packer.md)"
fi
# What the tests build from upstream source, and issue 46's arm64 base image (image.base --arch arm64; half an hour
# when its inputs change), are started in the background and not waited for, so that on a machine without them the
# tests start meanwhile (the light modules mostly wait on servers and guests): a test that needs one waits for it
# under the cache's locks (one builder per source component, release/source.py; the base's, tests/support/
# sources.py), or builds a component nothing has started yet, and fails with the build's error when it fails. Cached,
# the source builds take seconds.
if [ "$TEST" -eq 1 ]; then
  echo "==> the test suite's source builds, in the background (log: .tools/setup-logs/sources.log)"
  nohup .venv/bin/python -m tests.support.sources > "$LOGS/sources.log" 2>&1 &
  echo "==> the test suite's arm64 base image, in the background (log: .tools/setup-logs/arm64-base.log)"
  nohup .venv/bin/python -m tests.support.sources --arm64-base > "$LOGS/arm64-base.log" 2>&1 &
fi
failed=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "==> ${names[$i]}: done"
  else
    echo "error: ${names[$i]} failed; the end of .tools/setup-logs/${logs[$i]}.log:" >&2
    tail -n 40 "$LOGS/${logs[$i]}.log" >&2
    failed=1
  fi
done
trap - INT TERM
[ "$failed" -eq 0 ] || exit 1
mkdir -p "$TOOLS_BIN"
ln -sf "$TUFTOOL_CACHE/bin/tuftool" "$TOOLS_BIN/tuftool"

# Benchmark peers (bench/run.py only; not needed to build or test): nginx and the lz4 CLI.
if [ "$BENCH" -eq 1 ]; then
  for p in nginx-light lz4 curl pigz; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || {
      $SUDO apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$p"
    }
  done
  # a package install may start the distribution's nginx on port 80; the benchmark starts its own
  command -v systemctl >/dev/null && $SUDO systemctl disable --now nginx 2>/dev/null || true
fi

echo "==> setup done (test tools included): activate with 'source .venv/bin/activate' (or call .venv/bin/invoke / .venv/bin/image-builder)"
