"""Host memory and time of loading a model: what `webtensor.load_model` holds at its peak beyond the runtime.

    python tools/load_memory.py MODEL [--device cpu|lavapipe|wgpu|wgpu:N] [--dtype auto|...] [--json OUT]

One fresh process per call (run it once per device). It opens the device and imports everything first (the
runtime: its resident memory is the baseline), resets the kernel's peak-RSS mark (/proc/self/clear_refs), loads the
model, and reports the peak resident set during the load (VmHWM) beside the baseline, the largest tensor of the file
and the weights the device holds. The bound the loader keeps (issue 30, item 4):

    peak <= runtime + host weights + 1.2 x largest tensor, i.e. peak - after <= 1.2 x largest tensor

where "after" is the resident set once the load returned: the runtime (interpreter, libraries, device, tokenizer)
and the weights wherever they live in host memory (the CPU device's, lavapipe's buffers; on the CPU device quantized
weights stay views of the file's map, resident as they are read, as llama.cpp's on the CPU; nothing on a GPU with its
own memory): what a load holds only while it runs stays under 1.2 x the largest tensor. A file mapped whole and never
released, or uploads staged whole, would show as a transient near the file's size. Linux only (/proc). Prints one
line; --json writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def status() -> dict[str, int]:
    """/proc/self/status memory fields in bytes (VmRSS, VmHWM, RssAnon, RssFile, ...)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key.startswith(("Vm", "Rss")) and rest.strip().endswith("kB"):
            out[key] = int(rest.split()[0]) * 1024
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    import webtensor as wt
    from webtensor.models import loader

    dev = wt.Device.parse(a.device)
    (wt.tensor([1.0], device=dev) + 1).numpy()  # the device open and working: part of the runtime
    ck = loader.open_checkpoint(a.model)  # (imports the readers; the tensors are not read)
    largest = max(loader.stored_nbytes(ck.stored_type(n), ck.shape(n)) for n in ck.names)
    file_bytes = sum(loader.stored_nbytes(ck.stored_type(n), ck.shape(n)) for n in ck.names)
    del ck
    base = status()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    t0 = time.perf_counter()
    model = wt.load_model(a.model, device=dev, dtype=None if a.dtype == "auto" else a.dtype, progress=False)
    seconds = time.perf_counter() - t0
    after = status()
    ctx = getattr(dev, "ctx", None)
    held = ctx.bytes_in_use if ctx is not None else model.weight_bytes
    transient = after["VmHWM"] - after["VmRSS"]
    fig = {"model": a.model, "device": dev.describe(), "file_tensor_bytes": file_bytes, "largest_tensor": largest,
           "weights_on_device": held, "baseline_rss": base["VmRSS"], "peak_rss": after["VmHWM"],
           "rss_after": after["VmRSS"], "rss_anon_after": after.get("RssAnon", 0),
           "rss_file_after": after.get("RssFile", 0), "transient": transient,
           "transient_over_largest": transient / largest, "within_bound": transient <= 1.2 * largest,
           "load_seconds": seconds}
    mb = 1 << 20
    print(f"{Path(a.model).name} on {dev.describe()}: load {seconds:.2f} s, weights {held / mb:,.0f} MiB; peak RSS "
          f"{after['VmHWM'] / mb:,.0f} MiB = after the load {after['VmRSS'] / mb:,.0f} "
          f"(before {base['VmRSS'] / mb:,.0f}; "
          f"anonymous {fig['rss_anon_after'] / mb:,.0f}, file maps {fig['rss_file_after'] / mb:,.0f}) + transient "
          f"{transient / mb:,.0f} MiB = {transient / largest:.2f} x the largest tensor ({largest / mb:,.0f} MiB): "
          f"{'within' if fig['within_bound'] else 'OVER'} 1.2x")
    if a.json:
        Path(a.json).write_text(json.dumps(fig, indent=1))
    return 0 if fig["within_bound"] else 1


if __name__ == "__main__":
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    sys.exit(main())
