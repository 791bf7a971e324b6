"""What the HITL gate costs, next to the call it guards, measured in the same run.

    python bench/bench_hitl.py [--runs N]

Prints p50 / p95 of: classifying realistic Python, shell and JavaScript programs with the default
rules; a gate decision with an instant approver; and ``code_execute('print(1)')`` on an existing
sandbox with and without the gate, with the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from pathlib import Path

import structlog

from harombe.security.docker_manager import DockerManager
from harombe.security.hitl import HITLGate, Operation, RiskClassifier
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools

try:  # run as a script (bench/ on sys.path) or as a module
    from bench_core import pct
except ImportError:  # pragma: no cover
    from bench.bench_core import pct

REPO = Path(__file__).resolve().parents[1]


def row(name: str, samples: list[float], unit: str) -> str:
    scale = {"µs": 1e6, "ms": 1e3}[unit]
    p50, p95 = pct(samples, 0.5) * scale, pct(samples, 0.95) * scale
    return f"{name:<52} p50 {p50:9.1f} {unit}   p95 {p95:9.1f} {unit}"


def programs() -> dict[str, tuple[str, str]]:
    """Realistic inputs: this repository's own sources (hundreds of lines each)."""
    return {
        "python (sandbox_manager.py)": (
            "python", (REPO / "harombe/security/sandbox_manager.py").read_text()
        ),
        "shell (scripts/setup.sh)": ("shell", (REPO / "scripts/setup.sh").read_text()),
        "javascript (20 x 20-line module)": ("javascript", "\n".join(
            f"const m{i} = require('fs');\nfunction f{i}(a, b) {{\n  const r = /x+/g;\n"
            f"  return `${{a}}-${{b}}`.replace(r, 'y') + JSON.stringify({{a, b}});\n}}\n"
            f"console.log(f{i}(1, 2));\n" * 3 for i in range(20)
        )),
    }  # fmt: skip


async def main(runs: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    classifier = RiskClassifier()
    for name, (language, code) in programs().items():
        op = Operation("code_execute", {"language": language, "code": code})
        samples = []
        for _ in range(runs * 5):
            t = time.perf_counter()
            classifier.assess(op)
            samples.append(time.perf_counter() - t)
        lines = code.count("\n") + 1
        print(row(f"classify {name}, {lines} lines", samples, "µs"))

    async def yes(request: object) -> bool:
        return True

    gate = HITLGate(classifier, approver=yes)
    op = Operation("code_execute", {"language": "python", "code": "print(1)"})
    decisions = []
    for _ in range(runs * 5):
        t = time.perf_counter()
        await gate.check_approval(op)
        decisions.append(time.perf_counter() - t)
    print(row("gate decision, print(1), instant async approver", decisions, "µs"))

    docker_manager = DockerManager()
    await docker_manager.start()
    manager = SandboxManager(docker_manager)
    await manager.start()
    plain, gated = (
        CodeExecutionTools(manager, hitl_gate=None),
        CodeExecutionTools(manager, hitl_gate=gate),
    )
    try:
        sid = (await plain.code_execute(language="python", code="pass"))["sandbox_id"]
        without, with_gate = [], []
        for _ in range(runs):
            for tools, samples in ((plain, without), (gated, with_gate)):
                t = time.perf_counter()
                result = await tools.code_execute(
                    language="python", code="print(1)", sandbox_id=sid
                )
                samples.append(time.perf_counter() - t)
                assert result["success"], result
        print(row("code_execute print(1), no gate", without, "ms"))
        print(row("code_execute print(1), gate + instant approver", with_gate, "ms"))
        print(f"ratio gated / ungated p50: {pct(with_gate, 0.5) / pct(without, 0.5):.3f}")
    finally:
        await manager.stop()
        await docker_manager.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    asyncio.run(main(parser.parse_args().runs))
