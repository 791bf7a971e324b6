"""The ``blocklist_audit`` stage: what the code's content says, read from its literals and calls.

Refused, each as ``Line N: <what>``:

* unsafe deserialisation: ``pickle``/``marshal``/``dill``/``cloudpickle`` loads, ``shelve.open``,
  ``yaml.load`` without a safe loader, ``yaml.unsafe_load``/``full_load``, any call with
  ``allow_pickle=True`` (``numpy.load``);
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
})  # fmt: skip
#: Loaders that make ``yaml.load`` safe.
SAFE_YAML_LOADERS = frozenset({"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"})
WEAK_HASHES = frozenset({"md5", "sha1"})

_SQL = re.compile(
    r"\bSELECT\b[^;]*?\bFROM\b|\bINSERT\s+INTO\b|\bUPDATE\s+\S+\s+SET\b|\bDELETE\s+FROM\b"
    r"|\b(?:DROP|ALTER|CREATE|TRUNCATE)\s+(?:TABLE|DATABASE|VIEW|INDEX|SCHEMA)\b"
    r"|\bUNION\s+(?:ALL\s+)?SELECT\b|\bEXEC(?:UTE)?\s+(?:sp_|xp_)\w+",
    re.IGNORECASE,
)
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


def audit_tree(tree: ast.Module, profile: Profile) -> list[str]:
    """:func:`blocklist_audit` of code already parsed (``profile`` is not consulted: the
    content checks are the same for every profile)."""
    try:
        names = Names(tree)
        found = Violations()
        for node in walk(tree):
            _judge(node, names, found)
    except (RecursionError, MemoryError) as exc:
        return [f"Code is nested too deeply to analyse ({type(exc).__name__}); flatten it"]
    return found.texts()


def _judge(node: ast.AST, names: Names, found: Violations) -> None:
    if isinstance(node, ast.Call):
        _call(node, names, found)
    elif isinstance(node, ast.JoinedStr):
        if any(isinstance(v, ast.FormattedValue) for v in node.values) and _SQL.search(
            " ? ".join(_literal_parts(node))
        ):
            found.add(node, "potential SQL injection via f-string containing SQL keywords")
    elif isinstance(node, ast.BinOp):
        _binop(node, found)
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
        and _SQL.search(func.value.value)
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


def _binop(node: ast.BinOp, found: Violations) -> None:
    left = node.left
    if isinstance(node.op, ast.Mod) and _sql_text(left):
        found.add(node, "potential SQL injection via %-formatting on a string containing SQL "
                  "keywords")  # fmt: skip
    elif isinstance(node.op, ast.Add):
        sides = (node.left, node.right)
        texts = [side for side in sides if _sql_text(side)]
        others = [side for side in sides if not _is_literal(side)]
        if texts and others:
            found.add(node, "potential SQL injection via string concatenation with SQL keywords")


def _sql_text(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and bool(_SQL.search(node.value))
    )


def _is_literal(node: ast.AST) -> bool:
    return all(isinstance(part, ast.BinOp | ast.Constant | ast.operator) for part in walk(node))


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
