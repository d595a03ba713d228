"""The benchmark harness: figures, baselines, ratios, the printed table and the JSON file."""

from __future__ import annotations

import importlib
import json
import pkgutil
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

Progress = Callable[[str], None]
# key in the results, label, unit, higher is better, target, note
FigureSpec = tuple[str, str, str, bool, str | None, str | None]


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured number, and the baseline it is read against (measured in the same run)."""

    bench: str
    name: str
    value: float
    unit: str
    baseline_name: str | None = None
    baseline_value: float | None = None
    higher_is_better: bool = True
    target: str | None = None
    note: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline_value in (None, 0):
            return None
        assert self.baseline_value is not None
        return self.value / self.baseline_value


def policy_figures(
    bench: str,
    results: Mapping[str, Mapping[str, float]],
    specs: Sequence[FigureSpec],
    ours: str = "Tally",
) -> list[Figure]:
    """The figures of policies measured in the same run: for each spec, `ours`'s value beside
    each other policy's (the baselines, in `results`' order; a baseline is named by its first
    word in the label), the spec's note on the first baseline's figure only."""
    mine = results[ours]
    baselines = [name for name in results if name != ours]
    return [
        Figure(
            bench,
            f"{label} (Tally vs {name.split()[0]})",
            mine[key],
            unit,
            name,
            results[name][key],
            higher_is_better=higher,
            target=target,
            note=note if name == baselines[0] else None,
        )
        for key, label, unit, higher, target, note in specs
        for name in baselines
    ]


def discover() -> list[str]:
    import tests.benchmarks as package

    return sorted(
        m.name for m in pkgutil.iter_modules(package.__path__) if m.name.startswith("bench_")
    )


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.3g}"


def main(argv: list[str]) -> int:
    wanted = [a for a in argv if not a.startswith("-")]
    modules = [m for m in discover() if not wanted or any(w in m for w in wanted)]
    figures: list[Figure] = []
    started = time.monotonic()
    for index, name in enumerate(modules, 1):
        print(f"[{index}/{len(modules)}] {name} …", file=sys.stderr, flush=True)
        module = importlib.import_module(f"tests.benchmarks.{name}")

        def progress(message: str, _name: str = name) -> None:
            print(f"    {_name}: {message}", file=sys.stderr, flush=True)

        figures.extend(module.run(progress))
    print()
    header = f"{'benchmark':<34} {'figure':>14} {'unit':<12} {'baseline':>14}  {'ratio':>7}  target"
    print(header)
    print("-" * len(header))
    for f in figures:
        ratio = f"{f.ratio:.2f}×" if f.ratio else "-"
        print(
            f"{f.bench + ': ' + f.name:<34} {_fmt(f.value):>14} {f.unit:<12} "
            f"{_fmt(f.baseline_value):>14}  {ratio:>7}  "
            f"{f.target or ''}"
        )
        if f.baseline_name:
            print(f"{'':<34} {'':>14} {'':<12} {'(' + f.baseline_name + ')':>14}")
        if f.note:
            print(f"{'':<34} {f.note}")
    out = Path("bench-results")
    out.mkdir(exist_ok=True)
    result = {
        "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
        "seconds": round(time.monotonic() - started, 1),
        "figures": [asdict(f) | {"ratio": f.ratio} for f in figures],
    }
    path = out / f"bench-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    (out / "latest.json").write_text(json.dumps(result, indent=2))
    print(f"\nwritten to {path}")
    return 0
