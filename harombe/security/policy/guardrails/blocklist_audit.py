"""The ``blocklist_audit`` stage: what the code's content says, read from its literals and calls.

Refused, each as ``Line N: <what>``:

* unsafe deserialisation: ``pickle``/``marshal``/``dill``/``cloudpickle`` loads, ``shelve.open``,
  ``yaml.load`` without a safe loader, ``yaml.unsafe_load``/``full_load``, any call with
  ``allow_pickle=True`` (``numpy.load``), pandas' ``compat.pickle_compat`` loads; numpy's
  loaders given ``*``/``**`` arguments, ``allow_pickle`` by position or handed on uncalled,
  ``pandas.read_*``/``pandas.compat.*`` given ``*``/``**``; the string ``"allow_pickle"``;
* weak hashes: ``hashlib.md5``/``sha1`` (also ``hashlib.new("md5")``);
* SQL built with interpolation: an f-string, ``%``, ``.format()`` or ``+`` on text shaped like
  SQL (``SELECT … FROM``, ``INSERT INTO``, ``UPDATE … SET``, ``DELETE FROM``, ``DROP TABLE``…);
* secrets in literals: AWS access key ids, PEM private keys, ``api_key = "…"`` (16+ characters
  of key alphabet, in the literal or as the value assigned to such a name), 32+ hex digits;
* path traversal: ``../`` (or ``..\\``) in a literal.

Like ``ast_scan`` it refuses code it cannot read (one violation), so a profile that runs this
stage alone still refuses a syntax error.
"""

from __future__ import annotations

import ast
import re

from harombe.security.policy.guardrails.folding import Budget
from harombe.security.policy.guardrails.source import Names, Violations, parse, walk
from harombe.security.policy.profiles import Profile

#: (module, function) pairs that turn bytes into arbitrary objects, calling what they name.
UNSAFE_DESERIALIZERS = frozenset({
    ("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"),
    ("_pickle", "load"), ("_pickle", "loads"), ("_pickle", "Unpickler"),
    ("cPickle", "load"), ("cPickle", "loads"), ("marshal", "load"), ("marshal", "loads"),
    ("shelve", "open"), ("dill", "load"), ("dill", "loads"), ("cloudpickle", "load"),
    ("cloudpickle", "loads"), ("jsonpickle", "decode"), ("yaml", "load"),
    ("yaml", "load_all"), ("yaml", "unsafe_load"), ("yaml", "unsafe_load_all"),
    ("yaml", "full_load"), ("yaml", "full_load_all"), ("pandas", "read_pickle"),
    # pandas.compat.pickle_compat.load/loads, pandas.io.pickle.read_pickle: pickle again.
    ("pandas", "load"), ("pandas", "loads"),
})  # fmt: skip
#: numpy loaders that unpickle when ``allow_pickle`` is true, with its index among their
#: positional parameters (``numpy.load(file, mmap_mode, allow_pickle)``).
NUMPY_PICKLE_LOADERS = {"load": 2, "read_array": 1, "NpzFile": 2}
#: Loaders that make ``yaml.load`` safe.
SAFE_YAML_LOADERS = frozenset({"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"})
WEAK_HASHES = frozenset({"md5", "sha1"})

# SELECT … FROM is found in two linear searches (_sql): one pattern with a lazy gap between
# them backtracks quadratically over a long string of SELECTs.
_SQL = re.compile(
    r"\bINSERT\s+INTO\b|\bUPDATE\s+\S+\s+SET\b|\bDELETE\s+FROM\b"
    r"|\b(?:DROP|ALTER|CREATE|TRUNCATE)\s+(?:TABLE|DATABASE|VIEW|INDEX|SCHEMA)\b"
    r"|\bUNION\s+(?:ALL\s+)?SELECT\b|\bEXEC(?:UTE)?\s+(?:sp_|xp_)\w+",
    re.IGNORECASE,
)
_SELECT = re.compile(r"\bSELECT\b", re.IGNORECASE)
_FROM = re.compile(r"\bFROM\b", re.IGNORECASE)
_SECRETS = (
    ("AWS access key ID", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("PEM private key", re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")),
    ("generic secret assignment", re.compile(
        r"(?i)(?:api[_-]?key|api[_-]?secret|secret[_-]?key|access[_-]?key|auth[_-]?token"
        r"|token|password|passwd)\s*[:=]\s*['\"]?[A-Za-z0-9+/=_-]{16,}")),
    ("high-entropy hex string", re.compile(r"\b[0-9a-fA-F]{32,}\b")),
)  # fmt: skip
_SECRET_NAME = re.compile(
    r"(?i)(?:^|_)(?:api_?key|api_?secret|secret_?key|access_?key|auth_?token|token|password"
    r"|passwd|secret)$"
)
_SECRET_VALUE = re.compile(r"[A-Za-z0-9+/=_-]{16,}")
_TRAVERSAL = re.compile(r"\.\.[/\\]")


def blocklist_audit(code: str, profile: Profile) -> list[str]:
    """Violations of ``code`` found in its content (empty: it passed). A syntax error, code
    too large or too deeply nested is one violation; code that is not a str raises
    :class:`~harombe.errors.InvalidArgumentError`."""
    tree = parse(code)
    return tree if isinstance(tree, list) else audit_tree(tree, profile)


def audit_tree(tree: ast.Module, profile: Profile, names: Names | None = None) -> list[str]:
    """:func:`blocklist_audit` of code already parsed. The content checks are the same for
    every profile, except that where the profile allows numpy a ``.load(...)`` whose owner
    the scan cannot resolve is judged as numpy's. ``names``: the tree's, if already read."""
    try:
        audit = _Audit(names or Names(tree), profile)
        for node in walk(tree):
            if not audit.budget.nodes(1):
                return [str(audit.budget.exceeded)]
            audit.judge(node)
    except (RecursionError, MemoryError) as exc:
        return [f"Code is nested too deeply to analyse ({type(exc).__name__}); flatten it"]
    return audit.found.texts()


class _Audit:
    """One pass over the tree, parents first (a call is seen before its function)."""

    def __init__(self, names: Names, profile: Profile) -> None:
        self.names = names
        self.found = Violations()
        self.budget = Budget()
        self.numpy = "numpy" in profile.allowed_imports
        self.called: set[int] = set()  # ids of nodes that are the function of a call
        self._literal: dict[int, bool] = {}

    def judge(self, node: ast.AST) -> None:
        found = self.found
        if isinstance(node, ast.Call):
            self.called.add(id(node.func))
            _call(node, self.names, found)
            self._loader_call(node)
        elif isinstance(node, ast.Attribute | ast.Name):
            self._loader_reference(node)
        if isinstance(node, ast.JoinedStr):
            if any(isinstance(v, ast.FormattedValue) for v in node.values) and _sql(
                " ? ".join(_literal_parts(node))
            ):
                found.add(node, "potential SQL injection via f-string containing SQL keywords")
        elif isinstance(node, ast.BinOp):
            self._binop(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
            _literal(node, found)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                _assigned_secret(node, _target_name(target), node.value, found)
        elif isinstance(node, ast.keyword) and node.arg:
            _assigned_secret(node.value, node.arg, node.value, found)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    _assigned_secret(key, key.value, value, found)

    # -- numpy and pandas loaders ----------------------------------------------------------

    def _loader(self, func: ast.AST) -> str | None:
        """The numpy or pandas loader ``func`` names (dotted), or None. Where the profile
        allows numpy, ``x.load`` of an ``x`` that is not a known module counts as numpy's."""
        candidates = set(self.names.owners(func))
        if (literal := self.names.dotted(func)) is not None:
            candidates.add(literal)
        for dotted in sorted(candidates):
            top, attr = dotted.partition(".")[0], dotted.rpartition(".")[2]
            if top == "numpy" and attr in NUMPY_PICKLE_LOADERS:
                return dotted
            if top == "pandas" and (attr.startswith("read_") or ".compat." in dotted):
                return dotted
        if (
            self.numpy
            and isinstance(func, ast.Attribute)
            and func.attr in NUMPY_PICKLE_LOADERS
            and self.names.qualname(func.value) is None
        ):
            return f"<unresolved>.{func.attr}"
        return None

    def _loader_call(self, node: ast.Call) -> None:
        loader = self._loader(node.func)
        if loader is None:
            return
        spread = any(isinstance(arg, ast.Starred) for arg in node.args)
        if spread or any(keyword.arg is None for keyword in node.keywords):
            self.found.add(
                node,
                f"call to '{loader}()' with * or ** arguments is not allowed (they could pass "
                "allow_pickle); pass its arguments by name",
            )
        slot = NUMPY_PICKLE_LOADERS.get(loader.rpartition(".")[2], len(node.args))
        positional = node.args[slot] if slot < len(node.args) else None
        if (
            positional is not None
            and not loader.startswith("pandas.")
            and not _is_false(positional)
        ):
            self.found.add(
                node,
                f"call to '{loader}()' passes allow_pickle by position; leave it out or pass "
                "allow_pickle=False by name",
            )

    def _loader_reference(self, node: ast.Attribute | ast.Name) -> None:
        if id(node) in self.called or not isinstance(node.ctx, ast.Load):
            return
        loader = self._loader(node)
        if loader is not None and loader.partition(".")[0] == "numpy":
            self.found.add(node, f"reference to '{loader}' outside a direct call is not "
                           "allowed (allow_pickle could reach it by position); call it "
                           "directly")  # fmt: skip

    # -- SQL built by + and % --------------------------------------------------------------

    def _binop(self, node: ast.BinOp) -> None:
        left = node.left
        if isinstance(node.op, ast.Mod) and _sql_text(left):
            self.found.add(node, "potential SQL injection via %-formatting on a string "
                           "containing SQL keywords")  # fmt: skip
        elif isinstance(node.op, ast.Add):
            sides = (node.left, node.right)
            if any(_sql_text(side) for side in sides) and not all(map(self._is_literal, sides)):
                self.found.add(node, "potential SQL injection via string concatenation with "
                               "SQL keywords")  # fmt: skip

    def _is_literal(self, node: ast.AST) -> bool:
        """Whether ``node`` is constants joined by operators (kept per node, so a long
        chain is judged in linear time)."""
        known = self._literal
        pending = [node]
        while pending:
            current = pending[-1]
            if id(current) in known:
                pending.pop()
                continue
            if not isinstance(current, ast.BinOp):
                known[id(current)] = isinstance(current, ast.Constant)
            else:
                todo = [side for side in (current.left, current.right) if id(side) not in known]
                if todo:
                    pending.extend(todo)
                    continue
                known[id(current)] = known[id(current.left)] and known[id(current.right)]
            pending.pop()
        return known[id(node)]


def _call(node: ast.Call, names: Names, found: Violations) -> None:
    func = node.func
    candidates = set(names.owners(func))
    if (literal := names.dotted(func)) is not None:
        candidates.add(literal)
    for dotted in sorted(candidates):
        module, _, attr = dotted.rpartition(".")
        module = module.split(".")[0] if module else module
        if (module, attr) in UNSAFE_DESERIALIZERS and not _safe_yaml(module, attr, node):
            found.add(node, f"call to '{module}.{attr}()' is unsafe deserialization")
        if module == "hashlib" and attr in WEAK_HASHES:
            found.add(node, f"call to 'hashlib.{attr}()' uses weak cryptography")
        if module == "hashlib" and attr == "new" and node.args:
            algorithm = node.args[0]
            chosen = algorithm.value if isinstance(algorithm, ast.Constant) else None
            if isinstance(chosen, str) and chosen.lower() in WEAK_HASHES:
                found.add(node, f"call to 'hashlib.new('{chosen}')' uses weak cryptography")
    for keyword in node.keywords:
        if keyword.arg == "allow_pickle" and not _is_false(keyword.value):
            found.add(node, "call with allow_pickle=True is unsafe deserialization")
    if (
        isinstance(func, ast.Attribute)
        and func.attr in ("format", "format_map")
        and isinstance(func.value, ast.Constant)
        and isinstance(func.value.value, str)
        and _sql(func.value.value)
    ):
        found.add(node, "potential SQL injection via .format() on a string containing SQL keywords")


def _safe_yaml(module: str, attr: str, node: ast.Call) -> bool:
    if module != "yaml" or attr not in ("load", "load_all"):
        return False
    loader = next((k.value for k in node.keywords if k.arg == "Loader"), None)
    if loader is None and len(node.args) > 1:
        loader = node.args[1]
    name = loader.attr if isinstance(loader, ast.Attribute) else getattr(loader, "id", None)
    return name in SAFE_YAML_LOADERS


def _is_false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (False, None, 0)


def _sql_text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and _sql(node.value)


def _sql(text: str) -> bool:
    """Whether ``text`` looks like SQL (see :data:`_SQL`; SELECT … FROM with no ``;`` between)."""
    if _SQL.search(text):
        return True
    select = _SELECT.search(text)
    while select is not None:
        end = text.find(";", select.end())
        stop = len(text) if end < 0 else end
        if _FROM.search(text, select.end(), stop):
            return True
        if end < 0:
            return False
        select = _SELECT.search(text, end)
    return False


def _literal_parts(node: ast.JoinedStr) -> list[str]:
    return [
        v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
    ]


def _literal(node: ast.Constant, found: Violations) -> None:
    value = node.value
    text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    if len(text) >= 16:
        for label, pattern in _SECRETS:
            if pattern.search(text):
                found.add(node, f"string literal matches {label} pattern")
                break
    if text.strip() == "allow_pickle":
        found.add(node, "string 'allow_pickle' is not allowed (it turns on unpickling); leave "
                  "allow_pickle out, or pass allow_pickle=False by name")  # fmt: skip
    if _TRAVERSAL.search(text):
        found.add(node, "string literal contains path traversal sequence ('../')")


def _target_name(target: ast.AST) -> str | None:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def _assigned_secret(
    where: ast.AST, name: str | None, value: ast.AST | None, found: Violations
) -> None:
    if (
        name
        and _SECRET_NAME.search(name)
        and isinstance(value, ast.Constant)
        and isinstance(value.value, str)
        and _SECRET_VALUE.fullmatch(value.value)
    ):
        found.add(where, "string literal matches generic secret assignment pattern")
