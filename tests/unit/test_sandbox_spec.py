"""Container spec, ids, framing and result decoding: pure pieces of the sandbox core."""

import json
import os
import socket
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests.exceptions

from harombe.config import SandboxConfig
from harombe.errors import (
    DockerUnavailableError,
    ImageNotFoundError,
    SandboxLostError,
    SandboxNotFoundError,
)
from harombe.images import debian_mirror
from harombe.security.docker_manager import translate
from harombe.security.guest import FILE_PARTS, load
from harombe.security.runtime.channel import FrameDecoder, encode
from harombe.security.runtime.results import _decode
from harombe.security.runtime.sandbox import (
    RUN_ENV,
    argv_for,
    check_sandbox_id,
    container_spec,
    new_sandbox_id,
    owner_is_gone,
)


def _spec(**limits: object) -> dict:
    config = SandboxConfig.model_validate({"limits": limits})
    return container_spec(
        "sandbox-0123456789ab",
        image="img",
        config=config,
        owner="h:1:2",
        manager_id="m",
        language="python",
    )


def test_spec_carries_every_isolation_default() -> None:
    """runsc, no network, read-only root, three caps for the supervisor only, user code as 1000."""
    spec = _spec(max_memory_mb=512, max_cpu_cores=0.5, max_disk_mb=1024, max_pids=64)
    assert spec["runtime"] == "runsc"
    assert spec["network_mode"] == "none"
    assert spec["read_only"] is True
    assert spec["cap_drop"] == ["ALL"]
    assert sorted(spec["cap_add"]) == ["KILL", "SETGID", "SETUID"]
    assert spec["security_opt"] == ["no-new-privileges:true"]
    assert spec["user"] == "0:0" and spec["environment"]["HAROMBE_RUN_AS"] == "1000:1000"
    assert spec["nano_cpus"] == 500_000_000  # the fallback; normally set after boot:
    late = container_spec(
        "sandbox-0123456789ab",
        image="img",
        config=SandboxConfig(),
        owner="h:1:2",
        manager_id="m",
        language="python",
        cpu_at_create=False,
    )
    assert "nano_cpus" not in late
    assert spec["pids_limit"] > 64  # host side: gVisor's own threads count there too
    assert spec["mem_limit"] == spec["memswap_limit"]  # no swap
    assert spec["tmpfs"]["/workspace"].startswith("size=1024m,")
    assert "volumes" not in spec and "mounts" not in spec  # no host mounts
    # Only what the supervisor needs, never the host's environment; the user environment is
    # harombe's own RUN_ENV.
    env = spec["environment"]
    assert env["HAROMBE_RUN_AS"] == "1000:1000" and env["HAROMBE_RUNTIME"] == "runsc"
    assert env["HAROMBE_PREWARM"] == "python" and env["HAROMBE_MAX_PIDS"] == "64"
    assert json.loads(env["HAROMBE_USER_ENV"]) == RUN_ENV
    assert set(env) == {"LANG", "HAROMBE_RUN_AS", "HAROMBE_RUNTIME", "HAROMBE_PREWARM",
                        "HAROMBE_USER_ENV", "HAROMBE_MAX_PIDS"}  # fmt: skip
    assert spec["labels"]["harombe.managed"] == "1"
    assert spec["labels"]["harombe.sandbox"] == "sandbox-0123456789ab"
    assert spec["log_config"]["type"] == "none"


def test_ids_are_well_formed_and_crafted_ids_are_refused() -> None:
    """New ids pass the check; anything else raises SandboxNotFoundError."""
    assert check_sandbox_id(new_sandbox_id())
    for bad in [
        "",
        "sandbox-XYZ",
        "../../etc",
        "sandbox-0123456789ab; rm",
        None,
        42,
        "harombe-sandbox-0123456789ab",
        "sandbox-0123456789abc",
    ]:
        with pytest.raises(SandboxNotFoundError, match="not a harombe sandbox id"):
            check_sandbox_id(bad)


@pytest.mark.parametrize(
    ("language", "argv0", "stdin"),
    [
        ("python", "python3", b"print(1)"),
        ("javascript", "node", b"print(1)"),
        ("shell", "bash", b""),
    ],
    ids=["python", "javascript", "shell"],
)
def test_argv_per_language(language: str, argv0: str, stdin: bytes) -> None:
    """Python and Node read code from stdin; bash gets it as -c."""
    argv, data = argv_for(language, "print(1)")  # type: ignore[arg-type]
    assert argv[0] == argv0 and data == stdin


def test_frames_round_trip_in_pieces() -> None:
    """Frames split at any byte boundary decode to the same messages and blobs."""
    stream = encode({"op": "a", "id": 1}, b"\x00blob") + encode({"op": "b", "id": 2})
    decoder = FrameDecoder()
    got = []
    for i in range(len(stream)):
        got += decoder.feed(stream[i : i + 1])
    assert got == [({"op": "a", "id": 1}, b"\x00blob"), ({"op": "b", "id": 2}, b"")]


def test_truncated_output_is_marked_and_never_splits_a_character() -> None:
    """A multi-byte character cut by the byte cap is dropped, and the marker is added."""
    data = "héllo".encode()[:2]  # 'h' + first byte of 'é'
    text, cut = _decode(data, total=10)
    assert (text, cut) == ("h\n[OUTPUT TRUNCATED]", True)
    assert _decode("héllo".encode(), total=6) == ("héllo", False)


def test_owner_of_a_dead_process_is_gone() -> None:
    """Containers of this live process are kept; those of a dead pid, or reused pid, are not."""
    host = socket.gethostname()
    with open(f"/proc/{os.getpid()}/stat") as f:
        started = f.read().rsplit(")", 1)[1].split()[19]
    assert not owner_is_gone(f"{host}:{os.getpid()}:{started}", hostname=host)
    assert owner_is_gone(f"{host}:{os.getpid()}:0", hostname=host)  # pid reused
    assert owner_is_gone(f"{host}:999999999:1", hostname=host)
    assert not owner_is_gone("otherhost:1:1", hostname=host)
    assert not owner_is_gone("garbage", hostname=host)


@pytest.mark.parametrize(
    ("exc", "subject", "kind", "needle"),
    [
        (docker.errors.ImageNotFound("no such image"), "daemon", ImageNotFoundError,
         "images build"),
        (docker.errors.NotFound("No such image"), "image", ImageNotFoundError, "images build"),
        (docker.errors.NotFound("No such container"), "container", SandboxLostError, "gone"),
        (docker.errors.NotFound("No such network"), "network", SandboxLostError, "network"),
        (docker.errors.APIError("conflict"), "container", DockerUnavailableError, "failed"),
        (requests.exceptions.ConnectionError("refused"), "daemon", DockerUnavailableError,
         "setup.sh"),
        (requests.exceptions.ReadTimeout("slow"), "daemon", DockerUnavailableError, "in time"),
        (FileNotFoundError("/var/run/docker.sock"), "daemon", DockerUnavailableError,
         "DOCKER_HOST"),
        (docker.errors.DockerException("boom"), "daemon", DockerUnavailableError, "failed"),
        (EOFError(), "daemon", DockerUnavailableError, "socket error"),
    ],
    ids=["image-type", "image-subject", "container-gone", "network-gone", "api-error",
         "connection", "timeout", "no-socket", "other", "eof"],
)  # fmt: skip
def test_docker_errors_map_to_harombe_errors(
    exc: Exception, subject: Any, kind: type, needle: str
) -> None:
    """Each Docker failure becomes, by its type and what the call was about, the harombe error
    that says how to fix it — whatever its message text says."""
    mapped = translate(exc, what="testing", subject=subject)
    assert isinstance(mapped, kind)
    assert needle in str(mapped)


def test_unknown_errors_are_not_swallowed() -> None:
    """A bug (not a Docker error) propagates unchanged."""
    with pytest.raises(ZeroDivisionError):
        translate(ZeroDivisionError())


def test_supervisor_walk_refuses_symlinks_and_escapes(tmp_path: Path) -> None:
    """The in-sandbox walk reads plain paths and refuses symlinks (inside or out) and escapes
    (more in tests/unit/test_files.py)."""
    root = tmp_path / "ws"
    (root / "inner").mkdir(parents=True)
    (root / "inner" / "x").write_text("x")
    (root / "out").symlink_to("/etc")
    (root / "in").symlink_to(root / "inner")
    (root / "rel").symlink_to("../")
    supervisor_files = load(FILE_PARTS)
    read = supervisor_files.FILE_OPS["read"]
    assert read({"root": str(root), "path": "inner/x", "max_bytes": 9}, b"")[1] == b"x"
    for bad in ("in/x", "out/passwd", "rel/x", "/etc/passwd", "a\x00"):
        with pytest.raises(supervisor_files.Refused):
            read({"root": str(root), "path": bad, "max_bytes": 9}, b"")


def test_debian_mirror_comes_from_apt_sources(tmp_path: Path) -> None:
    """The mirror is read from deb822 or one-line sources; the environment wins."""
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "x.sources").write_text(
        "Types: deb\nURIs: http://mirror.invalid/debian\nSuites: bookworm\n"
    )
    assert debian_mirror({}, tmp_path) == "http://mirror.invalid/debian"
    assert (
        debian_mirror({"HAROMBE_DEBIAN_MIRROR": "http://m/debian"}, tmp_path) == "http://m/debian"
    )


def test_the_supervisor_argument_fits_linuxs_limit_and_unpacks_to_the_source() -> None:
    """``python3 -c``'s argument stays under Linux's 128 KiB per argument (runc refuses more)
    and runs exactly the joined supervisor source."""
    import base64
    import re as _re
    import zlib

    from harombe.security.guest import SUPERVISOR_SOURCE
    from harombe.security.runtime.sandbox import MAX_ARG_BYTES, SUPERVISOR_BOOT

    assert len(SUPERVISOR_BOOT.encode()) < MAX_ARG_BYTES
    packed = _re.search(r"a2b_base64\('([^']*)'\)", SUPERVISOR_BOOT)
    assert packed is not None
    assert zlib.decompress(base64.b64decode(packed.group(1))).decode() == SUPERVISOR_SOURCE
