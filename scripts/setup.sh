#!/usr/bin/env bash
# Install everything sandfleet needs on a fresh Debian/Ubuntu host, from the project's own
# files: system packages (as root, via apt) and a virtual environment in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

# passt (pasta) and nftables: user-mode networking for network=True sandboxes and builds
# chromium and chromium-driver: the report test opens every HTML report in a headless browser
# musl-tools: the guest agent is built against musl where it is installed (agent/build.py: a faster
# start in VMs, where glibc's start-up cpuid probes trap to the hypervisor)
# libseccomp-dev: the host compiles the sandboxes' default seccomp filter with libseccomp (sandbox/seccomp.py)
# python3-pytest, python3-yaml: the host image's Python in the reward-integrity tests' sandboxes (a grader that
# loads a YAML config with the full Loader: test_an_honest_yaml_config_with_python_tags_still_loads)
# qemu-user-static, gcc-aarch64-linux-gnu and libc6-dev-arm64-cross: arm64 under emulation (--arch arm64, the
# arm64 smoke test; the cross-compiled guest agent)
# valgrind: the host image's, in the reward-integrity tests' sandboxes (the agent's program run by the tests under
# valgrind: test_a_program_run_inside_valgrind_or_the_loader_is_the_code_under_test)
APT_PACKAGES=(bubblewrap e2fsprogs openssl curl gcc libc6-dev musl-tools libseccomp-dev git make sqlite3 jq python3 python3-pytest python3-yaml valgrind debootstrap xz-utils bc patch file procps passt nftables chromium chromium-driver qemu-user-static gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
# the microvm backend: QEMU, the guest kernel (extracted with lz4), busybox for the initramfs.
# Optional: if they can't be installed, the microvm tests skip and say why.
MICROVM_PACKAGES=()
if [ "${SANDFLEET_MICROVM:-1}" = "1" ] && [ "$(uname -m)" = x86_64 ]; then
  MICROVM_PACKAGES=(qemu-system-x86 linux-image-cloud-amd64 busybox-static e2fsprogs cpio lz4)
fi
# the gvisor backend (runsc) and the peers `sandfleet bench peers` measures (crun, podman).
# Optional: without them the gvisor tests skip, and bench peers reports them missing.
PEER_PACKAGES=()
if [ "${SANDFLEET_GVISOR:-1}" = "1" ]; then
  PEER_PACKAGES=(runsc crun podman)
fi

missing() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
need=$(missing "${APT_PACKAGES[@]}")
want=$(missing "${MICROVM_PACKAGES[@]}")
peers=$(missing "${PEER_PACKAGES[@]}")
if [ -n "$need$want$peers" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || true
    if [ -n "$need" ]; then
      echo "setup: installing" $need
      apt-get install -y -qq $need >/dev/null
    fi
    if [ -n "$want" ]; then
      echo "setup: installing (microvm)" $want
      apt-get install -y -qq $want >/dev/null || echo "setup: microvm packages not installed; its tests will skip" >&2
    fi
    if [ -n "$peers" ]; then
      echo "setup: installing (gvisor, bench peers)" $peers
      apt-get install -y -qq $peers >/dev/null || echo "setup: runsc/crun/podman not installed; gvisor tests will skip" >&2
    fi
  else
    echo "setup: please install:" $need $want $peers "(as root: apt-get install ...)" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e '.[all]'
# the SWE-bench tests grade with the swebench package (an opt-in extra: heavy)
.venv/bin/python -m pip install -q -e '.[swebench]'
