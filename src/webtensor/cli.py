"""The `webtensor` command line: `devices`, `generate`, `chat`, `bench`, `serve`, `bench-serve`, `web`."""

from __future__ import annotations

import argparse
import os
import sys

from . import cmdline

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

EPILOG = """exit codes: 0 success, 1 runtime error (checkpoint, adapter, GPU, OS), 2 usage error (bad
argument, environment value or input), 130 interrupted, 141 stdout closed early.
WEBTENSOR_DEBUG=1 shows the traceback of an error."""


def cmd_devices(args: argparse.Namespace) -> int:
    from .backends.wgpu.gpu_api import NativeGpu

    adapters = NativeGpu.enumerate()
    if not adapters:
        from .device import _NO_ADAPTER_HELP

        print(f"WebGPU: {_NO_ADAPTER_HELP}")
    for i, a in enumerate(adapters):
        info, lim = a.info, a.limits
        print(f"[{i}] {info.get('device')}  backend={info.get('backend_type')}  type={info.get('adapter_type')}"
              f"  driver={info.get('description')!r}")
        for k in ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
                  "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup"):
            print(f"      {k:40s} {lim.get(k):>14,}")
        feats = sorted(f for f in a.features if f in ("shader-f16", "subgroup", "timestamp-query", "shader-f64"))
        print(f"      features: {', '.join(feats) or '-'}  ({len(a.features)} in all)")
        dtypes = ["float32", *(["float16"] if "shader-f16" in a.features else []), "int8"]
        print(f"      model dtypes: {', '.join(dtypes)}")
    from .device import Device

    print(f"default device: {Device.default().describe()}")
    return 0


def build_parser() -> cmdline.Parser:
    p = cmdline.Parser(prog=cmdline.PROG, description=__doc__, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    cmdline.add_command(sub, "devices", run=cmd_devices,
                        help="list WebGPU adapters with backend, type, limits and features")
    from . import generate_cli

    generate_cli.add_parsers(sub)
    try:
        from .bench import cli as bench_cli

        bench_cli.add_parser(sub)
    except ImportError:
        pass
    from .serve import cli as serve_cli

    serve_cli.add_parsers(sub)
    try:
        from .web import server as web_server

        web_server.add_parser(sub)
    except ImportError:
        pass
    return p


def main(argv: list[str] | None = None) -> int:
    """The `webtensor` command: the exit code (see `cmdline`), never a traceback."""
    return cmdline.run_main(build_parser, argv)


if __name__ == "__main__":
    sys.exit(main())
