"""Isolation defaults, checked on the real container and from inside it."""

import os

import pytest

from harombe.config import load_config
from harombe.errors import InsecureRuntimeError, RuntimeNotAvailableError
from harombe.security.docker_manager import DockerManager
from harombe.security.runtime.cgroups import CpuQuota
from harombe.security.sandbox_manager import SandboxManager
from harombe.tools.code_execution import CodeExecutionTools


async def test_container_is_configured_with_every_default(
    sandbox_manager: SandboxManager, sandbox_id: str
) -> None:
    """Docker reports runsc, no network, read-only root, tmpfs workspace, limits, no caps,
    and no host path but the read-only environments."""
    box = sandbox_manager.get(sandbox_id)
    client = sandbox_manager.docker._client
    assert client is not None
    attrs = client.api.inspect_container(box.container_id)
    host = attrs["HostConfig"]
    limits = sandbox_manager.limits
    assert host["Runtime"] == "runsc"
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert host["Memory"] == host["MemorySwap"] > 0
    # The CPU quota is set on the sandbox's cgroup once it has booted, before any code runs.
    assert not host["NanoCpus"]
    assert await CpuQuota(sandbox_manager.docker).limit(box.container_id) == limits.max_cpu_cores
    assert host["Tmpfs"]["/workspace"].startswith(f"size={limits.max_disk_mb}m")
    # One host path only: the install cache's environments, read-only (docs/dependencies.md).
    store = sandbox_manager.installs.store
    assert store is not None
    assert host.get("Binds") == [f"{store.envs}:/opt/harombe/envs:ro"]
    assert [(m["Destination"], m["RW"]) for m in attrs["Mounts"]] == [("/opt/harombe/envs", False)]
    assert attrs["Config"]["User"] == "0:0"  # the supervisor; user code runs as 1000
    assert "HAROMBE_RUN_AS=1000:1000" in attrs["Config"]["Env"]
    assert sorted(host["CapAdd"]) == ["KILL", "SETGID", "SETUID"]
    assert attrs["Config"]["Labels"]["harombe.sandbox"] == sandbox_id


async def test_code_sees_no_privilege(tools: CodeExecutionTools, sandbox_id: str) -> None:
    """Non-root, no capabilities, no-new-privileges, read-only root from inside."""
    code = (
        "id -u\ngrep -E '^(CapEff|CapPrm)' /proc/self/status | tr -s '\\t ' ' '\n"
        "python3 -c 'import ctypes; "
        'print("NoNewPrivs:", ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))\'\n'
        "touch /usr/x 2>/dev/null || echo ro-root\ntouch /workspace/x && echo ws-writable"
    )
    result = await tools.code_execute(language="shell", code=code, sandbox_id=sandbox_id)
    lines = result["stdout"].splitlines()
    assert lines[0] == "1000"
    assert "CapPrm: 0000000000000000" in lines and "CapEff: 0000000000000000" in lines
    assert "NoNewPrivs: 1" in lines
    assert lines[-2:] == ["ro-root", "ws-writable"]


async def test_no_network_at_all(tools: CodeExecutionTools, sandbox_id: str) -> None:
    """No interface but loopback; connecting out or resolving names fails."""
    code = (
        "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))\n"
        "for target in [('10.0.0.1', 80), ('172.17.0.1', 2375)]:\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        "    try:\n        s.connect(target); print('CONNECTED')\n"
        "    except OSError as e:\n        print('refused')\n"
        "try:\n    socket.getaddrinfo('example.com', 80); print('RESOLVED')\n"
        "except OSError:\n    print('no-dns')"
    )
    result = await tools.code_execute(language="python", code=code, sandbox_id=sandbox_id)
    assert result["stdout"].splitlines() == ["['lo']", "refused", "refused", "no-dns"]


async def test_host_environment_never_reaches_the_sandbox(
    tools: CodeExecutionTools, sandbox_id: str
) -> None:
    """A secret in the host process's environment is absent inside."""
    os.environ["HAROMBE_TEST_SECRET"] = "s3cr3t-value"
    try:
        result = await tools.code_execute(
            language="shell",
            sandbox_id=sandbox_id,
            code="env; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'",
        )
    finally:
        del os.environ["HAROMBE_TEST_SECRET"]
    assert "s3cr3t" not in result["stdout"]
    assert "HOME=/home/sandbox" in result["stdout"]


async def test_no_docker_socket_or_host_files(tools: CodeExecutionTools, sandbox_id: str) -> None:
    """The Docker socket and the host's files are not visible."""
    paths = "/var/run/docker.sock /run/docker.sock /work /etc/docker"
    code = f"for p in {paths}; do test -e $p && echo $p; done; true"
    result = await tools.code_execute(language="shell", code=code, sandbox_id=sandbox_id)
    assert result["success"] and result["stdout"] == ""


async def test_unregistered_runtime_refuses_to_start(docker_manager: DockerManager) -> None:
    """A runtime Docker does not know is refused with the fix in the message."""
    manager = SandboxManager(docker_manager, runtime="runsc-missing", allow_insecure_runtime=True)
    with pytest.raises(RuntimeNotAvailableError, match="not registered with Docker"):
        await manager.start()


async def test_non_gvisor_runtime_needs_explicit_opt_in(docker_manager: DockerManager) -> None:
    """runc is refused unless allow_insecure_runtime is set."""
    with pytest.raises(InsecureRuntimeError, match="allow_insecure_runtime"):
        await SandboxManager(docker_manager, runtime="runc").start()


async def test_opted_in_runtime_is_named_in_every_result(docker_manager: DockerManager) -> None:
    """With an explicit opt-in to runc, results say runc ran the code."""
    config = load_config(environ={"HAROMBE__SECURITY__SANDBOX__ALLOW_INSECURE_RUNTIME": "true"})
    manager = SandboxManager(docker_manager, runtime="runc", config=config)
    await manager.start()
    try:
        tools = CodeExecutionTools(sandbox_manager=manager, hitl_gate=None)
        result = await tools.code_execute(language="shell", code="echo hi")
        assert result["runtime"] == "runc" and result["stdout"] == "hi\n"
    finally:
        await manager.stop()


async def test_user_code_cannot_take_the_supervisor_down(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """Killing, tracing or opening the fds of PID 1 fails; the same sandbox answers next."""
    hostile = [
        ("python", "import os\ntry:\n    os.kill(1, 9)\nexcept OSError as e:\n    print(e.errno)"),
        ("shell", "kill -9 1; echo kill1=$?\nkill -9 -1; echo survived"),
        (
            "shell",
            "(echo forged > /proc/1/fd/1 || cat /proc/1/fd/0) 2>/dev/null || echo fds-closed",
        ),
        ("python", "import ctypes\nprint(ctypes.CDLL(None).ptrace(16, 1, 0, 0))"),  # ATTACH
    ]
    outputs = []
    for language, code in hostile:
        result = await tools.code_execute(language=language, code=code, sandbox_id=fresh_sandbox)
        assert result["sandbox_id"] == fresh_sandbox and result["status"] != "lost", result
        outputs.append(result["stdout"])
    assert outputs[0].strip() == "1"  # EPERM
    assert "kill1=1" in outputs[1]  # kill -9 -1 kills the shell itself, not PID 1
    assert outputs[2].strip() == "fds-closed"
    assert outputs[3].strip() == "-1"
    after = await tools.code_execute(
        language="python", code="print('alive')", sandbox_id=fresh_sandbox
    )
    assert after["stdout"] == "alive\n" and after["sandbox_id"] == fresh_sandbox


async def test_files_written_by_the_tools_belong_to_the_user(
    tools: CodeExecutionTools, fresh_sandbox: str
) -> None:
    """A file written through code_write_file is the user's: code can change and delete it."""
    written = await tools.code_write_file(fresh_sandbox, "sub/dir/f.txt", "x")
    assert written["success"], written
    result = await tools.code_execute(
        language="shell",
        code="stat -c '%u:%g' sub/dir/f.txt sub\necho y >> sub/dir/f.txt && rm -r sub && echo ok",
        sandbox_id=fresh_sandbox,
    )
    assert result["stdout"].split() == ["1000:1000", "1000:1000", "ok"], result


async def test_cpu_quota_binds_user_code(
    tools: CodeExecutionTools, sandbox_manager: SandboxManager, fresh_sandbox: str
) -> None:
    """A busy loop gets about max_cpu_cores of the host's CPU (measured on the host cgroup)."""
    box = sandbox_manager.get(fresh_sandbox)
    before = await CpuQuota(sandbox_manager.docker).usage_s(box.container_id)
    code = "import time\nstart = time.monotonic()\nwhile time.monotonic() - start < 2.0:\n    pass"
    result = await tools.code_execute(language="python", code=code, sandbox_id=fresh_sandbox)
    used = await CpuQuota(sandbox_manager.docker).usage_s(box.container_id) - before
    share = used / result["execution_time"]
    # The default quota is half a core; an unthrottled busy loop takes a whole one or more.
    assert sandbox_manager.limits.max_cpu_cores == 0.5
    assert 0.25 < share < 0.75, share
