"""Print `webtensor bench` JSON reports as one markdown table: a row per engine of each report (model, dtype, device,
prefill tok/s at each length, decode tok/s, and webtensor's min-max over fresh processes where the report has
them), then webtensor's ratios over each anchor.

    python tools/bench_table.py REPORT.json [REPORT.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def rows(path: Path) -> list[list[str]]:
    rep: dict[str, Any] = json.loads(path.read_text())
    lengths = sorted({k for r in rep["results"] for k in r["prefill_tok_s"]}, key=int)
    out = []
    for r in rep["results"]:
        sp = rep.get("spread", {}).get(r["engine"], {})

        def fig(v: float | None, key: str, sp: dict = sp) -> str:
            if v is None:
                return "-"
            lo_hi = sp.get(key)
            return f"{v:,.0f}" + (f" ({lo_hi[0]:,.0f}-{lo_hi[2]:,.0f})" if lo_hi else "")

        prefill = [fig(r["prefill_tok_s"].get(k), f"prefill_tok_s/{k}") for k in lengths]
        out.append([path.stem, rep.get("dtype", ""), r["engine"], r["device"][:48],
                    " / ".join(f"{k}: {p}" for k, p in zip(lengths, prefill, strict=True)),
                    fig(r["decode_tok_s"], "decode_tok_s")])
    return out


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths:
        raise SystemExit(__doc__)
    head = ["report", "dtype", "engine", "device", "prefill tok/s (length: figure)", "decode tok/s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for p in paths:
        for row in rows(p):
            print("| " + " | ".join(row) + " |")
    print()
    for p in paths:
        rep = json.loads(p.read_text())
        for key in sorted(k for k in rep if k.startswith("ratios_webtensor_over_")):
            anchor = key.removeprefix("ratios_webtensor_over_")
            print(f"{p.stem}: webtensor / {anchor}: " + ", ".join(f"{k.removesuffix('_tok_s')} {v:.2f}x"
                                                                 for k, v in rep[key].items()))


if __name__ == "__main__":
    main()
