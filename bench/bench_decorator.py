"""What a ``@sandbox`` call costs, end to end, from plain synchronous code.

    python bench/bench_decorator.py [--runs N]

Prints p50 / p95 of a trivial decorated function (``lambda x: x + 1``) in two conditions: warm
(the prepared sandboxes refilled before each call, the steady state of an occasional caller)
and back to back (calls as fast as they return, so the ready sandboxes and the warm pool run
out and some calls start a sandbox), and the ratio of the two p50s.
"""

from __future__ import annotations

import argparse
import logging
import time

import structlog

from harombe import decorator

try:  # run as a script (bench/ on sys.path) or as a module
    from bench_core import pct
except ImportError:  # pragma: no cover
    from bench.bench_core import pct


def settle() -> None:
    runner = decorator.runner()
    runner.call(runner.settled())


def measure(runs: int, *, warm: bool) -> list[float]:
    add_one = decorator.sandbox()(lambda x: x + 1)
    samples = []
    for i in range(runs):
        if warm:
            settle()
        started = time.perf_counter()
        assert add_one(i) == i + 1
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    for _ in range(2):  # start Docker and the manager; a second call starts the pools
        decorator.sandbox()(lambda: None)()
    results = {"warm": measure(runs, warm=True), "back to back": measure(runs, warm=False)}
    for name, samples in results.items():
        p50, p95 = pct(samples, 0.5) * 1e3, pct(samples, 0.95) * 1e3
        print(f"@sandbox call, {name:<13} ({runs} calls)  p50 {p50:8.1f} ms   p95 {p95:8.1f} ms")
    ratio = pct(results["back to back"], 0.5) / pct(results["warm"], 0.5)
    print(f"back to back / warm p50: {ratio:.1f}x")
    decorator.shutdown()


if __name__ == "__main__":
    main()
