"""Sandboxes that start with a dependency environment, and the named environments they use.

An environment is named in the configuration (``security.sandbox.environments``), defined
through :meth:`Environments.define`, or given as a plain list of requirements. It is resolved
and unpacked once on the host (:mod:`.environments`); a sandbox gets it by a ``.pth`` file and,
for Python sessions, the ``preimport`` modules imported before the sandbox is handed out, so a
claim from its warm pool finds ``import pandas`` already done. Nothing of this counts as a run of
the user's: a pooled sandbox stays unused until claimed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Coroutine, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import ValidationError

from harombe.config_environments import ENVIRONMENT_NAME, EnvironmentConfig
from harombe.errors import InvalidArgumentError, SandboxStartError, UsageError
from harombe.security.policy.profiles import Profile
from harombe.security.runtime.environments import Environment, Progress
from harombe.security.runtime.installs import Installs
from harombe.security.runtime.launcher import Launcher
from harombe.security.runtime.packages import parse_spec
from harombe.security.runtime.packages.wheels import Target
from harombe.security.runtime.runs import Runs
from harombe.security.runtime.sandbox import Sandbox
from harombe.security.runtime.tasks import settle

log = structlog.get_logger(__name__)

PREPARE_TIMEOUT_S = 300.0
MAX_REQUIREMENTS = 200


@dataclass(frozen=True)
class Prepared:
    """What a sandbox of one environment starts with."""

    environment: Environment
    preimport: tuple[str, ...]
    pool_size: int
    best_effort: bool = False  # a preimport that fails is skipped (a list's own modules)

    @property
    def pool_id(self) -> str:
        """What its warm pool is keyed by: the environment and how its sandboxes start (two
        names of one set with other preimports keep pools of their own)."""
        body = repr((self.environment.key, self.preimport, self.best_effort))
        return f"{self.environment.key}-{hashlib.sha256(body.encode()).hexdigest()[:12]}"


class Environments:
    """The named environments of one manager, and how a sandbox gets one."""

    def __init__(
        self, installs: Installs, runs: Runs, configured: Mapping[str, EnvironmentConfig]
    ) -> None:
        self._installs = installs
        self._runs = runs
        self._named: dict[str, EnvironmentConfig] = dict(configured)
        self.prepared: dict[str, Prepared] = {}  # by pool id: what pools are keyed by
        self.targets: dict[str, Target] = {}  # by image: learnt from its first sandbox

    @property
    def names(self) -> list[str]:
        return sorted(self._named)

    def define(
        self,
        name: str,
        requirements: Sequence[str],
        *,
        preimport: Sequence[str] = (),
        pool_size: int = 1,
    ) -> None:
        """Name a set of PyPI requirements (replacing one of the same name); nothing is built
        until a sandbox asks for it or :meth:`SandboxManager.prepare_environment` runs."""
        if not isinstance(name, str) or not re.fullmatch(ENVIRONMENT_NAME, name):
            raise InvalidArgumentError(
                f"environment name {str(name)[:80]!r} must be lowercase letters, digits, '_', "
                "'.' or '-' (at most 63), like 'data-science'"
            )
        for what, value in (("requirements", requirements), ("preimport", preimport)):
            if not isinstance(value, list | tuple):
                raise InvalidArgumentError(
                    f"environment {name!r}: {what} must be a list of strings like ['pandas'], "
                    f"got {type(value).__name__}"
                )
        try:
            self._named[name] = EnvironmentConfig(
                requirements=list(requirements), preimport=list(preimport), pool_size=pool_size
            )
        except (ValidationError, TypeError) as exc:
            raise InvalidArgumentError(f"environment {name!r}: {exc}") from None

    def requirements_of(
        self, environment: str | Sequence[str]
    ) -> tuple[list[str], EnvironmentConfig]:
        """The requirements (and settings) ``environment`` stands for: a defined name, or a list
        of requirements used as they are (no preimports, one pooled sandbox)."""
        if not isinstance(environment, str | list | tuple):
            raise InvalidArgumentError(
                "environment must be a defined environment's name or a list of requirement "
                f"strings like ['pandas>=2'], got {type(environment).__name__}"
            )
        if isinstance(environment, str):
            found = self._named.get(environment)
            if found is None:
                raise UsageError(
                    f"no environment named {environment[:80]!r}; define it in "
                    "security.sandbox.environments or with define_environment() (known: "
                    f"{', '.join(self.names) or 'none'})"
                )
            return list(found.requirements), found
        wanted = list(environment)
        if (
            not wanted
            or len(wanted) > MAX_REQUIREMENTS
            or not all(isinstance(r, str) and r.strip() for r in wanted)
        ):
            raise InvalidArgumentError(
                f"dependencies must be 1 to {MAX_REQUIREMENTS} requirement strings like "
                "'pandas>=2', or the name of an environment"
            )
        return wanted, EnvironmentConfig(requirements=wanted, pool_size=1)

    async def ensure(
        self,
        environment: str | Sequence[str],
        *,
        target: Target,
        refresh: bool = False,
        on_progress: Progress | None = None,
    ) -> Prepared:
        """Build (or find) ``environment`` for ``target``; raises the fetch's error naming the
        requirement that failed, :class:`UsageError` when the install cache is off."""
        store = self._installs.store
        if store is None:
            raise UsageError(
                "dependency environments need the install cache; set "
                "security.sandbox.install_cache.enabled: true"
            )
        requirements, settings = self.requirements_of(environment)
        for text in requirements:  # the same gate as code_install_package: registry specs only
            parse_spec(text, "pypi")
        env = await store.ensure(
            requirements, target=target, refresh=refresh, on_progress=on_progress
        )
        if isinstance(environment, str):
            prepared = Prepared(env, tuple(settings.preimport), settings.pool_size)
        else:  # a list: its requested distributions' modules, imported where they can be
            prepared = Prepared(env, env.modules, settings.pool_size, best_effort=True)
        self.prepared[prepared.pool_id] = prepared
        return prepared

    async def prepare(self, box: Sandbox, prepared: Prepared) -> None:
        """Link ``prepared``'s environment into ``box`` and import its preimports in the
        session; :class:`SandboxStartError` naming the failure. Counts as no run."""
        env = prepared.environment
        async with box.lock:
            await self._installs.link(box, env)  # no process: not a run
            if prepared.preimport and box.language == "python":
                code = _preimport_code(prepared)
                done = await self._runs.run(
                    box, ["python3", "-"], code.encode(), language="python",
                    timeout_s=PREPARE_TIMEOUT_S, session=True,
                )  # fmt: skip
                box.runs -= 1
                if not done.success:
                    raise SandboxStartError(
                        f"preimport of {', '.join(prepared.preimport)} failed in environment "
                        f"{env.key}: {(done.stderr or done.error or done.status)[-800:]}; "
                        "check the names are modules the requirements provide"
                    )
        box.environment = env.key
        log.info("environment.prepared", sandbox_id=box.sandbox_id, key=env.key)


def _preimport_code(prepared: Prepared) -> str:
    """Imports of the preimport modules; best effort: each in a try, failures ignored."""
    if not prepared.best_effort:
        return "".join(f"__import__({name!r})\n" for name in prepared.preimport)
    names = list(prepared.preimport)
    if not names:
        return ""
    body = "    try:\n        __import__(_m)\n    except Exception:\n        pass\n"
    return f"for _m in {names!r}:\n{body}del _m\n"


def pooled_launch(
    launcher: Launcher, environments: Environments, profiles: Mapping[str, Profile]
) -> Callable[[Hashable], Coroutine[Any, Any, Sandbox]]:
    """The warm pool's launch: a key is (language, image, runtime, limits, profile fingerprint
    [, environment pool id]); a sandbox of an environment is prepared before it waits."""

    async def launch(key: Hashable) -> Sandbox:
        assert isinstance(key, tuple)
        box = await launcher.launch_pooled(key[0], profiles.get(key[4]))
        if len(key) > 5:
            try:
                await environments.prepare(box, environments.prepared[key[5]])
            except BaseException:
                await settle(launcher.discard(box))
                raise
        return box

    return launch
