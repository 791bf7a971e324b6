"""Request and response bodies of the ``/v1`` API (pydantic; ``/openapi.json`` shows them).

Requests refuse unknown fields (a misspelt option must not be silently ignored); responses
carry the tool result dicts of the library, described here field by field where they are fixed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harombe.config import Language, Registry


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSandbox(_Request):
    language: Language = Field("python", description="The language of the sandbox's session.")
    network_enabled: bool | None = Field(
        None, description="Network limited to allowed_domains; null: the configured default."
    )
    allowed_domains: list[str] = Field(
        default_factory=list, max_length=256, description="Host names the sandbox may reach."
    )
    profile: str | None = Field(
        None, max_length=128, description="A policy profile (Python only), e.g. 'minimal'."
    )


class Execute(_Request):
    language: Language = Field("python", description="python, javascript or shell.")
    code: str = Field(description="The program to run.")
    timeout: float | None = Field(None, gt=0, le=86_400, description="Seconds; null: default.")
    fresh: bool = Field(False, description="Run in a new process, without the session's state.")
    output_mode: Literal["full", "llm"] | None = Field(
        None,
        description="full: each stream up to the byte cap; llm: a long stream as head, a marker "
        "and tail, the full text saved in the sandbox (output_files); null: the configured "
        "default.",
    )


class Install(_Request):
    package: str = Field(max_length=1024, description="A package spec, e.g. 'six==1.16.0'.")
    registry: Registry = Field("pypi", description="pypi or npm.")


class WriteText(_Request):
    path: str = Field(max_length=4096, description="Path relative to /workspace.")
    content: str = Field(description="UTF-8 text to write.")


class Decide(_Request):
    decision: Literal["approve", "approve_sandbox", "deny"] = Field(
        description="approve: this call; approve_sandbox: this finding for the rest of the "
        "sandbox's life; deny."
    )
    comment: str | None = Field(None, max_length=2000)


class SandboxView(BaseModel):
    sandbox_id: str
    language: str
    network_enabled: bool
    allowed_domains: list[str]
    profile: str | None = None
    created_at: float | None = None


class SandboxList(BaseModel):
    sandboxes: list[SandboxView]


class ToolResult(BaseModel):
    """A tool's result dict, as the library returns it (see the usage guide)."""

    model_config = ConfigDict(extra="allow")
    success: bool
    error: str | None = None


class Problem(BaseModel):
    """Every error answer: what kind, and a message that says how to fix it."""

    kind: str
    message: str


class Health(BaseModel):
    """``sandboxes`` and ``runs`` count the caller's own (``scope: tenant``); an approver's
    credential sees the whole service's (``scope: service``)."""

    status: Literal["ok", "starting"]
    sandboxes: int = Field(description="live sandboxes: the caller's, or all for an approver")
    runs: int = Field(description="calls running now: the caller's, or all for an approver")
    scope: Literal["tenant", "service"]
    profile: str


class Version(BaseModel):
    harombe: str
    api: str = "v1"
    runtime: str
    image: str


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for error statuses, all with the :class:`Problem` body."""
    return {code: {"model": Problem} for code in codes}
