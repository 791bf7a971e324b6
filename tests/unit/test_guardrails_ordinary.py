"""Ordinary code passes every stage of its profile: no false positives on what a model writes
for computation, text, dates and data (the guardrails must not make the sandbox useless)."""

from __future__ import annotations

import pytest

from harombe.security.policy.guardrails import run_stages

from .guardrail_profiles import profile

MINIMAL = [
    ("print", "print('hello')"),
    ("eval-in-a-string", "s = \"eval('x')\"\nprint(s)"),
    ("open-in-a-string", "print('open the door, then exec the plan')"),
    ("dunder-prose", "print('use obj.__class__ with care')"),
    ("stdev", "import statistics\nprint(statistics.stdev([1, 2, 3, 4]))"),
    ("mean-median", "from statistics import mean, median\nprint(mean([1, 2]), median([3, 1]))"),
    ("decimal", "from decimal import Decimal\nprint(Decimal('1.10') + Decimal('2.20'))"),
    ("decimal-context", "import decimal\ndecimal.getcontext().prec = 10"),
    ("localcontext", "from decimal import localcontext\nwith localcontext() as ctx:\n"
     "    ctx.prec = 5"),
    ("lru-cache", "import functools\n@functools.lru_cache(maxsize=None)\ndef fib(n: int) -> int:\n"
     "    return n if n < 2 else fib(n - 1) + fib(n - 2)\nprint(fib(30))"),
    ("annotations", "def f(x: int, y: list[str]) -> dict[str, int]:\n    return {}"),
    ("string-annotations", "def f(x: 'int') -> 'str':\n    return str(x)"),
    ("future-annotations", "from __future__ import annotations\ndef f(x: int) -> int:\n"
     "    return x"),
    ("typing", "from typing import Optional, Union, Any, Callable\n"
     "def f(x: Optional[int] = None) -> Union[int, str]:\n    return x or 'none'"),
    ("generic", "from typing import TypeVar, Generic\nT = TypeVar('T')\nclass Box(Generic[T]):\n"
     "    def __init__(self, v: T) -> None:\n        self.v = v"),
    ("literal-annotation", "from typing import Literal\n"
     "def f(s: Literal['open', 'closed']) -> 'int':\n    return 1"),
    ("forward-reference", "class Node:\n    parent: 'Node | None' = None\n"
     "    def children(self) -> 'list[Node]':\n        return []"),
    ("unparsable-annotation", "def f(x: 'a number, please') -> None:\n    pass"),
    ("typed-namedtuple", "from typing import NamedTuple\nclass P(NamedTuple):\n    x: int\n"
     "    y: int = 0"),
    ("attrgetter-real", "import operator\nprint(operator.attrgetter('real')(3))"),
    ("attrgetter-sort", "from operator import attrgetter\n"
     "rows = sorted(points, key=attrgetter('x', 'y'))"),
    ("itemgetter", "import operator\n"
     "print(sorted([(1, 'b'), (0, 'a')], key=operator.itemgetter(1)))"),
    ("itemgetter-variable", "from operator import itemgetter\nget = itemgetter(i)"),
    ("methodcaller", "import operator\nprint(list(map(operator.methodcaller('upper'), ['a'])))"),
    ("methodcaller-args", "from operator import methodcaller\nsplit = methodcaller('split', ',')"),
    ("reduce-add", "import functools, operator\nprint(functools.reduce(operator.add, [1, 2, 3]))"),
    ("partial", "import functools\nbinary = functools.partial(int, base=2)\nprint(binary('101'))"),
    ("fstring", "name = 'x'\nprint(f'hello {name!r} {3.14159:.2f} {name:>10}')"),
    ("fstring-nested", "w = 8\nprint(f'{42:{w}d}')"),
    ("percent-format", "print('%s has %d items' % ('cart', 3))"),
    ("str-format", "print('{} {:>5} {name}'.format('a', 3, name='n'))"),
    ("format-real", "print('{0.real} {0.imag}'.format(1 + 2j))"),
    ("format-name", "def f():\n    pass\nprint('{0.__name__}'.format(f))"),
    ("comprehensions", "sq = [x * x for x in range(10) if x % 2]\nd = {k: v for k, v in "
     "zip('ab', [1, 2])}\ns = {c for c in 'hello'}\ng = sum(i for i in range(5))"),
    ("class", "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
     "    def __repr__(self):\n        return f'Point({self.x}, {self.y})'\n"
     "    def __eq__(self, other):\n        return (self.x, self.y) == (other.x, other.y)\n"
     "    __hash__ = None"),
    ("slots", "class P:\n    __slots__ = ('x', 'y')\n    def __init__(self):\n"
     "        self.x = self.y = 0"),
    ("super-init", "class A:\n    def __init__(self, n):\n        self.n = n\nclass B(A):\n"
     "    def __init__(self):\n        super().__init__(1)"),
    ("init-subclass", "class Base:\n    def __init_subclass__(cls, **kw):\n"
     "        super().__init_subclass__(**kw)"),
    ("dunder-methods", "class V:\n    def __len__(self):\n        return 0\n"
     "    def __iter__(self):\n        return iter([])\n    def __getitem__(self, i):\n"
     "        return i\n    def __setattr__(self, k, v):\n        raise AttributeError(k)"),
    ("dunder-call", "print((3).__add__(4), [1, 2].__len__())"),
    ("type-name", "class A:\n    def __repr__(self):\n        return f'{type(self).__name__}()'"),
    ("function-name-doc", "def f():\n    '''Doc.'''\nprint(f.__name__, f.__doc__, f.__qualname__)"),
    ("module-dunders", "__all__ = ['f']\n__version__ = '1.0'\n__doc__ = 'x'\nprint(__doc__)"),
    ("main-guard", "def main():\n    print(1)\nif __name__ == '__main__':\n    main()"),
    ("dunder-strings", "d = {'__main__': 1, '__init__': 2}\nprint(d)"),
    ("namedtuple", "from collections import namedtuple\nP = namedtuple('P', 'x y')\n"
     "print(P(1, 2)._asdict())"),
    ("collections", "from collections import Counter, defaultdict, deque\n"
     "print(Counter('abca').most_common(1), defaultdict(int), deque([1]))"),
    ("re-compile", "import re\npat = re.compile(r'\\d+')\nprint(pat.findall('a1b22'))"),
    ("re-alias-compile", "import re as regex\nprint(regex.compile('a+').match('aa'))"),
    ("re-functions", "import re\nprint(re.sub(r'\\s+', ' ', 'a  b'), re.split(',', 'a,b'))"),
    ("json", "import json\nprint(json.dumps({'a': [1, 2]}, indent=2), json.loads('[1]'))"),
    ("csv", "import csv\nfor row in csv.reader(['a,b', 'c,d']):\n    print(row)"),
    ("datetime", "from datetime import datetime, timedelta\n"
     "print(datetime(2020, 1, 1) + timedelta(days=1))"),
    ("date-format", "import datetime\nprint(datetime.date(2024, 5, 1).strftime('%Y-%m-%d'))"),
    ("random", "import random\nrandom.seed(1)\nprint(random.randint(1, 6), random.choice('ab'))"),
    ("random-instance", "import random\nprint(random.Random(42).random())"),
    ("itertools", "import itertools\nprint(list(itertools.permutations([1, 2, 3])))"),
    ("chain", "import itertools\nprint(list(itertools.chain.from_iterable([[1], [2]])))"),
    ("fractions", "from fractions import Fraction\nprint(Fraction(1, 3) + Fraction(1, 6))"),
    ("math", "import math\nprint(math.factorial(10), math.isclose(0.1 + 0.2, 0.3), math.inf)"),
    ("textwrap", "import textwrap\nprint(textwrap.dedent('  a\\n  b'), textwrap.fill('x' * 90))"),
    ("string-template", "import string\nprint(string.Template('$x').substitute(x=1))"),
    ("string-constants", "import string\nprint(string.ascii_letters, string.digits)"),
    ("match", "match p:\n    case {'x': x}:\n        print(x)\n    case [a, b]:\n        pass\n"
     "    case Point(x=0, y=yy):\n        print(yy)\n    case _:\n        pass"),
    ("walrus", "if (n := len([1, 2])) > 1:\n    print(n)"),
    ("lambda", "f = lambda x, y=2: x + y\nprint(f(1))"),
    ("async", "async def f():\n    return 1\nasync def g():\n    return await f()"),
    ("generator", "def gen():\n    yield from range(3)\nprint(list(gen()))"),
    ("global", "counter = 0\ndef inc():\n    global counter\n    counter += 1"),
    ("nonlocal", "def outer():\n    n = 0\n    def inner():\n        nonlocal n\n"
     "        n += 1\n    return inner"),
    ("decorators", "import functools\ndef deco(f):\n    @functools.wraps(f)\n"
     "    def wrapper(*a, **k):\n        return f(*a, **k)\n    return wrapper"),
    ("property", "class C:\n    @property\n    def x(self):\n        return 1\n"
     "    @staticmethod\n    def s():\n        return 2\n    @classmethod\n"
     "    def c(cls):\n        return cls()"),
    ("exceptions", "class MyError(Exception):\n    pass\ntry:\n    raise MyError('x')\n"
     "except MyError as e:\n    print(e, e.args)\nfinally:\n    pass"),
    ("assert-del", "x = [1]\nassert x, 'empty'\ndel x"),
    ("unicode-identifiers", "café = 1\nπ = 3.14\nprint(café, π)"),
    ("names-containing-blocked", "open_count = 1\ninput_value = 2\neval_score = 3\n"
     "print(open_count, input_value, eval_score)"),
    ("user-function-opened", "def file_opened():\n    return True\nx.opened = file_opened()"),
    ("chr-ord", "print(chr(65) + chr(66), ord('a'))"),
    ("chr-underscore", "print('{}'.format(chr(95)))"),
    ("bytes", "print((255).to_bytes(2, 'big'), int.from_bytes(b'\\x00\\x01', 'big'))"),
    ("select-prose", "n = 3\nprint(f'Select {n} items')\nprint(f'Updated {n} rows')"),
    ("short-hex", "color = '#ff00ff'\nmagic = 'deadbeef'"),
    ("uuid-like", "u = '123e4567-e89b-12d3-a456-426614174000'"),
    ("relative-path", "path = './data/file.csv'\nother = 'a..b'\nellipsis = '...'"),
    ("max-tokens", "max_tokens = 1000\ntoken = 'short'\npassword_hint = 'the usual'"),
    ("docstring", "def f():\n    \"\"\"Return one.\n\n    Works on floats too.\n    \"\"\"\n"
     "    return 1"),
    ("while-break", "i = 0\nwhile True:\n    i += 1\n    if i > 3:\n        break"),
    ("star-import-math", "from math import *\nprint(sqrt(2))"),
    ("bisect-like", "def bisect(a, x):\n    lo, hi = 0, len(a)\n    while lo < hi:\n"
     "        mid = (lo + hi) // 2\n        lo, hi = (mid + 1, hi) if a[mid] < x else (lo, mid)\n"
     "    return lo"),
    ("dict-methods", "d = {'a': 1}\nprint(sorted(d.items(), key=lambda kv: kv[1]), d.get('b'))"),
    ("sql-placeholder", "q = 'SELECT * FROM t WHERE id = ?'\nrun(q, (uid,))"),
    ("sql-constant", "QUERY = 'SELECT name FROM users'"),
    ("secret-from-env", "api_key = settings['API_KEY']"),
]  # fmt: skip

DATA_SCIENCE = [
    ("numpy", "import numpy as np\nprint(np.arange(10).mean(), np.__version__)"),
    ("numpy-random", "import numpy as np\nprint(np.random.default_rng(0).normal(size=3))"),
    ("pandas-frame", "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2], 'b': [3, 4]})\n"
     "print(df.describe(), df.groupby('a').sum())"),
    ("pandas-apply", "import pandas as pd\ndf = pd.DataFrame({'a': [1]})\n"
     "print(df.apply(lambda r: r['a'] * 2, axis=1))"),
    ("pandas-read-csv", "import pandas as pd\ndf = pd.read_csv('data.csv')\nprint(df.head())"),
    ("pandas-to-csv", "import pandas as pd\nprint(pd.DataFrame({'a': [1]}).to_csv())"),
    ("scipy-stats", "from scipy import stats\nprint(stats.norm.cdf(0))"),
    ("scipy-optimize", "import scipy.optimize\n"
     "print(scipy.optimize.minimize(lambda x: x**2, 1.0))"),
    ("scipy-io-wavfile", "import scipy.io.wavfile\nrate = scipy.io.wavfile"),
    ("numpy-load-plain", "import numpy as np\na = np.load('a.npy')"),
]  # fmt: skip


@pytest.mark.parametrize("code", [c for _, c in MINIMAL], ids=[i for i, _ in MINIMAL])
def test_ordinary_code_passes_minimal(code: str) -> None:
    """Every stage of minimal passes ordinary code, with no violation at all."""
    report = run_stages(code, profile("minimal"))
    assert report.violations == ()
    assert not report.rejected


@pytest.mark.parametrize("code", [c for _, c in DATA_SCIENCE], ids=[i for i, _ in DATA_SCIENCE])
def test_ordinary_data_science_code_passes(code: str) -> None:
    """Every stage of data-science passes ordinary numpy, pandas and scipy code."""
    report = run_stages(code, profile("data-science"))
    assert report.violations == ()
