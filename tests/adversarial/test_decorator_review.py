"""Adversarial review of ``@sandbox`` without Docker: answers forged by a hostile sandbox
against the host's decoder (crash, hang, amplification, host state changed while decoding;
pickles, which the host no longer reads, and their JSON counterparts),
envelopes that lie, option values a caller may pass, and calls from a signal handler or at
interpreter exit. Bombs that would crash or freeze the test process run in a child process."""

from __future__ import annotations

import asyncio
import collections
import decimal
import fractions
import functools
import math
import pickle
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import pytest

from harombe import decorator, decorator_wire
from harombe.config import parse_config
from harombe.decorator import sandbox
from harombe.decorator_call import CallSpec, decode
from harombe.decorator_decode import MAX_SAME_HASH, loads_answer
from harombe.decorator_encode import answer, envelope
from harombe.decorator_runner import Runner
from harombe.errors import (
    DependencyInstallError,
    HarombeError,
    InvalidArgumentError,
    SandboxExecutionError,
    SandboxTimeoutError,
    SerializationError,
)
from harombe.testing import FakeDocker, FakeGuest, RunOutcome, code_of
from tests.unit.test_decorator import FakeRunnerGuest

#: Protocol 2: ``{"kind": "return", "value": <what follows>`` (the caller appends ``u.``).
HEAD = b"\x80\x02}(X\x04\x00\x00\x00kindX\x06\x00\x00\x00returnX\x05\x00\x00\x00value"
#: Generous: every answer below decodes (or is refused) in milliseconds when handled right.
CHILD_DEADLINE_S = 10.0


def _shared_tuple_key(depth: int) -> bytes:
    """A dict keyed by ``x = (x, x)`` nested ``depth`` times (DUP, TUPLE2): 3 bytes a level,
    but hashing it visits 2**depth tuples, in C, holding the GIL."""
    return HEAD + b"}N" + b"2\x86" * depth + b"K\x01su."


def _deep_frozenset(depth: int) -> bytes:
    """A frozenset of a tuple nested ``depth`` deep (TUPLE1): hashing it recurses in C."""
    return HEAD + b"cbuiltins\nfrozenset\n((N" + b"\x85" * depth + b"ltRu."


def _deep_dict_key(depth: int) -> bytes:
    """A dict whose key is a tuple nested ``depth`` deep."""
    return HEAD + b"}N" + b"\x85" * depth + b"K\x01su."


def _colliding_ints(count: int) -> bytes:
    """A set of ``count`` ints that all hash alike (multiples of 2**61 - 1): each insert
    probes every earlier one, so building it is quadratic."""
    modulus = (1 << 61) - 1
    body = b"".join(pickle.dumps(i * modulus, protocol=2)[2:-1] for i in range(1, count + 1))
    return HEAD + b"cbuiltins\nset\n((" + body + b"ltRu."


#: JSON: ``{"kind": "return", "value": <what follows>`` (the caller appends ``}``).
JSON_HEAD = b'{"kind":"return","value":'


def _json_deep_tuple_key(depth: int) -> bytes:
    """A set holding a tuple nested ``depth`` deep: JSON's counterpart of the deep key."""
    return JSON_HEAD + b'{"s":[' + b'{"t":[' * depth + b"]}" * depth + b"]}}"


def _json_colliding_ints(count: int) -> bytes:
    """A set of ``count`` ints that all hash alike, as JSON."""
    modulus = (1 << 61) - 1
    items = ",".join(str(i * modulus) for i in range(1, count + 1)).encode()
    return JSON_HEAD + b'{"s":[' + items + b"]}}"


def _json_wide_tuple_key(width: int) -> bytes:
    """A dict keyed by a tuple of ``width`` tuples: no sharing, so hashing it is linear."""
    return JSON_HEAD + b'{"m":[{"t":[' + b",".join([b'{"t":[1,2]}'] * width) + b"]},1]}}"


def _decode_in_child(data: bytes) -> subprocess.CompletedProcess[bytes] | None:
    """Decode ``data`` in a child process; None when it did not finish by the deadline."""
    script = textwrap.dedent(
        """
        import sys
        from harombe.decorator_decode import loads_answer
        from harombe.errors import SerializationError
        try:
            loads_answer(sys.stdin.buffer.read())
            print("accepted")
        except SerializationError:
            print("refused")
        """
    )
    try:
        return subprocess.run(
            [sys.executable, "-c", script], input=data, capture_output=True,
            timeout=CHILD_DEADLINE_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None


BOMBS = {
    "deep-value-100k": pytest.param(HEAD + b"N" + b"\x85" * 100_000 + b"u.", id="deep-value"),
    "shared-tuple-hash": pytest.param(_shared_tuple_key(64), id="shared-tuple-hash"),
    "deep-frozenset": pytest.param(_deep_frozenset(1_000_000), id="deep-frozenset"),
    "deep-dict-key": pytest.param(_deep_dict_key(1_000_000), id="deep-dict-key"),
    "colliding-ints": pytest.param(_colliding_ints(200_000), id="colliding-ints"),
    "json-deep-array": pytest.param(
        JSON_HEAD + b"[" * 1_000_000 + b"]" * 1_000_000 + b"}", id="json-deep-array"
    ),
    "json-deep-tuple-key": pytest.param(_json_deep_tuple_key(1_000_000), id="json-deep-tuple-key"),
    "json-colliding-ints": pytest.param(_json_colliding_ints(200_000), id="json-colliding-ints"),
    "json-wide-tuple-key": pytest.param(_json_wide_tuple_key(200_000), id="json-wide-tuple-key"),
}


@pytest.mark.parametrize("data", list(BOMBS.values()))
def test_a_hostile_answer_neither_crashes_nor_freezes_the_host(data: bytes) -> None:
    """Decoding a forged answer ends normally (accepted or refused), without a signal or hang."""
    done = _decode_in_child(data)
    assert done is not None, "the host decoder did not finish: the process froze"
    assert done.returncode == 0, f"the host decoder died (exit {done.returncode})"
    assert done.stdout.strip() in (b"accepted", b"refused")


def _build_on_global(module: str, name: str, attribute: str) -> bytes:
    """GLOBAL ``module.name`` then BUILD with slot state ``{attribute: 7}``: pickle calls
    ``setattr(module.name, attribute, 7)``, on the host's own class or function; POP it."""
    raw = attribute.encode()
    return (
        HEAD + f"c{module}\n{name}\n".encode() + b"N}X" + len(raw).to_bytes(4, "little")
        + raw + b"K\x07s\x86b0K\x01u."
    )  # fmt: skip


POISONED = {
    "Counter-class": ("collections", "Counter", collections.Counter),
    "SafeUUID-enum": ("uuid", "SafeUUID", uuid.SafeUUID),
    "Decimal-class": ("decimal", "Decimal", decimal.Decimal),
    "Fraction-class": ("fractions", "Fraction", fractions.Fraction),
}


@pytest.mark.parametrize(("module", "name", "target"), list(POISONED.values()), ids=list(POISONED))
def test_an_answer_cannot_set_attributes_on_host_classes(
    module: str, name: str, target: Any
) -> None:
    """A BUILD aimed at a host class is refused (the answer must be JSON) and leaves the host
    object untouched."""
    attribute = "harombe_review_poisoned"
    try:
        with pytest.raises(SerializationError, match="not valid JSON"):
            loads_answer(_build_on_global(module, name, attribute))
        assert not hasattr(target, attribute)
    finally:
        if attribute in vars(target):
            delattr(target, attribute)


def _str_of_shared_lists(levels: int) -> bytes:
    """REDUCE ``builtins.str`` on ``x = [x, x]`` nested ``levels`` deep over a 4 KiB string:
    a 4 KiB answer that makes the host build a 4 KiB * 2**levels repr."""
    value: Any = "a" * 4096
    for _ in range(levels):
        value = [value, value]
    inner = pickle.dumps(value, protocol=2)[2:-1]
    return HEAD + b"cbuiltins\nstr\n(" + inner + b"tRu."


def test_an_answer_cannot_expand_past_the_cap_while_loading() -> None:
    """A 4 KiB answer that would repr into 64 MiB (the default cap) is refused."""
    data = _str_of_shared_lists(14)
    assert len(data) < 8192
    with pytest.raises(SerializationError):
        loads_answer(data)


def test_a_decoded_answer_holds_no_shared_containers() -> None:
    """JSON cannot share: a value written twice is read back as two distinct objects, so
    what the host builds is bounded by the answer's size."""
    inner = [1, 2]
    loaded = loads_answer(answer([inner, inner, {"a": inner}], 1 << 20))["value"]
    assert loaded == [inner, inner, {"a": inner}]
    assert loaded[0] is not loaded[1] and loaded[2]["a"] is not loaded[0]


SPEC = CallSpec(name="f", source="", is_async=False)


def _envelope(value: object) -> bytes:
    return envelope(value)  # type: ignore[arg-type]  # forged: any JSON


ENVELOPES = {
    "list": ([("kind", "return")], SerializationError, "not an envelope"),
    "kind-not-str": ({"kind": ["return"], "value": 1}, SerializationError, "not an envelope"),
    "extra-key": ({"kind": "return", "value": 1, "x": 2}, SerializationError, "not an envelope"),
    "huge-int-fields": (
        {"kind": "raise", "error_type": 10**400, "message": ["m"], "traceback": None},
        SandboxExecutionError,
        ": \n",
    ),
    "version-junk": (
        {"kind": "version", "version": [10**100, "x" * 10]},
        SerializationError,
        "the sandbox runs Python",
    ),
    "too-large-junk": (
        {"kind": "too_large", "type": {"a": 1}, "bytes": 1 << 100},
        SerializationError,
        "cannot cross back",
    ),
}


@pytest.mark.parametrize(("envelope", "error", "needle"), list(ENVELOPES.values()),
                         ids=list(ENVELOPES))  # fmt: skip
def test_a_lying_envelope_is_a_typed_error(
    envelope: object, error: type[HarombeError], needle: str
) -> None:
    """Envelopes of the wrong shape or with junk fields raise the spec's error types."""
    with pytest.raises(error) as raised:
        decode(SPEC, _envelope(envelope), 1 << 20)
    assert needle in str(raised.value)


def test_a_remote_message_and_traceback_are_capped() -> None:
    """A 5 MB forged message and traceback reach the caller capped, not whole."""
    big = "m" * 5_000_000
    with pytest.raises(SandboxExecutionError) as raised:
        decode(SPEC, _envelope({"kind": "raise", "error_type": "E", "message": big,
                                "traceback": big}), 1 << 24)  # fmt: skip
    assert len(str(raised.value)) <= 2 * decorator_wire.MAX_ERROR_CHARS + 16
    assert len(raised.value.traceback_str or "") <= decorator_wire.MAX_ERROR_CHARS


def test_self_referencing_dicts_are_refused_with_a_clear_error() -> None:
    """A dict that contains itself cannot be written as a tree: the sandbox reports it."""
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(SerializationError, match="contains itself"):
        decode(SPEC, answer(loop, 1 << 20), 1 << 20)


OPTIONS = {
    "net-empty-name": (dict(allow_network=[""]), InvalidArgumentError),
    "net-star": (dict(allow_network=["*"]), InvalidArgumentError),
    "net-star-dot-star": (dict(allow_network=["*.*"]), InvalidArgumentError),
    "net-top-level": (dict(allow_network=["*.com"]), InvalidArgumentError),
    "net-url": (dict(allow_network=["http://example.com/x"]), InvalidArgumentError),
    "net-port": (dict(allow_network=["example.com:443"]), InvalidArgumentError),
    "net-ip": (dict(allow_network=["127.0.0.1"]), InvalidArgumentError),
    "net-bytes": (dict(allow_network=b"example.com"), InvalidArgumentError),
    "net-dict": (dict(allow_network={"example.com": 1}), InvalidArgumentError),
    "net-true": (dict(allow_network=True), InvalidArgumentError),
    "dep-string": (dict(dependencies="pandas"), InvalidArgumentError),
    "dep-set": (dict(dependencies={"pandas"}), InvalidArgumentError),
    "dep-not-str": (dict(dependencies=[1]), InvalidArgumentError),
    "dep-empty": (dict(dependencies=[""]), DependencyInstallError),
    "dep-url": (dict(dependencies=["x @ https://example.com/x.whl"]), DependencyInstallError),
    "dep-index-option": (dict(dependencies=["--index-url=http://x"]), DependencyInstallError),
    "dep-editable": (dict(dependencies=["-e ."]), DependencyInstallError),
    "dep-path": (dict(dependencies=["./local"]), DependencyInstallError),
    "dep-vcs": (dict(dependencies=["git+https://example.com/y"]), DependencyInstallError),
    "dep-newline": (dict(dependencies=["a\nb"]), DependencyInstallError),
    "dep-marker": (dict(dependencies=["x; python_version<'4'"]), DependencyInstallError),
    "timeout-zero": (dict(timeout_sec=0), InvalidArgumentError),
    "timeout-negative": (dict(timeout_sec=-1), InvalidArgumentError),
    "timeout-nan": (dict(timeout_sec=math.nan), InvalidArgumentError),
    "timeout-inf": (dict(timeout_sec=math.inf), InvalidArgumentError),
    "timeout-text": (dict(timeout_sec="5"), InvalidArgumentError),
    "memory-zero": (dict(memory_mb=0), InvalidArgumentError),
    "memory-fraction": (dict(memory_mb=512.5), InvalidArgumentError),
    "memory-bool": (dict(memory_mb=True), InvalidArgumentError),
    "cpus-zero": (dict(cpus=0), InvalidArgumentError),
    "cpus-nan": (dict(cpus=math.nan), InvalidArgumentError),
    "disable-cache-text": (dict(disable_cache="yes"), InvalidArgumentError),
    "gate-object": (dict(gate=object()), InvalidArgumentError),
}


@pytest.mark.parametrize(("options", "error"), list(OPTIONS.values()), ids=list(OPTIONS))
def test_bad_options_are_refused_when_decorating(
    options: dict[str, Any], error: type[HarombeError]
) -> None:
    """Every odd option value fails at decoration with the spec's error type."""
    with pytest.raises(error):
        sandbox(**options)


@pytest.mark.parametrize("name", ["memory_mb", "cpus", "timeout_sec"])
def test_a_huge_int_option_is_an_invalid_argument(name: str) -> None:
    """memory_mb / cpus / timeout_sec = 10**400 is refused as an InvalidArgumentError."""
    with pytest.raises(InvalidArgumentError):
        sandbox(**{name: 10**400})  # type: ignore[arg-type]


def _run_child(script: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
            timeout=CHILD_DEADLINE_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None


def test_a_call_from_a_signal_handler_does_not_deadlock() -> None:
    """A signal arriving while an argument is pickled, whose handler pickles a call too, ends."""
    done = _run_child(
        """
        import os, signal
        from harombe.decorator_wire import dumps_call

        class Ring:
            def __reduce__(self):
                os.kill(os.getpid(), signal.SIGUSR1)
                for _ in range(1000):
                    pass  # the handler runs between these bytecodes
                return (int, (1,))

        signal.signal(signal.SIGUSR1, lambda *_: print("handler", len(dumps_call(abs, (1,), {}))))
        print("main", len(dumps_call(abs, (Ring(),), {})))
        """
    )
    assert done is not None, "the handler's call waited for the interrupted one: deadlock"
    assert "handler" in done.stdout and "main" in done.stdout


def test_a_first_call_at_interpreter_exit_is_a_harombe_error() -> None:
    """A decorated function first called from an atexit hook raises a harombe error."""
    done = _run_child(
        """
        import atexit
        from harombe import sandbox

        def at_exit():
            try:
                sandbox()(lambda: 1)()
            except BaseException as exc:
                print(type(exc).__module__, type(exc).__name__)

        atexit.register(at_exit)
        """
    )
    assert done is not None
    assert done.stdout.startswith("harombe.errors "), done.stdout + done.stderr[-500:]


class Reconfigure:
    """An argument whose pickling calls ``configure()``: it stands for another thread that
    reconfigures (or shuts down) between the call's two look-ups of the current runner."""

    def __reduce__(self) -> tuple[Any, ...]:
        decorator.configure()
        return (int, (0,))


def test_reconfiguring_during_an_async_call_leaks_no_container(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """configure() racing an async call: after shutdown() every container is gone."""
    guests = FakeRunnerGuest()
    docker = FakeDocker(guest_factory=guests.factory)
    config = parse_config({"security": {"sandbox": {"pool": {"size": 1}}}})
    make = functools.partial(Runner, docker_factory=lambda: docker)
    monkeypatch.setattr(decorator, "Runner", make)
    first = make(config)
    monkeypatch.setattr(decorator, "_runner", first)
    monkeypatch.setattr(decorator, "_config", config)
    monkeypatch.setattr(decorator, "_default_gate", None)
    add_one = decorator.sandbox_async()(lambda x: x + 1)
    try:
        assert asyncio.run(add_one(Reconfigure())) == 1
        decorator.runner().call(first.settled())  # its warm pool, filled on the new loop
    finally:
        decorator.shutdown()
    assert docker.containers == {}


class OversizedAnswer(FakeRunnerGuest):
    """Guests whose runner writes an answer one byte over the cap (a forged one could)."""

    def handle(self, guest: FakeGuest, msg: dict[str, Any], stdin: bytes) -> RunOutcome:
        if "_harombe_call" not in code_of(msg, stdin):
            return super().handle(guest, msg, stdin)
        guest.files[f"/workspace/{decorator_wire.RESULT_PATH}"] = b"\x80" * (SMALL_CAP + 1)
        return RunOutcome()


SMALL_CAP = 1 << 20


def test_an_oversized_answer_is_a_serialization_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer over max_file_bytes raises SerializationError, not a process-exit error."""
    guests = OversizedAnswer()
    docker = FakeDocker(guest_factory=guests.factory)
    config = parse_config({"security": {"sandbox": {
        "pool": {"size": 0}, "limits": {"max_file_bytes": SMALL_CAP},
    }}})  # fmt: skip
    monkeypatch.setattr(decorator, "_runner", Runner(config, docker_factory=lambda: docker))
    monkeypatch.setattr(decorator, "_default_gate", None)
    try:
        with pytest.raises(SerializationError):
            decorator.sandbox()(lambda: None)()
    finally:
        decorator.shutdown()


UUIDS = {
    "list": "[1,2]",
    "int": "5",
    "too-long": '"' + "f" * 33 + '"',
    "not-hex": '"' + "g" * 32 + '"',
    "signed": '"-' + "f" * 31 + '"',
}


@pytest.mark.parametrize("payload", list(UUIDS.values()), ids=list(UUIDS))
def test_a_uuid_must_hold_a_128_bit_int(payload: str) -> None:
    """A forged UUID that is not 32 hex digits (a list, an int, 33 digits) is refused."""
    with pytest.raises(SerializationError, match="malformed 'u'"):
        loads_answer(JSON_HEAD + b'{"u":' + payload.encode() + b"}}")


def test_keys_that_hash_alike_are_capped() -> None:
    """At most MAX_SAME_HASH keys of one hash are accepted; one more is refused."""
    assert len(loads_answer(_json_colliding_ints(MAX_SAME_HASH))["value"]) == MAX_SAME_HASH
    with pytest.raises(SerializationError, match="with one hash"):
        loads_answer(_json_colliding_ints(MAX_SAME_HASH + 1))


def test_a_capped_timeout_says_which_limit_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call stopped at max_timeout_s (not its own timeout_sec) names max_timeout_s."""
    docker = FakeDocker(guest_factory=FakeRunnerGuest("timeout").factory)
    config = parse_config({"security": {"sandbox": {
        "pool": {"size": 0}, "limits": {"max_timeout_s": 60},
    }}})  # fmt: skip
    monkeypatch.setattr(decorator, "_runner", Runner(config, docker_factory=lambda: docker))
    monkeypatch.setattr(decorator, "_default_gate", None)
    try:
        with pytest.raises(SandboxTimeoutError) as raised:
            decorator.sandbox(timeout_sec=3600)(lambda: None)()
    finally:
        decorator.shutdown()
    assert "max_timeout_s" in str(raised.value)
