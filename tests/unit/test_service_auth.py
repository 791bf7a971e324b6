"""Tokens, tenants, limits, binding and error statuses of the service (no Docker)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from harombe import errors
from harombe.config import parse_config
from harombe.errors import ConfigError
from harombe.service import auth
from harombe.service.auth import Tenant, TokenTable, bearer, is_loopback
from harombe.service.fips import MAX_STREAM_BYTES, TRUNCATION_NOTE, cut
from harombe.service.problems import HTTPProblem, problem_in_result, status_for
from harombe.service.serve import check_binding

SECRET = "s3cret-token-value-0123"


def table(tokens: list[dict[str, object]], environ: dict[str, str] | None = None) -> TokenTable:
    return TokenTable(parse_config({"service": {"tokens": tokens}}).service, environ or {})


def test_a_plain_token_is_kept_only_as_its_digest() -> None:
    """The secret given in config is hashed on load; neither dump nor repr holds it."""
    config = parse_config({"service": {"tokens": [{"name": "a", "token": SECRET}]}})
    entry = config.service.tokens[0]
    assert entry.token is None and entry.sha256 == hashlib.sha256(SECRET.encode()).hexdigest()
    assert SECRET not in repr(config) and SECRET not in config.model_dump_json()


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "a", "token": SECRET, "sha256": "0" * 64},
        {"name": "a"},
        {"name": "a", "token": "short"},
        {"name": "a b", "token": SECRET},
        {"name": "a", "sha256": "XYZ"},
    ],
    ids=["two-secrets", "no-secret", "too-short", "bad-name", "bad-digest"],
)
def test_bad_token_entries_are_refused_without_echoing_the_secret(
    entry: dict[str, object],
) -> None:
    """A bad token entry is a ConfigError that names the key and never shows the secret."""
    with pytest.raises(ConfigError) as caught:
        parse_config({"service": {"tokens": [entry]}})
    assert "service.tokens" in str(caught.value)
    assert SECRET not in str(caught.value) and "short" not in str(caught.value)


@pytest.mark.parametrize(
    ("secret", "accepted"),
    [("x" * 15, False), ("x" * 16, True), ("x" * 512, True), ("x" * 513, False),
     ("token-with space-0123", False), ("token-with-tab\t-0123", False),
     ("tökén-0123456789abcdef", False), ("token\x7f-0123456789ab", False),
     ("Az09-_.~+/=!#$%&*@^|", True)],
    ids=["15-chars", "16-chars", "512-chars", "513-chars", "space", "tab", "non-ascii",
         "delete-char", "printable-punctuation"],
)  # fmt: skip
def test_token_text_boundaries(secret: str, accepted: bool) -> None:
    """Tokens are 16 to 512 characters of printable ASCII without spaces."""
    entry = {"name": "a", "token": secret}
    if accepted:
        assert table([entry]).lookup(secret) is not None
    else:
        with pytest.raises(ConfigError, match="token"):
            table([entry])


def test_lookup_finds_the_tenant_of_a_token() -> None:
    """A known token names its tenant; an unknown one, or a prefix of a known one, none."""
    other = hashlib.sha256(b"other-token-000000").hexdigest()
    tokens = table([{"name": "a", "token": SECRET}, {"name": "b", "sha256": other}])
    assert tokens.lookup(SECRET).name == "a"  # type: ignore[union-attr]
    assert tokens.lookup("other-token-000000").name == "b"  # type: ignore[union-attr]
    assert tokens.lookup(SECRET[:-1]) is None and tokens.lookup("") is None


def test_lookup_compares_every_digest_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every known digest is compared with hmac.compare_digest, whichever one matches."""
    calls: list[int] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    tokens = table([{"name": f"t{i}", "token": f"{SECRET}-{i}"} for i in range(5)])
    for presented in (f"{SECRET}-0", f"{SECRET}-4", "nobody-0000000000000"):
        calls.clear()
        tokens.lookup(presented)
        assert len(calls) == 5


def test_tokens_from_the_environment() -> None:
    """env: reads the token from a variable at start; unset or short is a clear error."""
    tokens = table([{"name": "a", "env": "A_TOKEN"}], {"A_TOKEN": SECRET})
    assert tokens.lookup(SECRET) is not None and tokens.enabled
    for environ in ({}, {"A_TOKEN": "short"}):
        with pytest.raises(ConfigError, match="A_TOKEN"):
            table([{"name": "a", "env": "A_TOKEN"}], environ)


@pytest.mark.parametrize("name", ["a", "anonymous"], ids=["duplicate", "reserved"])
def test_token_names_are_unique_and_not_reserved(name: str) -> None:
    """Two tokens with one name, or one called 'anonymous', are refused."""
    entries = [{"name": "a", "token": SECRET}, {"name": name, "token": SECRET + "x"}]
    with pytest.raises(ConfigError, match="own name"):
        table(entries)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer    ", None),
    ],
    ids=["none", "empty", "bearer", "lowercase-spaces", "basic", "no-token", "blank-token"],
)
def test_bearer_header(header: str | None, token: str | None) -> None:
    """Only 'Bearer <token>' (any case) gives a token."""
    assert bearer(header) == token


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("::", False),
        ("example.invalid", False),
        (None, False),
    ],
    ids=[
        "v4",
        "v4-net",
        "v6",
        "v6-brackets",
        "localhost",
        "any-v4",
        "private",
        "any-v6",
        "name",
        "none",
    ],
)
def test_is_loopback(host: str | None, loopback: bool) -> None:
    """Loopback addresses (and the name localhost) only."""
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"], ids=["any-v4", "any-v6", "lan"])
def test_binding_beyond_loopback_needs_tokens(host: str) -> None:
    """Without tokens a non-loopback bind is refused, naming service.tokens; with them, fine."""
    with pytest.raises(ConfigError, match=r"service\.tokens"):
        check_binding(parse_config({}), host)
    check_binding(parse_config({"service": {"tokens": [{"name": "a", "token": SECRET}]}}), host)
    check_binding(parse_config({}), "127.0.0.1")


def test_run_and_sandbox_slots_answer_429_with_retry_after() -> None:
    """Past its limits a tenant gets 429 with Retry-After; slots free up when left."""
    tenant = Tenant("t", max_sandboxes=1, max_concurrent_runs=1)
    with tenant.run_slot():
        with pytest.raises(HTTPProblem) as busy, tenant.run_slot():
            pass
        assert busy.value.status == 429 and busy.value.headers["Retry-After"] == "1"
    with tenant.run_slot():
        assert tenant.running == 1
    tenant.sandboxes.add("sandbox-0")
    with pytest.raises(HTTPProblem) as full, tenant.creation_slot():
        pass
    assert full.value.headers["Retry-After"] == "5" and "DELETE" in full.value.message


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.SandboxNotFoundError, 404),
        (errors.InvalidArgumentError, 400),
        (errors.FileError, 400),
        (errors.WorkspacePathError, 403),
        (errors.ApprovalDeniedError, 403),
        (errors.PackageSpecError, 403),
        (errors.PackageFetchError, 502),
        (errors.PackageNotFoundError, 422),
        (errors.DockerUnavailableError, 503),
        (errors.SandboxLostError, 503),
        (errors.ConfigError, 503),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else str(v),
)
def test_error_kinds_map_to_statuses(error: type[errors.HarombeError], status: int) -> None:
    """Each harombe error kind has its HTTP status (never 500)."""
    assert status_for(error) == status


@pytest.mark.parametrize(
    ("result", "status"),
    [
        ({"success": True}, None),
        ({"success": False, "status": "error", "exit_code": 1, "error": None}, None),
        ({"success": False, "status": "lost", "error": "SandboxLostError: gone"}, None),
        ({"success": False, "error": "SandboxNotFoundError: Sandbox not found: x"}, 404),
        ({"success": False, "error": "ApprovalDeniedError: denied"}, 403),
        ({"success": False, "error": "InvalidArgumentError: code must be text"}, 400),
        ({"success": False, "error": "pip said no"}, None),
    ],
    ids=["ok", "code-failed", "lost-but-ran", "not-found", "denied", "bad-arg", "not-a-kind"],
)
def test_problem_in_result(result: dict[str, object], status: int | None) -> None:
    """A refused call is its kind's problem; a run (even a failed one) is an answer."""
    problem = problem_in_result(result)
    assert (problem.status if problem else None) == status


@pytest.mark.parametrize(
    ("text", "cut_at"),
    [
        ("", None),
        ("x" * MAX_STREAM_BYTES, None),
        ("x" * (MAX_STREAM_BYTES + 1), MAX_STREAM_BYTES),
        ("é" * MAX_STREAM_BYTES, MAX_STREAM_BYTES // 2),
    ],
    ids=["empty", "exactly-50k", "one-over", "two-byte-chars"],
)
def test_cut_at_50_kb(text: str, cut_at: int | None) -> None:
    """Streams are cut at 50 KB of UTF-8 with the note; shorter ones are left alone."""
    out = cut(text)
    if cut_at is None:
        assert out == text
    else:
        assert out.endswith(TRUNCATION_NOTE) and len(out) - len(TRUNCATION_NOTE) == cut_at
