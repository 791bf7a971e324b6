"""The image build's entry point and its one Docker step, through the Docker backend.

:func:`build` is synchronous (``python -m harombe images build``): it runs the backend's async
calls with ``asyncio.run`` around a started
:class:`~harombe.security.runtime.docker.DockerManager`, and the root filesystem steps of
:mod:`harombe.images.recipe` on a worker thread. Nothing here runs the docker CLI, and nothing
here is part of the recipe hash: how the image reaches Docker does not change what is in it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

from harombe.errors import BuildError, InfrastructureError
from harombe.images.recipe import IMAGE_REPO, Say, build_rootfs, image_changes, recipe_hash
from harombe.security.runtime.backend import DockerBackend
from harombe.security.runtime.docker import DockerManager

LATEST = "latest"


def build(*, force: bool = False, say: Say = print, docker: DockerBackend | None = None) -> str:
    """Build (or reuse) the sandbox image and tag it ``latest`` too; returns its hash tag.

    When ``harombe/sandbox:<recipe-hash>`` already exists (and not ``force``) it is only
    re-tagged. Otherwise needs root, debootstrap, cc and npm. ``docker`` is a started backend
    to use instead of a new DockerManager (left running). Raises BuildError, or the backend's
    InfrastructureError when Docker fails."""
    return asyncio.run(_build(force=force, say=say, docker=docker))


async def _build(*, force: bool, say: Say, docker: DockerBackend | None) -> str:
    if docker is not None:
        return await _build_with(docker, force=force, say=say)
    manager = DockerManager()
    await manager.start()
    try:
        return await _build_with(manager, force=force, say=say)
    finally:
        await manager.stop()


async def _build_with(docker: DockerBackend, *, force: bool, say: Say) -> str:
    digest = recipe_hash()
    tag = f"{IMAGE_REPO}:{digest}"
    latest = f"{IMAGE_REPO}:{LATEST}"
    if not force and await docker.image_exists(tag):
        await docker.tag_image(tag, IMAGE_REPO, LATEST)
        say(f"image {tag} is up to date (recipe unchanged)")
        return tag
    if os.geteuid() != 0:
        raise BuildError("building the sandbox image needs root (debootstrap); run it with sudo")
    work = Path(os.environ.get("HAROMBE_BUILD_DIR", "/var/tmp")) / f"harombe-build-{digest}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        tarball = await asyncio.to_thread(build_rootfs, work, say)
        say(f"[4/4] importing into Docker as {tag}")
        await docker.import_image(
            tarball, repository=IMAGE_REPO, tag=digest, changes=image_changes()
        )
        await docker.tag_image(tag, IMAGE_REPO, LATEST)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"built {tag} (also tagged {latest})")
    return tag


def main(argv: list[str]) -> int:
    """``python -m harombe images build [--force]``: 0 when the image is ready, else 1."""
    try:
        build(force="--force" in argv)
    except InfrastructureError as exc:  # BuildError, or Docker itself failing
        print(f"harombe: image build failed: {exc}", file=sys.stderr)
        return 1
    return 0
