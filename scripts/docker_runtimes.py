"""Add harombe's gVisor runtimes to /etc/docker/daemon.json, keeping everything else there.

``runsc`` runs with ``--network=none`` (gVisor's own netstack; sandboxes are offline).
``runsc-net`` runs with ``--network=host``: gVisor then uses the container's own network
namespace, which harombe attaches only to networks it controls. Prints ``updated`` or
``unchanged``.
"""

import json
import sys
from pathlib import Path

PATH = Path("/etc/docker/daemon.json")


def main() -> None:
    runsc = sys.argv[1] if len(sys.argv) > 1 else "/usr/bin/runsc"
    config = json.loads(PATH.read_text()) if PATH.exists() and PATH.read_text().strip() else {}
    wanted = {
        "runsc": {"path": runsc, "runtimeArgs": ["--network=none"]},
        "runsc-net": {"path": runsc, "runtimeArgs": ["--network=host"]},
    }
    runtimes = config.setdefault("runtimes", {})
    if all(runtimes.get(k) == v for k, v in wanted.items()):
        print("unchanged")
        return
    runtimes.update(wanted)
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(json.dumps(config, indent=2) + "\n")
    print("updated")


if __name__ == "__main__":
    main()
