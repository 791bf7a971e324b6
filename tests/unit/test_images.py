"""The image build's steps against a recording stand-in for the Docker backend: no Docker,
no debootstrap."""

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from harombe.errors import BuildError, DockerUnavailableError, InfrastructureError
from harombe.images import IMAGE_REPO, builder, image_tag, main, recipe, recipe_hash


class RecordingDocker:
    """The image calls of the Docker backend, in memory; every call is recorded."""

    def __init__(self, images: Sequence[str] = ()) -> None:
        self.images = set(images)
        self.calls: list[tuple[object, ...]] = []

    async def image_exists(self, name: str) -> bool:
        self.calls.append(("exists", name))
        return name in self.images

    async def tag_image(self, image: str, repository: str, tag: str) -> None:
        self.calls.append(("tag", image, repository, tag))
        self.images.add(f"{repository}:{tag}")

    async def import_image(
        self, archive: Path, *, repository: str, tag: str, changes: Sequence[str] = ()
    ) -> str:
        self.calls.append(("import", archive, repository, tag, list(changes)))
        self.images.add(f"{repository}:{tag}")
        return "sha256:0"


def test_an_existing_recipe_image_is_only_retagged() -> None:
    fake = RecordingDocker([image_tag()])
    said: list[str] = []
    assert builder.build(say=said.append, docker=fake) == image_tag()  # type: ignore[arg-type]
    assert fake.calls == [("exists", image_tag()), ("tag", image_tag(), IMAGE_REPO, "latest")]


def test_a_build_imports_the_packed_rootfs_with_the_recipe_label(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A forced build imports the tarball the recipe steps made, labelled with the recipe
    hash, tags it ``latest`` and removes its work directory."""
    works: list[Path] = []

    def rootfs(work: Path, say: object) -> Path:
        works.append(work)
        (work / "rootfs.tar").write_bytes(b"rootfs")
        return work / "rootfs.tar"

    monkeypatch.setattr(builder, "build_rootfs", rootfs)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("HAROMBE_BUILD_DIR", str(tmp_path))
    fake = RecordingDocker([image_tag()])
    assert builder.build(force=True, say=lambda _: None, docker=fake) == image_tag()  # type: ignore[arg-type]
    (_, archive, repository, tag, changes) = fake.calls[0]
    assert (archive, repository, tag) == (works[0] / "rootfs.tar", IMAGE_REPO, recipe_hash())
    assert isinstance(changes, list)
    assert f"LABEL harombe.recipe={recipe_hash()}" in changes and "USER 1000:1000" in changes
    assert fake.calls[1] == ("tag", image_tag(), IMAGE_REPO, "latest")
    assert works and not works[0].exists()


def test_building_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(BuildError, match="needs root"):
        builder.build(say=lambda _: None, docker=RecordingDocker())  # type: ignore[arg-type]
    assert issubclass(BuildError, InfrastructureError)


def test_the_recipe_hash_follows_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another package list is another image tag."""
    before = recipe_hash()
    packages = [*recipe.RECIPE["packages"], "curl"]  # type: ignore[misc]
    monkeypatch.setitem(recipe.RECIPE, "packages", packages)
    assert recipe_hash() != before


def test_main_reports_docker_failures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(**kwargs: object) -> str:
        raise DockerUnavailableError("Docker is not answering; start it")

    monkeypatch.setattr(builder, "build", broken)
    assert main([]) == 1
    assert "image build failed: Docker is not answering" in capsys.readouterr().err
