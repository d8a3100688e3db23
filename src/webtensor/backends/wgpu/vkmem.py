"""The adapter's memory, from Vulkan: the memory heaps and types of each physical device, and
VK_EXT_memory_budget's per-heap budget and this process's usage, read through a second Vulkan
instance of our own (ctypes over the loader; no vulkaninfo needed). WebGPU does not say how much
memory an adapter has; `device_local_bytes(name)` (the KV pool's `--kv-memory 0.5`, and its default)
asks Vulkan for the device-local heap of the adapter of that name. wgpu's allocations show up as
heap usage of the process, so a snapshot before and after an allocation says which heap (device
memory, host memory, or the BAR window) took it.

    python tools/vkmem.py            # heaps, types, budget, usage of every physical device

`VkMemory()` opens the instance once; `.snapshot()` gives [(device name, [(heap index, size,
flags, budget, usage)])]; `.describe()` the heaps and types as text.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any

VK_STRUCTURE_TYPE_APPLICATION_INFO = 0
VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO = 1
VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2 = 1000059006
VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT = 1000237000
VK_API_VERSION_1_1 = (1 << 22) | (1 << 12)

MEMORY_PROPERTY = {1: "DEVICE_LOCAL", 2: "HOST_VISIBLE", 4: "HOST_COHERENT", 8: "HOST_CACHED", 16: "LAZY",
                   32: "PROTECTED", 64: "DEVICE_COHERENT_AMD", 128: "DEVICE_UNCACHED_AMD"}
HEAP_FLAG = {1: "DEVICE_LOCAL", 2: "MULTI_INSTANCE"}


class AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]


class InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(AppInfo)), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


class MemoryType(ctypes.Structure):
    _fields_ = [("propertyFlags", ctypes.c_uint32), ("heapIndex", ctypes.c_uint32)]


class MemoryHeap(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint64), ("flags", ctypes.c_uint32)]


class MemoryProperties(ctypes.Structure):
    _fields_ = [("memoryTypeCount", ctypes.c_uint32), ("memoryTypes", MemoryType * 32),
                ("memoryHeapCount", ctypes.c_uint32), ("memoryHeaps", MemoryHeap * 16)]


class MemoryProperties2(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("memoryProperties", MemoryProperties)]


class Budget(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("heapBudget", ctypes.c_uint64 * 16),
                ("heapUsage", ctypes.c_uint64 * 16)]


class ExtensionProperties(ctypes.Structure):
    _fields_ = [("extensionName", ctypes.c_char * 256), ("specVersion", ctypes.c_uint32)]


def _flags(value: int, names: dict[int, str]) -> str:
    return "|".join(n for bit, n in names.items() if value & bit) or "0"


class VkMemory:
    """A Vulkan instance of our own for memory queries; every physical device the loader sees."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("vulkan") or "libvulkan.so.1"
        vk = self.vk = ctypes.CDLL(name)
        app = AppInfo(VK_STRUCTURE_TYPE_APPLICATION_INFO, None, b"webtensor-vkmem", 1, b"webtensor", 1,
                      VK_API_VERSION_1_1)
        info = InstanceInfo(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, None, 0, ctypes.pointer(app), 0, None, 0, None)
        self.instance = ctypes.c_void_p()
        rc = vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(self.instance))
        if rc != 0:
            raise RuntimeError(f"vkCreateInstance failed: VkResult {rc}")
        n = ctypes.c_uint32()
        vk.vkEnumeratePhysicalDevices(self.instance, ctypes.byref(n), None)
        devs = (ctypes.c_void_p * n.value)()
        vk.vkEnumeratePhysicalDevices(self.instance, ctypes.byref(n), devs)
        self.devices = list(devs)
        get2 = getattr(vk, "vkGetPhysicalDeviceMemoryProperties2", None)
        self._get2 = get2

    def name(self, dev: Any) -> str:
        buf = ctypes.create_string_buffer(4096)  # VkPhysicalDeviceProperties: deviceName at byte 20
        self.vk.vkGetPhysicalDeviceProperties(ctypes.c_void_p(dev), buf)
        return buf.raw[20:276].split(b"\0", 1)[0].decode()

    def has_budget(self, dev: Any) -> bool:
        n = ctypes.c_uint32()
        self.vk.vkEnumerateDeviceExtensionProperties(ctypes.c_void_p(dev), None, ctypes.byref(n), None)
        exts = (ExtensionProperties * n.value)()
        self.vk.vkEnumerateDeviceExtensionProperties(ctypes.c_void_p(dev), None, ctypes.byref(n), exts)
        return any(e.extensionName == b"VK_EXT_memory_budget" for e in exts)

    def properties(self, dev: Any) -> tuple[MemoryProperties, Budget | None]:
        budget = Budget(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT, None)
        use_budget = self._get2 is not None and self.has_budget(dev)
        props = MemoryProperties2(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
                                  ctypes.cast(ctypes.pointer(budget), ctypes.c_void_p) if use_budget else None)
        if self._get2 is not None:
            self._get2(ctypes.c_void_p(dev), ctypes.byref(props))
        else:
            self.vk.vkGetPhysicalDeviceMemoryProperties(ctypes.c_void_p(dev), ctypes.byref(props.memoryProperties))
        return props.memoryProperties, (budget if use_budget else None)

    def snapshot(self) -> list[tuple[str, list[tuple[int, int, int, int, int]]]]:
        """[(device, [(heap, size, flags, budget, this process's usage)])]; budget and usage are -1
        without VK_EXT_memory_budget."""
        out = []
        for d in self.devices:
            mp, b = self.properties(d)
            heaps = [(i, mp.memoryHeaps[i].size, mp.memoryHeaps[i].flags,
                      b.heapBudget[i] if b else -1, b.heapUsage[i] if b else -1) for i in range(mp.memoryHeapCount)]
            out.append((self.name(d), heaps))
        return out

    def describe(self) -> str:
        lines = []
        for d in self.devices:
            mp, b = self.properties(d)
            lines.append(f"{self.name(d)}: {mp.memoryHeapCount} heaps, {mp.memoryTypeCount} types, "
                         f"memory budget {'yes' if b else 'no'}")
            for i in range(mp.memoryHeapCount):
                h = mp.memoryHeaps[i]
                extra = (f", budget {b.heapBudget[i] / 2**20:,.0f} MiB, used {b.heapUsage[i] / 2**20:,.1f} MiB"
                         if b else "")
                lines.append(f"  heap {i}: {h.size / 2**20:,.0f} MiB {_flags(h.flags, HEAP_FLAG)}{extra}")
            for i in range(mp.memoryTypeCount):
                t = mp.memoryTypes[i]
                lines.append(f"  type {i}: heap {t.heapIndex} {_flags(t.propertyFlags, MEMORY_PROPERTY)}")
        return "\n".join(lines)

    def usage(self, match: str = "") -> list[int]:
        """This process's usage of each heap (bytes) on the first device whose name contains `match`."""
        for name, heaps in self.snapshot():
            if match.lower() in name.lower():
                return [u for *_, u in heaps]
        return []


def device_local_bytes(name: str) -> int | None:
    """The largest device-local heap (bytes) of the Vulkan physical device named `name` (the adapter's name as
    WebGPU reports it), or None where Vulkan cannot say (no loader, no such device)."""
    try:
        vk = VkMemory()
        for dev_name, heaps in vk.snapshot():
            if dev_name == name:
                local = [size for _, size, flags, _, _ in heaps if flags & 1]
                return max(local) if local else None
    except (OSError, RuntimeError, AttributeError):
        return None
    return None


if __name__ == "__main__":
    print(VkMemory().describe())
    sys.exit(0)
