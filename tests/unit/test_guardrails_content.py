"""The blocklist_audit stage reads the code's content: unsafe deserialisation, weak hashes, SQL
built by interpolation, secrets and path traversal in literals; ordinary content passes."""

from __future__ import annotations

import pytest

from harombe.security.policy.guardrails import blocklist_audit

from .guardrail_profiles import profile

CAUGHT = [
    ("pickle-loads", "import pickle\npickle.loads(data)",
     "Line 2: call to 'pickle.loads()' is unsafe deserialization"),
    ("pickle-load", "import pickle\npickle.load(f)", "'pickle.load()' is unsafe"),
    ("pickle-unpickler", "import pickle\npickle.Unpickler(f).load()", "'pickle.Unpickler()'"),
    ("pickle-alias", "import pickle as p\np.loads(data)", "'pickle.loads()' is unsafe"),
    ("pickle-from", "from pickle import loads\nloads(data)", "'pickle.loads()' is unsafe"),
    ("pickle-not-imported", "pickle.loads(data)", "'pickle.loads()' is unsafe"),
    ("marshal", "import marshal\nmarshal.loads(b'')", "'marshal.loads()' is unsafe"),
    ("shelve", "import shelve\nshelve.open('db')", "'shelve.open()' is unsafe"),
    ("yaml-load", "import yaml\nyaml.load(text)", "'yaml.load()' is unsafe deserialization"),
    ("yaml-load-full-loader", "import yaml\nyaml.load(text, Loader=yaml.Loader)", "'yaml.load()'"),
    ("yaml-unsafe-load", "import yaml\nyaml.unsafe_load(text)", "'yaml.unsafe_load()'"),
    ("yaml-full-load", "import yaml\nyaml.full_load(text)", "'yaml.full_load()'"),
    ("dill", "import dill\ndill.loads(b'')", "'dill.loads()' is unsafe"),
    ("allow-pickle", "import numpy as np\nnp.load('a.npy', allow_pickle=True)",
     "call with allow_pickle=True is unsafe deserialization"),
    ("read-pickle", "import pandas as pd\npd.read_pickle('x')", "'pandas.read_pickle()'"),
    ("md5", "import hashlib\nhashlib.md5(b'x')", "call to 'hashlib.md5()' uses weak cryptography"),
    ("sha1", "import hashlib\nhashlib.sha1(b'x').hexdigest()", "'hashlib.sha1()' uses weak"),
    ("md5-from", "from hashlib import md5\nmd5(b'x')", "'hashlib.md5()' uses weak cryptography"),
    ("md5-not-for-security", "import hashlib\nhashlib.md5(b'x', usedforsecurity=False)",
     "'hashlib.md5()' uses weak"),
    ("hashlib-new", "import hashlib\nhashlib.new('md5')", "call to 'hashlib.new('md5')'"),
    ("hashlib-new-upper", "import hashlib\nhashlib.new('SHA1')", "'hashlib.new('SHA1')'"),
    ("sql-fstring", "q = f\"SELECT * FROM users WHERE id = {uid}\"",
     "Line 1: potential SQL injection via f-string containing SQL keywords"),
    ("sql-fstring-columns", "q = f'SELECT {cols} FROM t'", "via f-string"),
    ("sql-fstring-lower", "q = f\"select name from users where name = '{n}'\"", "via f-string"),
    ("sql-insert", "q = f\"INSERT INTO t VALUES ({v})\"", "via f-string"),
    ("sql-update", "q = f\"UPDATE t SET a = {v}\"", "via f-string"),
    ("sql-delete", "q = f'DELETE FROM t WHERE id = {i}'", "via f-string"),
    ("sql-drop", "q = f'DROP TABLE {name}'", "via f-string"),
    ("sql-union", "q = f'x UNION SELECT {c}'", "via f-string"),
    ("sql-percent", "q = 'SELECT * FROM t WHERE id = %s' % uid",
     "potential SQL injection via %-formatting on a string containing SQL keywords"),
    ("sql-format", "q = 'SELECT * FROM t WHERE id = {}'.format(uid)",
     "potential SQL injection via .format() on a string containing SQL keywords"),
    ("sql-concat", "q = 'SELECT * FROM t WHERE id = ' + uid",
     "potential SQL injection via string concatenation with SQL keywords"),
    ("aws-key", "k = 'AKIAIOSFODNN7EXAMPLE'", "string literal matches AWS access key ID pattern"),
    ("aws-temp-key", "k = 'ASIAIOSFODNN7EXAMPLE'", "AWS access key ID pattern"),
    ("aws-key-bytes", "k = b'AKIAIOSFODNN7EXAMPLE'", "AWS access key ID pattern"),
    ("pem-rsa", "k = '-----BEGIN RSA PRIVATE KEY-----\\nMII'", "matches PEM private key pattern"),
    ("pem-plain", "k = '-----BEGIN PRIVATE KEY-----'", "PEM private key pattern"),
    ("pem-openssh", "k = '-----BEGIN OPENSSH PRIVATE KEY-----'", "PEM private key pattern"),
    ("secret-in-literal", "cfg = 'api_key=abcdef0123456789abcdXYZ'",
     "string literal matches generic secret assignment pattern"),
    ("secret-assign", "api_key = 'sk-abcdefghijklmnopqrstuvwxyz'", "generic secret assignment"),
    ("secret-upper-name", "OPENAI_API_KEY = 'sk-abcdefghijklmnopqrstuvwxyz'", "generic secret"),
    ("secret-password", "db_password = 'hunter2hunter2hunter2'", "generic secret assignment"),
    ("secret-annotated", "token: str = 'ghp_abcdefghijklmnopqrstuv'", "generic secret"),
    ("secret-attribute", "self.secret_key = 'abcdefghijklmnopqrstu'", "generic secret"),
    ("secret-keyword", "connect(password='correcthorsebatterystaple')", "generic secret"),
    ("secret-dict", "cfg = {'auth_token': 'abcdefghijklmnopqrstuvwx'}", "generic secret"),
    ("hex-32", "h = 'd41d8cd98f00b204e9800998ecf8427e'", "matches high-entropy hex string"),
    ("hex-64", "h = '" + "ab" * 32 + "'", "high-entropy hex string pattern"),
    ("traversal", "p = '../etc/passwd'",
     "Line 1: string literal contains path traversal sequence ('../')"),
    ("traversal-inner", "p = 'data/../../etc/shadow'", "path traversal sequence"),
    ("traversal-backslash", "p = '..\\\\windows\\\\system32'", "path traversal sequence"),
    ("traversal-fstring", "p = f'../{name}'", "path traversal sequence"),
    ("traversal-bytes", "p = b'../x'", "path traversal sequence"),
    ("traversal-docstring", "def f():\n    '''Reads ../config.'''", "Line 2: string literal"),
]  # fmt: skip

PASSES = [
    ("yaml-safe-load", "import yaml\nyaml.safe_load(text)"),
    ("yaml-load-safe-loader", "import yaml\nyaml.load(text, Loader=yaml.SafeLoader)"),
    ("yaml-load-csafe-positional", "import yaml\nyaml.load(text, yaml.CSafeLoader)"),
    ("json-loads", "import json\njson.loads('{}')"),
    ("sha256", "import hashlib\nhashlib.sha256(b'x').hexdigest()"),
    ("hashlib-new-sha256", "import hashlib\nhashlib.new('sha256')"),
    ("np-load-plain", "import numpy as np\nnp.load('a.npy')"),
    ("np-load-no-pickle", "import numpy as np\nnp.load('a.npy', allow_pickle=False)"),
    ("select-prose", "print(f'Select {n} items')"),
    ("updated-prose", "print(f'Updated {n} rows, created {m}')"),
    ("delete-prose", "print(f'Deleted {n} files')"),
    ("sql-no-interpolation", "q = 'SELECT * FROM t'"),
    ("sql-fstring-no-fields", "q = f'SELECT * FROM t'"),
    ("sql-placeholder", "cur.run('SELECT * FROM t WHERE id = ?', (uid,))"),
    ("sql-literal-concat", "q = 'SELECT * ' + 'FROM t'"),
    ("percent-prose", "print('%d rows selected' % n)"),
    ("short-secret", "token = 'abc'"),
    ("secret-not-literal", "api_key = env['API_KEY']"),
    ("secret-with-spaces", "password = 'correct horse battery staple'"),
    ("max-tokens", "max_tokens = 4096"),
    ("uuid", "u = '123e4567-e89b-12d3-a456-426614174000'"),
    ("short-hex", "h = 'deadbeef'"),
    ("dot-path", "p = './data.csv'"),
    ("dotted-name", "p = 'a..b'"),
    ("ellipsis", "s = '...'"),
    ("pem-public", "k = '-----BEGIN PUBLIC KEY-----'"),
]  # fmt: skip


@pytest.mark.parametrize(("code", "fragment"), [r[1:] for r in CAUGHT], ids=[r[0] for r in CAUGHT])
def test_content_is_refused(code: str, fragment: str) -> None:
    """The content is refused and one violation names what was found."""
    violations = blocklist_audit(code, profile("permissive"))
    assert any(fragment in v for v in violations), violations


@pytest.mark.parametrize("code", [c for _, c in PASSES], ids=[i for i, _ in PASSES])
def test_ordinary_content_passes(code: str) -> None:
    """Content that only looks like a finding (safe loaders, SQL prose, short hex) passes."""
    assert blocklist_audit(code, profile("permissive")) == []


def test_the_audit_alone_refuses_code_it_cannot_read() -> None:
    """A profile running only blocklist_audit still refuses a syntax error."""
    assert blocklist_audit("print((1)", profile("minimal")) == [
        "SyntaxError: '(' was never closed (line 1)"
    ]
