"""What the scans refuse since the review: class patterns that read attributes by a name set at
run time, computed keys into namespaces, numpy/pandas loaders that could unpickle, and inputs
built to make the scan slow (each one violation, judged within its budget); observed stages
all report; ordinary code around these features still passes."""

from __future__ import annotations

import pytest

from harombe.security.policy.guardrails import blocklist_audit, run_stages
from harombe.security.policy.guardrails.folding import MAX_SCAN_NODES, fold
from harombe.security.policy.guardrails.source import parse
from harombe.security.policy.profiles import Profile, resolve_profiles

from .guardrail_profiles import profile

POSITIONAL = "positional sub-pattern in class pattern"

# fmt: off
MATCHING = [
    ("positional-user-class", "match x:\n    case Point(a):\n        pass", POSITIONAL),
    ("positional-dotted-class", "import collections\nmatch x:\n    case collections.Counter(a):"
     "\n        pass", "class pattern 'collections.Counter(...)'"),
    ("positional-beside-keyword", "match x:\n    case P(1, y=2):\n        pass", POSITIONAL),
    ("positional-shadowed-int", "int = G\nmatch x:\n    case int(a):\n        pass", POSITIONAL),
    ("positional-int-bound-as-arg", "def f(int):\n    match x:\n        case int(a):\n"
     "            pass", POSITIONAL),
    ("positional-star-import", "from math import *\nmatch x:\n    case int(a):\n        pass",
     POSITIONAL),
    ("match-args-bound", "class G:\n    __match_args__ = ('a',)",
     "assignment to '__match_args__' is not allowed (it decides what class patterns match)"),
    ("match-args-computed", "class G:\n    __match_args__ = (name,)", "'__match_args__'"),
    ("match-args-set-later", "G.__match_args__ = (name,)", "access to '__match_args__'"),
    ("match-args-read", "names = type(x).__match_args__", "access to '__match_args__'"),
    ("match-args-in-type-call", "G = type('G', (), {'__match_args__': ('a',)})",
     "string literal '__match_args__'"),
    ("match-args-keyword", "G = type('G', (), dict(__match_args__=n))",
     "keyword argument '__match_args__'"),
    ("instancecheck-defined", "class Any_(type):\n    def __instancecheck__(cls, o):\n"
     "        return True", "assignment to '__instancecheck__'"),
    ("subclasscheck-defined", "class M(type):\n    def __subclasscheck__(cls, o):\n"
     "        return True", "assignment to '__subclasscheck__'"),
    ("subclasshook-defined", "class A:\n    @classmethod\n    def __subclasshook__(cls, o):\n"
     "        return True", "assignment to '__subclasshook__'"),
    ("instancecheck-built", "k = '__instance' + 'check__'", "spells a blocked attribute"),
]
NAMESPACES = [
    ("globals-computed-key", "globals()[k]", "computed key into a namespace ('globals()')"),
    ("vars-computed-key", "vars(m)[k]", "computed key into a namespace ('vars()')"),
    ("dict-computed-key", "o.__dict__[k]", "computed key into a namespace ('.__dict__')"),
    ("func-globals-computed", "f.__globals__[name]", "('.__globals__')"),
    ("frame-locals-computed", "fr.f_locals[k]", "('.f_locals')"),
    ("builtins-name-computed", "__builtins__[k]", "('__builtins__')"),
    ("sys-modules-computed", "import sys\nsys.modules[k]", "('sys.modules')"),
    ("sys-modules-alias", "import sys as s\ns.modules[name]", "('sys.modules')"),
]
# fmt: on


@pytest.mark.parametrize(("code", "fragment"), [r[1:] for r in MATCHING + NAMESPACES],
                         ids=[r[0] for r in MATCHING + NAMESPACES])  # fmt: skip
def test_class_patterns_and_namespaces_are_refused(code: str, fragment: str) -> None:
    """A class pattern that could read an attribute named at run time, or a computed key
    into a namespace, is refused with a violation saying why."""
    violations = run_stages(code, profile("permissive")).violations
    assert any(fragment in v for v in violations), violations


# fmt: off
ORDINARY = [
    ("keyword-class-pattern", "match p:\n    case Point(x=0, y=y):\n        print(y)"),
    ("builtin-positional", "match v:\n    case int(n) | float(n):\n        print(n)"),
    ("str-positional", "match v:\n    case str(s) if s:\n        print(s)"),
    ("tuple-of-patterns", "match v:\n    case (1, [a, *rest]):\n        print(a, rest)"),
    ("class-no-subpatterns", "match v:\n    case Point():\n        pass"),
    ("getattr-hook", "class Proxy:\n    def __getattr__(self, name):\n        return name"),
    ("getattribute-hook", "class P:\n    def __getattribute__(self, name):\n        return 1"),
    ("class-getitem", "class Box:\n    def __class_getitem__(cls, item):\n        return cls"),
    ("set-name", "class Field:\n    def __set_name__(self, owner, name):\n"
     "        self.name = name"),
    ("literal-key-into-dict", "d = {}\nd['a'] = 1\nprint(d['a'])"),
    ("computed-key-into-list", "xs = [1, 2]\ni = 1\nprint(xs[i])"),
    ("slice", "xs = [1, 2, 3]\nprint(xs[1:])"),
]
# fmt: on


@pytest.mark.parametrize("code", [c for _, c in ORDINARY], ids=[i for i, _ in ORDINARY])
def test_ordinary_patterns_and_classes_pass(code: str) -> None:
    """Keyword class patterns, builtin self-matching types and attribute hooks of the code's
    own classes pass the shipped minimal profile."""
    assert run_stages(code, profile("minimal")).violations == ()


# fmt: off
LOADERS = [
    ("np-load-double-star", "import numpy as np\nnp.load(p, **{'allow_pickle': True})",
     "call to 'numpy.load()' with * or ** arguments is not allowed"),
    ("np-load-kwargs-name", "import numpy as np\nnp.load(p, **kw)", "with * or ** arguments"),
    ("np-load-star", "import numpy as np\nnp.load(*args)", "with * or ** arguments"),
    ("np-load-positional", "import numpy as np\nnp.load(p, None, True)",
     "call to 'numpy.load()' passes allow_pickle by position"),
    ("np-load-from-import", "from numpy import load\nload(p, None, 1)", "by position"),
    ("np-read-array", "import numpy as np\nnp.lib.format.read_array(f, True)",
     "'numpy.lib.format.read_array()' passes allow_pickle by position"),
    ("np-npzfile", "import numpy as np\nnp.lib.npyio.NpzFile(f, False, True)", "by position"),
    ("np-load-unresolved-owner", "import numpy as np\n[np][0].load(p, None, True)",
     "'<unresolved>.load()' passes allow_pickle by position"),
    ("np-load-partial", "import functools, numpy as np\nfunctools.partial(np.load, p, None, "
     "True)", "reference to 'numpy.load' outside a direct call is not allowed"),
    ("np-load-aliased-through-list", "import numpy as np\nL = [np.load][0]",
     "reference to 'numpy.load' outside a direct call"),
    ("allow-pickle-dict-key", "kw = {'allow_pickle': True}", "string 'allow_pickle'"),
    ("allow-pickle-item", "kw = {}\nkw['allow_pickle'] = 1", "string 'allow_pickle'"),
    ("allow-pickle-keyword", "f(allow_pickle=1)", "call with allow_pickle=True"),
    ("pd-read-star-star", "import pandas as pd\npd.read_csv(p, **opts)",
     "call to 'pandas.read_csv()' with * or ** arguments"),
    ("pd-compat-star-star", "import pandas as pd\npd.compat.pickle_compat.loads(b, **kw)",
     "with * or ** arguments"),
    ("pd-pickle-compat-loads", "import pandas as pd\npd.compat.pickle_compat.loads(b'x')",
     "call to 'pandas.loads()' is unsafe deserialization"),
    ("pd-pickle-compat-from", "from pandas.compat.pickle_compat import load\nload(f)",
     "'pandas.load()' is unsafe deserialization"),
]
# fmt: on


@pytest.mark.parametrize(
    ("code", "fragment"), [r[1:] for r in LOADERS], ids=[r[0] for r in LOADERS]
)
def test_loaders_that_could_unpickle_are_refused(code: str, fragment: str) -> None:
    """numpy and pandas loaders reached with arguments the audit cannot read, allow_pickle by
    position, as a value handed elsewhere, or pandas' own unpickler, are refused."""
    violations = blocklist_audit(code, profile("data-science"))
    assert any(fragment in v for v in violations), violations


def test_the_data_science_blocklist_refuses_pickle_compat() -> None:
    """pandas.compat.pickle_compat is on data-science's blocklist, however it is reached."""
    for code in ("import pandas as pd\nm = pd.compat.pickle_compat",
                 "from pandas.compat import pickle_compat",
                 "import pandas.compat.pickle_compat"):  # fmt: skip
        report = run_stages(code, profile("data-science"))
        assert report.rejected and "pickle_compat" in report.violations[0], report


# fmt: off
ORDINARY_LOADS = [
    ("np-load", "import numpy as np\na = np.load('a.npy')"),
    ("np-load-mmap", "import numpy as np\na = np.load('a.npy', 'r')"),
    ("np-load-false", "import numpy as np\na = np.load('a.npy', None, False)"),
    ("np-load-keywords", "import numpy as np\na = np.load('a.npy', mmap_mode='r')"),
    ("pd-read-csv", "import pandas as pd\ndf = pd.read_csv('a.csv', sep=';')"),
    ("json-load", "import json\nd = json.load(f)"),
    ("json-loads-kwargs", "import json\nd = json.loads(s, **opts)"),
]
# fmt: on


@pytest.mark.parametrize("code", [c for _, c in ORDINARY_LOADS], ids=[i for i, _ in ORDINARY_LOADS])
def test_ordinary_loading_passes(code: str) -> None:
    """Loaders called directly, with allow_pickle left out or False, pass."""
    assert run_stages(code, profile("data-science")).violations == ()


def _observe_both() -> Profile:
    modes = {"ast_scan": "observe", "blocklist_audit": "observe"}
    document = {"extends": "minimal", "audit": {"mode": modes}}
    return resolve_profiles({"minimal": {"imports": {"allowed": ["math"]}}, "w": document})["w"]


def test_every_observed_stage_reports() -> None:
    """Two observed stages that both find something: one report naming both, with each
    finding's stage."""
    report = run_stages("import os\np = '../x'", _observe_both())
    assert not report.rejected and report.stage == "ast_scan, blocklist_audit"
    assert [stage for stage, _ in report.findings] == ["ast_scan", "blocklist_audit"]
    assert report.violations == tuple(v for _, v in report.findings)


def test_an_unreadable_input_is_reported_once_when_both_stages_observe() -> None:
    """A syntax error found by both observed stages is listed once."""
    report = run_stages("print((1)", _observe_both())
    assert report.violations == ("SyntaxError: '(' was never closed (line 1)",)


TOO_COMPLEX = "Code is too complex to analyse"
# fmt: off
EXHAUSTING = [
    ("many-literal-chains", "\n".join(["x = " + "+".join(["'a'"] * 900)] * 260),
     "more than 250,000 syntax nodes"),
    ("long-literal-chains", "\n".join(["x = " + "+".join(["'aaaaaaaaa'"] * 700)] * 100),
     "strings built from literals are too long and many"),
    ("many-nodes", "x = [" + ",".join(["a.b"] * 90_000) + "]", "more than 250,000"),
    ("annotations-multiply-nodes", "\n".join(
        "def f(x: 'Dict[\"str\", \"List[int]\"]') -> 'Optional[\"int\"]': pass"
        for _ in range(8000)), "more than 250,000"),
]
# fmt: on


@pytest.mark.parametrize(("code", "fragment"), [r[1:] for r in EXHAUSTING],
                         ids=[r[0] for r in EXHAUSTING])  # fmt: skip
def test_inputs_over_the_budget_are_one_violation(code: str, fragment: str) -> None:
    """Code past the node or folding budget is refused as one 'too complex' violation."""
    report = run_stages(code, profile("minimal"))
    assert report.rejected and len(report.violations) == 1, report.violations[:3]
    assert report.violations[0].startswith(TOO_COMPLEX) and fragment in report.violations[0]


def test_a_long_literal_chain_still_folds() -> None:
    """A chain of a thousand literal concatenations is folded whole (no depth cut), so a
    blocked name at its end is still seen."""
    code = "x = " + "+".join(["''"] * 1000) + "+'__glo'+'bals__'"
    report = run_stages(code, profile("minimal"))
    assert any("spells a blocked attribute" in v for v in report.violations), report


def test_the_node_budget_sits_above_large_ordinary_code() -> None:
    """40,000 lines of assignments parse to a tree under the budget."""
    tree = parse("x = 1\n" * 40_000)
    assert not isinstance(tree, list)
    assert MAX_SCAN_NODES > 160_000


@pytest.mark.parametrize(
    ("source", "expected"),
    [("'a' + 'b'", "ab"), ("chr(95) * 2", "__"), ("'-'.join(['a', 'b'])", "a-b"),
     ("'AB'.lower()[::-1]", "ba"), ("f'{\"x\"}y'", "xy"), ("name + 'a'", None),
     ("'x' * 10**9", None)],
    ids=["concat", "chr-repeat", "join", "case-and-slice", "fstring", "not-literal", "too-long"],
)  # fmt: skip
def test_fold_evaluates_literal_strings(source: str, expected: str | None) -> None:
    """fold() gives the string built from literals, None for anything else or too long."""
    tree = parse(f"x = {source}")
    assert not isinstance(tree, list)
    assert fold(tree.body[0].value) == expected  # type: ignore[attr-defined]
