"""The performance page (docs/performance.md) from the benchmarks' latest results
(``benchmarks/results/*.json``, :mod:`_report`): one table per benchmark, each row with its
target, its latest value and that value's spread over the run's repeats, under the machine,
versions and revision it was measured with.

    python benchmarks/render.py            # writes docs/performance.md
    python benchmarks/render.py --check    # exit 1 if docs/performance.md is not what it writes
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "performance.md"

HEAD = """# Performance

The gradients are the cost; the simulator around them should be nearly free. Each speed
target is a ratio measured side by side in one run of a script in `benchmarks/` (so that the
machine's load moves both sides), never a timed test. This page is generated from the
scripts' latest results (`benchmarks/results/*.json`) by `python benchmarks/render.py`; their
history is git's. A value's spread is the median and the range of its repeats, where the
script repeats it; a row without a target is context for the rows that have one.
[Development](development.md) says how to run them.

The speed paths are chosen among bit-identical ones only (the loop replay, the online run,
a real run's replay): a faster path that agrees only to a tolerance (the scan and vmapped
replays, the batched path for GPUs) is an opt-in recorded in the run folder
([reproducibility](reproducibility.md)).
"""

_FORMATS = {"ratio": "{:.3g}", "s": "{:.3g} s", "1/s": "{:,.0f}/s", "h": "{:.3g} h",
            "distance": "{:.3g}", "": "{:,.4g}"}


def _value(v: float, unit: str) -> str:
    return _FORMATS.get(unit, "{:.4g} " + unit).format(v)


def _spread(row: dict) -> str:
    s = row.get("spread")
    if not s:
        return "–"
    unit = row["unit"]
    return (f"{_value(s['median'], unit)} [{_value(s['min'], unit)} – "
            f"{_value(s['max'], unit)}], {s['n']} runs")


def _met(row: dict) -> str:
    target = row.get("target")
    if not target:
        return ""
    op, bound = target.split()
    ok = {"<=": row["value"] <= float(bound), "<": row["value"] < float(bound),
          ">=": row["value"] >= float(bound), ">": row["value"] > float(bound)}[op]
    return "met" if ok else "**missed**"


def _machine(rec: dict) -> str:
    m, v, g = rec["machine"], rec["versions"], rec["git"]
    cpu = f"{m.get('cpu_model')} ({m.get('cpu_id')}; {', '.join(m.get('cpu_flags') or [])})"
    rev = (g.get("revision") or "?")[:10] + (" with local changes" if g.get("dirty") else "")
    return (f"{m.get('cores')} cores, {cpu}; XLA threads {m.get('xla_threads')}; jax "
            f"{v.get('jax')}, numpy {v.get('numpy')}, asyncsim {v.get('asyncsim')} at {rev}; "
            f"`{rec['command']}`")


def _section(path: Path, script: str) -> str:
    rec = json.loads(path.read_text())
    # bench_gpu's results are named by their backend (bench_gpu_cuda.json): say which
    head = [f"### `{path.stem}`\n"] if path.stem != script else []
    lines = [*head, f"{rec['what']}. Measured on {_machine(rec)}.\n",
             "| row | target | latest | spread | |", "|---|---|---|---|---|"]
    for row in rec["rows"]:
        note = f" ({row['note']})" if row.get("note") else ""
        lines.append(f"| {row['row']}{note} | {row.get('target') or ''} | "
                     f"{_value(row['value'], row['unit'])} | {_spread(row)} | "
                     f"{_met(row)} |")
    return "\n".join(lines) + "\n"


def _owner(result: str, scripts: list[str]) -> str | None:
    """The script a result file is of: its name, or the longest script name it extends."""
    mine = [s for s in scripts if result == s or result.startswith(f"{s}_")]
    return max(mine, key=len, default=None)


def render() -> str:
    """One section per benchmark script, whether or not it has a result, so that each
    script's anchor (``performance.md#bench_edges``) always exists."""
    parts = [HEAD]
    scripts = sorted(p.stem for p in (ROOT / "benchmarks").glob("bench_*.py"))
    results = sorted(RESULTS.glob("*.json"))
    for script in scripts:
        parts.append(f"## `{script}`\n")
        mine = [p for p in results if _owner(p.stem, scripts) == script]
        parts += [_section(p, script) for p in mine]
        if not mine:
            why = (" It keeps its results only on a GPU, where they mean something; "
                   "`bench_gpu.py --tiny` checks its code on a CPU."
                   if script == "bench_gpu" else "")
            parts.append(f"No result yet: `python benchmarks/{script}.py` writes one.{why}\n")
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    text = render()
    if a.check:
        if PAGE.read_text() != text:
            print("docs/performance.md is stale: python benchmarks/render.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(PAGE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
