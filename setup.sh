#!/usr/bin/env bash
# Sets up webtensor on Debian/Ubuntu (as root, or with sudo): a Vulkan driver when none is present
# (Mesa's lavapipe, so WebGPU runs even without a GPU), Python's venv, and the project in .venv.
#   bash setup.sh          runtime only
#   bash setup.sh --test   also the test tools (pytest, hypothesis, ruff, torch CPU, transformers)
# Re-running is fast: each step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")"
want_test=0; [ "${1:-}" = "--test" ] && want_test=1
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
apt_updated=0
apt_install() {
  [ $apt_updated = 1 ] || { $SUDO apt-get update -qq >/dev/null; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
need=()
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if ! ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1; then
  need+=(mesa-vulkan-drivers libvulkan1)
fi
ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1' || need+=(libvulkan1)
if [ ${#need[@]} -gt 0 ]; then echo "setup: installing ${need[*]} (apt)"; apt_install "${need[@]}"; fi

[ -x .venv/bin/python ] || python3 -m venv .venv
stamp=".venv/.webtensor-setup-$want_test-$(cat pyproject.toml | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "setup: installing webtensor into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  if [ $want_test = 1 ]; then
    .venv/bin/python -m pip install -q -e ".[test]"
  else
    .venv/bin/python -m pip install -q -e .
  fi
  touch "$stamp"
fi
