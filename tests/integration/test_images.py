"""The image build's Docker step against the real daemon, without debootstrap: an image whose
recipe tag already exists is only re-tagged, through the Docker backend.

The test works under a repository of its own (never ``harombe/sandbox``), made from the
sandbox image by tag alone, and removes its tags afterwards."""

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harombe.images import builder, recipe_hash

SOURCE = "harombe/sandbox:latest"


def docker(*argv: str) -> str:
    return subprocess.run(["docker", *argv], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A throwaway repository the builder tags into, with its tags removed afterwards."""
    name = f"harombe-test/images-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(builder, "IMAGE_REPO", name)
    yield name
    for tag in (recipe_hash(), "latest"):
        subprocess.run(["docker", "rmi", f"{name}:{tag}"], capture_output=True)


def test_an_image_whose_recipe_tag_exists_is_only_retagged(
    repo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``build()`` finds ``<repo>:<recipe-hash>`` through a DockerManager of its own, tags it
    ``latest`` and builds nothing."""

    def no_rootfs(work: Path, say: object) -> Path:
        raise AssertionError("the root filesystem must not be built when the tag exists")

    monkeypatch.setattr(builder, "build_rootfs", no_rootfs)
    tag = f"{repo}:{recipe_hash()}"
    docker("tag", SOURCE, tag)
    said: list[str] = []
    assert builder.build(say=said.append) == tag
    assert said == [f"image {tag} is up to date (recipe unchanged)"]
    ids = {docker("image", "inspect", "--format", "{{.Id}}", t).strip()
           for t in (tag, f"{repo}:latest", SOURCE)}  # fmt: skip
    assert len(ids) == 1, ids
