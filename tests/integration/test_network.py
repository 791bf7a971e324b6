"""Network-enabled sandboxes against origin servers the tests start in their own Docker network.

Names are resolved by a test resolver that knows only the origin containers; no outside
address is ever contacted. TLS uses a CA made for the test, trusted through the config.
"""

import ast
import asyncio
import base64
import hashlib
import itertools
import subprocess
import sys
import uuid
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from harombe.config import load_config, parse_config
from harombe.security.docker_manager import DockerManager
from harombe.security.sandbox_manager import SandboxManager
from harombe.testing import capture_events
from harombe.tools.code_execution import CodeExecutionTools

IMAGE = "harombe/sandbox:latest"
HTTPS_SERVER = (
    "import http.server, ssl\n"
    "s = http.server.HTTPServer(('', 443), http.server.SimpleHTTPRequestHandler)\n"
    "c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n"
    "c.load_cert_chain('/certs/s.pem', '/certs/s.key')\n"
    "s.socket = c.wrap_socket(s.socket, server_side=True)\ns.serve_forever()"
)


def read(path: str) -> str:
    return Path(path).read_text()


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A test CA and a certificate for secure.test signed by it."""
    d = tmp_path_factory.mktemp("certs")
    sh(
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=harombe test CA",
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.pem"),
    )
    sh(
        "openssl",
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=secure.test",
        "-keyout",
        str(d / "s.key"),
        "-out",
        str(d / "s.csr"),
    )
    (d / "ext").write_text("subjectAltName=DNS:secure.test\n")
    sh("openssl", "x509", "-req", "-in", str(d / "s.csr"), "-CA", str(d / "ca.pem"),
       "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", str(d / "ext"),
       "-out", str(d / "s.pem"))  # fmt: skip
    for name in ("s.pem", "s.key"):
        (d / name).chmod(0o644)
    return d


def _wheel(directory: Path) -> str:
    """A one-module wheel, harombe-probe 1.0, written by hand (no build backend needed)."""
    name = "harombe_probe-1.0-py3-none-any.whl"
    files = {
        "harombe_probe/__init__.py": b"VALUE = 42\n",
        "harombe_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: harombe-probe\n"
        b"Version: 1.0\n",
        "harombe_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: harombe-tests\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("harombe_probe-1.0.dist-info/RECORD,,")
    with zipfile.ZipFile(directory / name, "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
        wheel.writestr("harombe_probe-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return name


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PEP 503 simple index holding harombe-probe, served by plain.test."""
    root = tmp_path_factory.mktemp("index")
    project = root / "simple" / "harombe-probe"
    project.mkdir(parents=True)
    name = _wheel(project)
    (project / "index.html").write_text(f'<a href="{name}">{name}</a>\n')
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


@pytest.fixture(scope="module")
def origins(certs: Path, index: Path) -> Iterator[dict[str, str]]:
    """plain.test (HTTP) and secure.test (HTTPS) in a network of their own; name → address."""
    network = f"harombe-test-origins-{uuid.uuid4().hex[:8]}"
    sh("docker", "network", "create", network)
    plain = sh("docker", "run", "-d", "--user", "0", "--network", network,
               "-v", f"{index}:/srv:ro", "-w", "/srv", IMAGE,
               "python3", "-m", "http.server", "80")  # fmt: skip
    secure = sh("docker", "run", "-d", "--user", "0", "--network", network,
                "-v", f"{certs}:/certs:ro",
                "-w", "/tmp", IMAGE, "python3", "-c", HTTPS_SERVER)  # fmt: skip
    try:
        addresses = {
            name: sh("docker", "inspect", "-f",
                     "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", cid)
            for name, cid in (("plain.test", plain), ("secure.test", secure))
        }  # fmt: skip
        yield addresses
    finally:
        subprocess.run(["docker", "rm", "-f", plain, secure], capture_output=True)
        subprocess.run(["docker", "network", "rm", network], capture_output=True)


@pytest.fixture
async def net_tools(
    docker_manager: DockerManager, origins: dict[str, str], certs: Path
) -> AsyncIterator[CodeExecutionTools]:
    async def resolver(host: str, port: int) -> list[str]:
        if host in origins:
            return [origins[host]]
        raise OSError(f"{host}: unknown name")

    data = load_config(environ={}).model_dump()
    network: dict[str, Any] = data["security"]["sandbox"]["network"]
    network.update(allow_private_destinations=True, extra_ca_certificates=[str(certs / "ca.pem")])
    manager = SandboxManager(docker_manager, config=parse_config(data), egress_resolver=resolver)
    await manager.start()
    yield CodeExecutionTools(manager, hitl_gate=None)
    await manager.stop()


FETCH = (
    "import urllib.request\n"
    "def fetch(url):\n"
    "    try:\n"
    "        return urllib.request.urlopen(url, timeout=10).status\n"
    "    except Exception as e:\n"
    "        return type(e).__name__ + ': ' + str(e)[:60]\n"
)


async def test_allowed_domains_are_reachable_over_http_and_https(
    net_tools: CodeExecutionTools,
) -> None:
    """Exactly the allowed names answer, over HTTP and over HTTPS (TLS end to end)."""
    code = FETCH + "[fetch('http://plain.test/'), fetch('https://secure.test/')]"
    with capture_events() as events:
        result = await net_tools.code_execute(
            language="python", code=code, network_enabled=True,
            allowed_domains=["plain.test", "secure.test"],
        )  # fmt: skip
    assert result["result"] == "[200, 200]", result
    allowed = {(e["domain"], e["port"]) for e in events if e["event"] == "egress.allowed"}
    assert allowed == {("plain.test", 80), ("secure.test", 443)}
    lease = net_tools.sandbox_manager.networks.get(result["sandbox_id"])
    assert lease is not None and lease.client_ip
    clients = {(e["sandbox_id"], e["client"]) for e in events if e["event"] == "egress.allowed"}
    assert clients == {(result["sandbox_id"], lease.client_ip)}, "the audit names the true client"


async def test_only_the_sandbox_itself_may_reach_its_proxy(net_tools: CodeExecutionTools) -> None:
    """The one rule that opens the proxy's port names the bridge, the sandbox's address and the
    gateway; and the bridge has no IPv6 address a sandbox could reach the host by."""
    result = await net_tools.code_execute(
        language="python", code="1", network_enabled=True, allowed_domains=["plain.test"]
    )
    lease = net_tools.sandbox_manager.networks.get(result["sandbox_id"])
    assert lease is not None
    accepts = [line for line in sh("iptables", "-S", "INPUT").splitlines()
               if lease.bridge in line and "ACCEPT" in line]  # fmt: skip
    assert len(accepts) == 1, accepts
    words = accepts[0].split()
    assert words[words.index("-s") + 1] == f"{lease.client_ip}/32"
    assert words[words.index("-d") + 1] == f"{lease.gateway}/32"
    assert words[words.index("--dport") + 1] == "3128"
    assert read(f"/proc/sys/net/ipv6/conf/{lease.bridge}/disable_ipv6").strip() == "1"
    with pytest.raises(ConnectionRefusedError):  # from the host (not the bridge): refused
        await asyncio.wait_for(asyncio.open_connection(lease.gateway, 3128), 10)
    assert "inet6" not in sh("ip", "-6", "addr", "show", "dev", lease.bridge)


@pytest.mark.parametrize("network_enabled", [False, True], ids=["offline", "network-enabled"])
async def test_no_host_resolver_is_visible(
    net_tools: CodeExecutionTools, network_enabled: bool
) -> None:
    """No sandbox sees the host's nameservers or search domains, or resolves a name itself."""
    host = read("/etc/resolv.conf").split()
    host_servers = {w for p, w in itertools.pairwise(host) if p == "nameserver"}
    code = (
        "import socket\ntry:\n    socket.getaddrinfo('plain.test', 80); dns = 'RESOLVED'\n"
        "except OSError:\n    dns = 'none'\n[open('/etc/resolv.conf').read(), dns]"
    )
    result = await net_tools.code_execute(
        language="python", code=code, network_enabled=network_enabled,
        allowed_domains=["plain.test"] if network_enabled else None,
    )  # fmt: skip
    resolv, dns = ast.literal_eval(result["result"])
    servers = {w for p, w in itertools.pairwise(resolv.split()) if p == "nameserver"}
    assert servers <= {"127.0.0.1", "127.0.0.11"} and not servers & host_servers, resolv
    assert "search" not in resolv.split(), resolv
    assert dns == "none"


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (FETCH + "fetch('http://secure.test/')", "HTTPError: HTTP Error 403"),
        (FETCH + "fetch('https://unknown.test/')", "URLError"),
        ("import socket\ntry:\n    socket.getaddrinfo('plain.test', 80)\n    out = 'RESOLVED'\n"
         "except OSError as e:\n    out = 'no DNS'\nout", "'no DNS'"),
        ("import socket\ns = socket.socket()\ns.settimeout(5)\ntry:\n"
         "    s.connect((ORIGIN, 80))\n    out = 'CONNECTED'\n"
         "except OSError as e:\n    out = type(e).__name__\nout",
         "'ConnectionRefusedError'"),
    ],
    ids=["other-allowed-origin", "unknown-name", "dns", "direct-ip"],
)  # fmt: skip
async def test_everything_else_fails_fast(
    net_tools: CodeExecutionTools, origins: dict[str, str], code: str, expected: str
) -> None:
    """Names not allowed, DNS and direct connections fail at once with a clear error."""
    code = code.replace("ORIGIN", repr(origins["plain.test"]))
    result = await net_tools.code_execute(
        language="python", code=code, network_enabled=True, allowed_domains=["plain.test"]
    )
    assert expected in str(result["result"]), result


async def test_allowlist_change_applies_to_the_next_connection(
    net_tools: CodeExecutionTools,
) -> None:
    """set_allowed_domains on a running sandbox changes what the next connection may reach."""
    code = FETCH + "fetch('http://plain.test/')"
    first = await net_tools.code_execute(
        language="python", code=code, network_enabled=True, allowed_domains=["plain.test"]
    )
    assert first["result"] == "200"
    net_tools.sandbox_manager.set_allowed_domains(first["sandbox_id"], ["secure.test"])
    again = await net_tools.code_execute(
        language="python", code=code, sandbox_id=first["sandbox_id"]
    )
    assert "403" in again["result"]


async def test_offline_sandboxes_stay_offline(net_tools: CodeExecutionTools) -> None:
    """Without network_enabled there is no proxy and no interface but loopback."""
    code = "import socket\nsorted(n for _, n in socket.if_nameindex())"
    result = await net_tools.code_execute(language="python", code=code)
    assert result["result"] == "['lo']"
    await asyncio.sleep(0)


async def test_host_services_and_other_sandboxes_are_refused(
    net_tools: CodeExecutionTools,
) -> None:
    """The gateway's other ports, another sandbox's address and the Docker socket: refused."""
    other = await net_tools.code_execute(
        language="python", network_enabled=True, allowed_domains=["plain.test"],
        code="import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
             "s.connect(('10.255.255.1', 9)); s.getsockname()[0]",
    )  # fmt: skip
    other_ip = other["result"].strip("'")
    code = (
        "import os, socket\n"
        "gateway = os.environ['HTTP_PROXY'].split('//')[1].split(':')[0]\n"
        "def probe(host, port):\n"
        "    s = socket.socket(); s.settimeout(5)\n"
        "    try:\n"
        "        s.connect((host, port)); return 'OPEN'\n"
        "    except OSError as e:\n"
        "        return type(e).__name__\n"
        f"[probe(gateway, 22), probe(gateway, 2375), probe({other_ip!r}, 80),\n"
        " os.path.exists('/var/run/docker.sock')]"
    )
    result = await net_tools.code_execute(
        language="python", code=code, network_enabled=True, allowed_domains=["plain.test"]
    )
    assert result["result"] == (
        "['ConnectionRefusedError', 'ConnectionRefusedError', 'ConnectionRefusedError', False]"
    ), result


async def test_networks_of_a_crashed_process_are_swept(
    docker_manager: DockerManager,
) -> None:
    """A process that dies with a network-enabled sandbox leaves a network and firewall rules;
    the next manager start removes both."""
    script = (
        "import asyncio, os\n"
        "from harombe.security.docker_manager import DockerManager\n"
        "from harombe.security.sandbox_manager import SandboxManager\n"
        "async def main():\n"
        "    d = DockerManager(); await d.start()\n"
        "    m = SandboxManager(d); await m.start()\n"
        "    box = await m.create_sandbox('python', network_enabled=True,\n"
        "                                 allowed_domains=['plain.test'])\n"
        "    print(m.networks.get(box.sandbox_id).bridge, flush=True)\n"
        "    os._exit(0)\n"
        "asyncio.run(main())\n"
    )
    bridge = sh(sys.executable, "-c", script).splitlines()[-1]
    assert bridge in sh("iptables", "-S", "INPUT")
    manager = SandboxManager(docker_manager)
    await manager.start()  # sweeps
    await manager.stop()
    assert bridge not in sh("iptables", "-S", "INPUT")
    assert bridge not in sh("iptables", "-S", "FORWARD")
    assert bridge[3:] not in sh("docker", "network", "ls", "-q", "--no-trunc")


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("javascript", "(async () => { const r = await fetch('https://secure.test/'); "
                       "return r.status; })()"),
        ("shell", "python3 -c \"import urllib.request as u; "
                  "print(u.urlopen('https://secure.test/').status)\""),
    ],
    ids=["node-fetch", "shell-python"],
)  # fmt: skip
async def test_common_clients_go_through_the_proxy(
    net_tools: CodeExecutionTools, language: str, code: str
) -> None:
    """Node's fetch and a program started from a shell use the proxy and trust the CA."""
    result = await net_tools.code_execute(
        language=language, code=code, network_enabled=True, allowed_domains=["secure.test"]
    )
    assert result["success"], result
    assert (result["result"] or result["stdout"].strip()) == "200", result


async def test_pip_installs_through_the_proxy(net_tools: CodeExecutionTools) -> None:
    """pip inside the sandbox reaches an allowed index through the proxy, and nothing else."""
    code = (
        "pip install --user --no-cache-dir --index-url http://plain.test/simple/ "
        "--trusted-host plain.test harombe-probe "
        ">/dev/null && python3 -c 'import harombe_probe; print(harombe_probe.VALUE)'"
    )
    result = await net_tools.code_execute(
        language="shell", code=code, network_enabled=True, allowed_domains=["plain.test"],
        timeout=120,
    )  # fmt: skip
    assert result["stdout"] == "42\n", result
    with capture_events() as events:
        refused = await net_tools.code_execute(
            language="shell", sandbox_id=result["sandbox_id"], timeout=120,
            code="pip download --no-cache-dir --retries 0 --trusted-host unknown.test "
                 "--index-url http://unknown.test/simple/ harombe-probe -d /tmp/x",
        )  # fmt: skip
    assert refused["success"] is False and "No matching distribution" in refused["stderr"]
    assert any(e["event"] == "egress.refused" and e["domain"] == "unknown.test" for e in events), (
        "the refusal is audited"
    )


async def test_udp_and_raw_sockets_are_refused(
    net_tools: CodeExecutionTools, origins: dict[str, str]
) -> None:
    """UDP out of the sandbox is refused at once; raw sockets cannot be opened."""
    code = (
        "import socket\n"
        "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(5)\n"
        f"u.connect(({origins['plain.test']!r}, 53))\n"
        "try:\n"
        "    u.send(b'x'); u.recv(10); udp = 'ANSWERED'\n"
        "except OSError as e:\n"
        "    udp = type(e).__name__\n"
        "try:\n"
        "    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); raw = 'OPEN'\n"
        "except OSError as e:\n"
        "    raw = type(e).__name__\n"
        "[udp, raw]"
    )
    result = await net_tools.code_execute(
        language="python", code=code, network_enabled=True, allowed_domains=["plain.test"]
    )
    udp, raw = result["result"].strip("[]").replace("'", "").split(", ")
    assert udp == "ConnectionRefusedError", result
    assert raw in ("PermissionError", "OSError"), result  # gVisor: no raw sockets here at all
