"""The Vulkan memory heaps, types, budget and this process's usage of every physical device (the module lives in
webtensor: backends/wgpu/vkmem.py, which the KV pool's sizing reads too).

    python tools/vkmem.py
"""

from __future__ import annotations

import sys

from webtensor.backends.wgpu.vkmem import VkMemory

__all__ = ["VkMemory"]

if __name__ == "__main__":
    print(VkMemory().describe())
    sys.exit(0)
