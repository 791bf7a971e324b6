"""The ast_scan stage refuses escapes: each case is code an attacker (or a careless model)
might send, with the text a violation must contain. The profile is minimal unless named."""

from __future__ import annotations

import pytest

from harombe.security.policy.guardrails import ast_scan

from .guardrail_profiles import profile

# (id, code, a fragment one violation must contain[, profile])
IMPORTS = [
    ("import-os", "import os", "Import 'os' is not allowed in the current security profile"),
    ("import-subprocess", "import subprocess", "Import 'subprocess' is not allowed"),
    ("import-socket", "import socket", "Import 'socket' is not allowed"),
    ("import-sys", "import sys", "Import 'sys' is not allowed"),
    ("import-ctypes", "import ctypes", "Import 'ctypes' is not allowed"),
    ("import-builtins", "import builtins", "Import 'builtins' is not allowed"),
    ("import-importlib", "import importlib", "Import 'importlib' is not allowed"),
    ("import-dotted", "import os.path", "Import 'os.path' is not allowed"),
    ("import-alias", "import os as o", "Import 'os' is not allowed"),
    ("import-second-of-two", "import math, os", "Import 'os' is not allowed"),
    ("from-import", "from os import system", "Import 'os' is not allowed"),
    ("from-import-star", "from os import *", "Import 'os' is not allowed"),
    ("import-in-function", "def f():\n    import shutil", "Line 2: Import 'shutil'"),
    ("import-in-try", "try:\n    import pty\nexcept ImportError:\n    pass", "Import 'pty'"),
    ("relative-import", "from . import x", "relative import 'from . import x' is not allowed"),
    ("relative-from-module", "from ..pkg import y", "relative import 'from ..pkg import y'"),
    ("import-lists-allowed", "import os", "Allowed modules: collections, csv, datetime"),
    ("import-dunder-main", "import __main__", "Import '__main__' is not allowed"),
]

BUILTINS = [
    ("eval", "eval('1+1')", "Line 1: call to 'eval()' is not allowed"),
    ("exec", "exec('x = 1')", "call to 'exec()' is not allowed"),
    ("compile", "compile('1', 'f', 'eval')", "call to 'compile()' is not allowed"),
    ("dunder-import", "__import__('os')", "call to '__import__()' is not allowed"),
    ("open", "open('/etc/passwd')", "call to 'open()' is not allowed"),
    ("getattr", "getattr(1, 'real')", "call to 'getattr()' is not allowed"),
    ("setattr", "setattr(o, 'a', 1)", "call to 'setattr()' is not allowed"),
    ("delattr", "delattr(o, 'a')", "call to 'delattr()' is not allowed"),
    ("breakpoint", "breakpoint()", "call to 'breakpoint()' is not allowed"),
    ("input", "input()", "call to 'input()' is not allowed"),
    ("globals", "globals()['x'] = 1", "call to 'globals()' is not allowed"),
    ("locals", "print(locals())", "call to 'locals()' is not allowed"),
    ("vars", "vars(obj)", "call to 'vars()' is not allowed"),
    ("get-type-hints-bare", "get_type_hints(f)", "call to 'get_type_hints()' is not allowed"),
    ("alias", "e = eval", "reference to 'eval' is not allowed"),
    ("decorator", "@eval\ndef f():\n    pass", "reference to 'eval' is not allowed"),
    ("lambda-default", "f = lambda x=exec: x", "reference to 'exec' is not allowed"),
    ("walrus", "(e := eval)", "reference to 'eval' is not allowed"),
    ("in-list", "[eval][0]('1')", "reference to 'eval' is not allowed"),
    ("as-argument", "list(map(eval, ['1']))", "reference to 'eval' is not allowed"),
    ("nfkc-fullwidth-e", "ｅval('1')", "call to 'eval()' is not allowed"),
    ("nfkc-all-fullwidth", "ｅｘｅｃ('1')", "call to 'exec()' is not allowed"),
    ("nfkc-math-italic", "𝑒𝑣𝑎𝑙('1')", "call to 'eval()' is not allowed"),
    ("nfkc-builtins", "b = __ｂuiltins__", "reference to '__builtins__' is not allowed"),
    ("from-re-compile", "from re import compile\ncompile('x', 'f', 'exec')", "'compile()'"),
]

ATTRIBUTES = [
    ("open-any", "x.open('f')", "access to 'open' attribute is not allowed (dangerous function)"),
    ("system-any", "x.system('id')", "access to 'system' attribute is not allowed"),
    ("popen-any", "x.popen('id')", "access to 'popen' attribute is not allowed"),
    ("exec-any", "x.exec('1')", "access to 'exec' attribute is not allowed"),
    ("eval-any", "df.eval('a + b')", "access to 'eval' attribute is not allowed"),
    ("compile-any", "x.compile('1', 'f', 'exec')", "access to 'compile' attribute"),
    ("get-data", "loader.get_data('/etc/passwd')", "access to 'get_data' attribute"),
    ("forwardref-evaluate", "ref._evaluate(None, None, frozenset())", "'_evaluate'"),
    ("fileio", "x.FileIO('f')", "access to 'FileIO' attribute is not allowed"),
    ("forwardref", "import typing\ntyping.ForwardRef('x')", "access to 'ForwardRef' attribute"),
    ("get-field", "import string\nstring.Formatter().get_field('0', [1], {})", "'get_field'"),
    ("vformat", "import string\nstring.Formatter().vformat('{0}', [1], {})", "'vformat'"),
    ("typing-get-type-hints", "import typing\ntyping.get_type_hints(f)", "'get_type_hints'"),
    ("typing-eval-type", "import typing\ntyping._eval_type(t, {}, {})", "'_eval_type'"),
    ("typing-codetype", "import typing\nc = typing.types.CodeType", "'CodeType' attribute"),
    ("functiontype", "F = T.FunctionType", "access to 'FunctionType' attribute"),
    ("random-os", "import random\nrandom._os.system('id')", "access to '_os' attribute"),
    ("random-os-listdir", "import random\nrandom._os.listdir('/')", "(module reference)"),
    ("statistics-sys", "import statistics\nstatistics.sys.modules", "access to 'sys' attribute"),
    ("typing-sys", "import typing\ntyping.sys.modules['os']", "access to 'sys' attribute"),
    ("contextlib-os", "import typing\ntyping.contextlib.os", "access to 'os' attribute"),
    ("collections-sys", "import collections\ncollections._sys", "access to '_sys' attribute"),
    ("bltns", "x.bltns.eval", "access to 'bltns' attribute"),
    ("builtins-attr", "x.builtins", "access to 'builtins' attribute"),
    ("io-attr", "x.io.open('f')", "access to 'io' attribute"),
    ("codecs-attr", "x.codecs", "access to 'codecs' attribute"),
    ("pathlib-attr", "x.pathlib.Path('/').read_text()", "access to 'pathlib' attribute"),
    ("tempfile-attr", "x.tempfile", "access to 'tempfile' attribute"),
    ("gc-attr", "x.gc.get_objects()", "access to 'gc' attribute"),
    ("inspect-attr", "x.inspect.currentframe()", "access to 'inspect' attribute"),
    ("from-random-os", "from random import _os", "access to '_os' attribute"),
    ("from-typing-sys", "from typing import sys", "access to 'sys' attribute"),
    ("from-math-loader", "from math import __loader__", "access to '__loader__' is not permitted"),
    ("from-random-builtins", "from random import __builtins__", "'__builtins__' is not permitted"),
    ("from-typing-forwardref", "from typing import ForwardRef", "'ForwardRef' attribute"),
    ("from-string-formatter-field", "from typing import get_type_hints", "'get_type_hints'"),
]

DUNDERS = [
    ("tutorial-chain", "''.__class__.__bases__[0].__subclasses__()",
     "access to '__subclasses__' is not permitted"),
    ("class", "x.__class__", "access to '__class__' is not permitted"),
    ("bases", "int.__bases__", "access to '__bases__' is not permitted"),
    ("base", "int.__base__", "access to '__base__' is not permitted"),
    ("mro", "int.__mro__", "access to '__mro__' is not permitted"),
    ("subclasses", "object.__subclasses__()", "access to '__subclasses__' is not permitted"),
    ("globals", "f.__globals__['os']", "access to '__globals__' is not permitted"),
    ("builtins", "f.__builtins__", "access to '__builtins__' is not permitted"),
    ("dict", "obj.__dict__", "access to '__dict__' is not permitted"),
    ("code", "f.__code__", "access to '__code__' is not permitted"),
    ("closure", "f.__closure__[0].cell_contents", "access to '__closure__' is not permitted"),
    ("defaults", "f.__defaults__", "access to '__defaults__' is not permitted"),
    ("kwdefaults", "f.__kwdefaults__", "access to '__kwdefaults__' is not permitted"),
    ("self", "print.__self__", "access to '__self__' is not permitted"),
    ("func", "m.__func__", "access to '__func__' is not permitted"),
    ("wrapped", "g.__wrapped__", "access to '__wrapped__' is not permitted"),
    ("getattribute", "object.__getattribute__(x, 'a')", "'__getattribute__' is not permitted"),
    ("getattr-dunder", "x.__getattr__('a')", "access to '__getattr__' is not permitted"),
    ("setattr-dunder", "object.__setattr__(x, 'a', 1)", "'__setattr__' is not permitted"),
    ("delattr-dunder", "object.__delattr__(x, 'a')", "'__delattr__' is not permitted"),
    ("reduce-ex", "(1).__reduce_ex__(2)", "access to '__reduce_ex__' is not permitted"),
    ("reduce", "x.__reduce__()", "access to '__reduce__' is not permitted"),
    ("spec", "import math\nmath.__spec__", "access to '__spec__' is not permitted"),
    ("loader", "import math\nmath.__loader__", "access to '__loader__' is not permitted"),
    ("objclass", "str.join.__objclass__", "access to '__objclass__' is not permitted"),
    ("forward-code", "t.__forward_code__", "access to '__forward_code__' is not permitted"),
    ("import-attr", "x.__import__('os')", "access to '__import__' is not permitted"),
    ("traceback", "try:\n    1/0\nexcept Exception as e:\n    t = e.__traceback__",
     "Line 4: access to '__traceback__' is not permitted"),
    ("in-fstring", "s = f'{x.__class__}'", "access to '__class__' is not permitted"),
    ("in-lambda", "f = lambda: g.__globals__", "access to '__globals__' is not permitted"),
    ("in-decorator", "@x.__class__\ndef f():\n    pass", "access to '__class__' is not permitted"),
    ("in-default", "def f(a=().__class__):\n    pass", "access to '__class__' is not permitted"),
    ("in-comprehension", "[c for c in ().__class__.__mro__]", "access to '__mro__'"),
    ("type-subclasses", "type(x).__subclasses__()", "access to '__subclasses__'"),
]  # fmt: skip

FRAMES = [
    ("tb-frame", "t.tb_frame", "access to 'tb_frame' is not permitted (frame introspection)"),
    ("tb-next", "t.tb_next", "access to 'tb_next' is not permitted"),
    ("f-globals", "frame.f_globals", "access to 'f_globals' is not permitted"),
    ("f-back", "frame.f_back", "access to 'f_back' is not permitted"),
    ("f-locals", "frame.f_locals", "access to 'f_locals' is not permitted"),
    ("f-builtins", "frame.f_builtins", "access to 'f_builtins' is not permitted"),
    ("f-code", "frame.f_code", "access to 'f_code' is not permitted"),
    ("gi-frame", "g = (x for x in [])\ng.gi_frame", "access to 'gi_frame' is not permitted"),
    ("gi-code", "g.gi_code", "access to 'gi_code' is not permitted"),
    ("cr-frame", "c.cr_frame", "access to 'cr_frame' is not permitted"),
    ("ag-frame", "a.ag_frame", "access to 'ag_frame' is not permitted"),
    ("exception-walk", "try:\n    1/0\nexcept ZeroDivisionError as e:\n"
     "    g = e.__traceback__.tb_frame.f_back.f_globals", "'f_globals' is not permitted"),
]  # fmt: skip

NAMES_AND_KEYS = [
    ("bare-builtins", "b = __builtins__", "reference to '__builtins__' is not allowed"),
    ("bare-builtins-subscript", "__builtins__['eval']", "reference to '__builtins__'"),
    ("bare-loader", "__loader__.load_module('posix')", "reference to '__loader__' is not allowed"),
    ("bare-spec", "s = __spec__", "reference to '__spec__' is not allowed"),
    ("bare-build-class", "__build_class__", "reference to '__build_class__' is not allowed"),
    ("key-builtins", "g['__builtins__']", "subscript access with key '__builtins__'"),
    ("key-built", "g['__buil' + 'tins__']", "subscript access with key '__builtins__'"),
    ("key-frame", "d['f_globals']", "subscript access with key 'f_globals' is not allowed"),
    ("literal", "name = '__globals__'", "string literal '__globals__' matches a blocked"),
    ("literal-frame", "n = 'gi_frame'", "string literal 'gi_frame' matches a blocked"),
    ("literal-dotted", "p = 'a.__globals__'", "names a blocked attribute ('__globals__')"),
    ("literal-nfkc", "n = '__ｇlobals__'", "string literal '__globals__' matches"),
    ("literal-in-tuple", "names = ('__class__', '__bases__')", "string literal '__class__'"),
    ("concat", "n = '__glo' + 'bals__'", "string built here '__globals__' spells"),
    ("chr", "n = chr(95) * 2 + 'class' + chr(95) * 2", "string built here '__class__'"),
    ("join", "n = ''.join(['__', 'class', '__'])", "string built here '__class__'"),
    ("reversed", "n = '__ssalc__'[::-1]", "string built here '__class__'"),
    ("fstring-of-literals", "n = f\"{'__cla'}ss__\"", "string built here '__class__'"),
    ("replace", "n = 'XXglobalsXX'.replace('X', '_')", "string built here '__globals__'"),
    ("bytes-decode", "n = b'__globals__'.decode()", "string built here '__globals__'"),
    ("lower", "n = '__GLOBALS__'.lower()", "string built here '__globals__'"),
    ("repeat-left", "n = 2 * '_' + 'mro' + '_' * 2", "string built here '__mro__'"),
    ("format-field", "'{0.__class__}'.format(1)", "has a format field that reads '__class__'"),
    ("format-chain", "'{0.__init__.__globals__}'.format(o)", "reads '__globals__'"),
    ("format-item", "'{0[__builtins__]}'.format(d)", "reads '__builtins__'"),
    ("format-frame", "'{0.gi_frame.f_back}'.format(g)", "reads 'gi_frame'"),
    ("format-map", "'{x.__class__}'.format_map(d)", "reads '__class__'"),
    ("format-any-dunder", "'{0.__repr__}'.format(1)", "reads '__repr__'"),
    ("format-built", "('{0.__cl' + 'ass__}').format(1)", "string built here has a format"),
]

DYNAMIC = [
    ("attrgetter-dunder", "import operator\noperator.attrgetter('__class__')",
     "dynamic access to dunder '__class__' via attrgetter() is not allowed"),
    ("attrgetter-alias", "from operator import attrgetter as g\ng('__globals__')",
     "dynamic access to dunder '__globals__' via attrgetter()"),
    ("attrgetter-dotted", "import operator\noperator.attrgetter('a.__globals__')",
     "'__globals__' via attrgetter()"),
    ("attrgetter-module-alias", "import operator, random\noperator.attrgetter('_os')(random)",
     "dynamic attribute access to '_os' via attrgetter() is not allowed"),
    ("attrgetter-any-dunder", "import operator\noperator.attrgetter('__repr__')",
     "dynamic access to dunder '__repr__'"),
    ("methodcaller-dunder", "import operator\noperator.methodcaller('__subclasses__')",
     "dynamic access to dunder '__subclasses__' via methodcaller()"),
    ("methodcaller-system", "import operator\noperator.methodcaller('system', 'id')",
     "dynamic attribute access to 'system' via methodcaller()"),
    ("methodcaller-open", "import operator\noperator.methodcaller('open')", "'open' via"),
    ("attrgetter-frame", "import operator\noperator.attrgetter('gi_frame.f_back')", "'gi_frame'"),
    ("attrgetter-computed", "import operator\noperator.attrgetter(name)",
     "attrgetter() with a computed attribute name is not allowed"),
    ("methodcaller-computed", "import operator\noperator.methodcaller(n)",
     "methodcaller() with a computed attribute name"),
    ("attrgetter-chr", "import operator\noperator.attrgetter(chr(95)*2 + 'globals' + chr(95)*2)",
     "dynamic access to dunder '__globals__'"),
    ("attrgetter-concat", "import operator\noperator.attrgetter('__glo' + 'bals__')",
     "dynamic access to dunder '__globals__'"),
    ("attrgetter-starred", "import operator\noperator.attrgetter(*names)", "computed"),
    ("attrgetter-second-arg", "import operator\noperator.attrgetter('real', n)", "computed"),
    ("attrgetter-reference", "import operator\nf = operator.attrgetter",
     "reference to 'attrgetter' outside a direct call is not allowed"),
    ("attrgetter-map", "import operator\nlist(map(operator.attrgetter, names))",
     "reference to 'attrgetter' outside a direct call"),
    ("attrgetter-partial", "import functools, operator\nfunctools.partial(operator.attrgetter, n)",
     "reference to 'attrgetter' outside a direct call"),
    ("methodcaller-bare-reference", "from operator import methodcaller\nm = methodcaller",
     "reference to 'methodcaller' outside a direct call"),
    ("itemgetter-dunder", "import operator\noperator.itemgetter('__builtins__')",
     "dynamic item access to '__builtins__' via itemgetter()"),
    ("star-attrgetter", "from operator import *\nattrgetter('__globals__')", "'__globals__'"),
]  # fmt: skip

MATCH_AND_BINDING = [
    ("match-class-dunder", "match x:\n    case object(__class__=c):\n        pass",
     "Line 2: class pattern reading attribute '__class__' is not allowed"),
    ("match-class-os", "import random\nmatch random:\n    case object(_os=o):\n        pass",
     "class pattern reading attribute '_os' is not allowed"),
    ("match-class-globals", "match f:\n    case object(__globals__=g):\n        pass",
     "class pattern reading attribute '__globals__'"),
    ("match-class-frame", "match g:\n    case object(gi_frame=fr):\n        pass", "'gi_frame'"),
    ("match-mapping-key", "match g:\n    case {'__builtins__': b}:\n        pass",
     "string literal '__builtins__' matches"),
    ("match-capture-name", "match x:\n    case __name__:\n        pass",
     "assignment to '__name__' is not allowed"),
    ("assign-name", "__name__ = 'numpy'", "assignment to '__name__' is not allowed"),
    ("assign-builtins", "__builtins__ = {}", "assignment to '__builtins__' is not allowed"),
    ("walrus-name", "(__name__ := 'x')", "assignment to '__name__' is not allowed"),
    ("for-name", "for __name__ in ['x']:\n    pass", "assignment to '__name__' is not allowed"),
    ("import-as-name", "import math as __name__", "assignment to '__name__' is not allowed"),
    ("def-dunder", "def __import__(n):\n    pass", "assignment to '__import__' is not allowed"),
    ("global-name", "def f():\n    global __name__\n    __name__ = 'x'",
     "Line 2: assignment to '__name__' is not allowed"),
    ("except-as-name", "try:\n    pass\nexcept Exception as __name__:\n    pass",
     "assignment to '__name__'"),
    ("del-name", "del __name__", "assignment to '__name__' is not allowed"),
    ("with-as-name", "with x as __name__:\n    pass", "assignment to '__name__' is not allowed"),
    ("arg-name", "def f(__builtins__=None):\n    pass", "assignment to '__builtins__'"),
    ("class-dunder-name", "class __spec__:\n    pass", "assignment to '__spec__' is not allowed"),
    ("augassign-name", "__name__ += 'x'", "assignment to '__name__' is not allowed"),
    ("tuple-target", "a, __name__ = 1, 'x'", "assignment to '__name__' is not allowed"),
]  # fmt: skip

ANNOTATIONS = [
    ("singledispatch-register", "import functools\n@functools.singledispatch\ndef g(x):\n"
     "    pass\n@g.register\ndef _(x: \"().__class__.__bases__[0].__subclasses__()\"):\n"
     "    pass", "Line 6: access to '__subclasses__' is not permitted"),
    ("return-annotation", "def f() -> 'eval(\"1\")':\n    pass", "call to 'eval()'"),
    ("nested-string", "def f(x: 'List[\"__import__(1)\"]'):\n    pass", "'__import__()'"),
    ("string-in-string", "x: \"'vars()'\" = 1", "call to 'vars()' is not allowed"),
    ("class-annotation", "class P:\n    y: 'P.__subclasses__()'", "Line 2: access to"),
    ("annotations-attribute", "f.__annotations__['x'] = 'y'",
     "access to '__annotations__' is not permitted"),
    ("annotations-bare", "__annotations__['x'] = 'y'",
     "reference to '__annotations__' is not allowed"),
    ("annotations-class-body", "class Fake:\n    __annotations__ = {'x': 'y'}",
     "Line 2: assignment to '__annotations__' is not allowed"),
    ("annotations-property", "class Fake:\n    @property\n    def __annotations__(self):\n"
     "        return {}", "assignment to '__annotations__' is not allowed"),
    ("numpy-testing-measure", "x.testing.measure('1')", "access to 'measure' attribute"),
    ("singledispatch", "import functools\n@functools.singledispatch\ndef g(x):\n    pass",
     "access to 'singledispatch' attribute is not allowed"),
    ("singledispatch-from", "from functools import singledispatchmethod", "'singledispatchmethod'"),
    ("singledispatch-star", "from functools import *\nsingledispatch(f)",
     "Line 2: access to 'singledispatch' attribute"),
    ("keyword-annotations", "C = type('C', (), dict(__annotations__={'x': 'y'}))",
     "keyword argument '__annotations__' is not allowed"),
    ("keyword-class", "class C(Base, __class__=1):\n    pass", "keyword argument '__class__'"),
]  # fmt: skip

MODULE_MEMBERS = [
    ("subprocess-run", "import subprocess\nsubprocess.run(['id'])",
     "call to 'subprocess.run()' is not allowed (module 'subprocess' is blocked)", "permissive"),
    ("subprocess-alias", "import subprocess as sp\nsp.Popen", "access to 'subprocess.Popen'",
     "permissive"),
    ("from-subprocess", "from subprocess import run", "module 'subprocess' is blocked",
     "permissive"),
    ("subprocess-rebound", "import subprocess as s\nfor s in [s]:\n    pass\ns.run(['id'])",
     "module 'subprocess' is blocked", "permissive"),
    ("socket-member", "import socket\nsocket.create_connection(('a', 1))",
     "module 'socket' is blocked", "permissive"),
    ("importlib-member", "import importlib\nimportlib.import_module('os')",
     "module 'importlib' is blocked", "permissive"),
    ("signal-member", "import signal\nsignal.alarm(1)", "module 'signal' is blocked",
     "permissive"),
    ("os-fork", "import os\nos.fork()", "call to 'os.fork()' is not allowed (it runs or signals",
     "permissive"),
    ("os-kill", "import os\nos.kill(1, 9)", "call to 'os.kill()' is not allowed", "permissive"),
    ("os-execv", "import os\nos.execv('/bin/sh', ['sh'])", "call to 'os.execv()'", "permissive"),
    ("os-spawn-import", "from os import spawnl", "access to 'os.spawnl' is not allowed",
     "permissive"),
    ("os-alias", "import os\no = os\no.killpg(1, 9)", "call to 'os.killpg()'", "permissive"),
    ("os-setsid", "import os\nos.setsid()", "call to 'os.setsid()'", "permissive"),
    ("posix-fork", "import posix\nposix.forkpty()", "call to 'posix.forkpty()'", "permissive"),
]  # fmt: skip

PROFILE_BLOCKLIST = [
    ("read-pickle", "import pandas as pd\npd.read_pickle('x')",
     "Line 2: access to 'pandas.read_pickle' is blocked by profile 'data-science'"),
    ("from-read-pickle", "from pandas import read_pickle", "'pandas.read_pickle' is blocked"),
    ("star-read-pickle", "from pandas import *\nread_pickle('x')",
     "Line 2: access to 'pandas.read_pickle' is blocked"),
    ("read-sql", "import pandas as pd\npd.read_sql('q', c)", "'pandas.read_sql' is blocked"),
    ("read-sql-query", "import pandas\npandas.read_sql_query('q', c)", "'pandas.read_sql_query'"),
    ("read-html", "import pandas as pd\npd.read_html('u')", "'pandas.read_html' is blocked"),
    ("read-clipboard", "import pandas as pd\npd.read_clipboard()", "'pandas.read_clipboard'"),
    ("read-hdf", "import pandas as pd\npd.read_hdf('f')", "'pandas.read_hdf' is blocked"),
    ("loadmat", "import scipy.io\nscipy.io.loadmat('x')", "'scipy.io.loadmat' is blocked"),
    ("from-scipy-io", "from scipy.io import loadmat", "'scipy.io.loadmat' is blocked"),
    ("scipy-io-alias", "from scipy import io as sio\nsio.savemat('x', {})",
     "'scipy.io.savemat' is blocked"),
    ("import-mmread", "import scipy.io.mmread", "import of 'scipy.io.mmread' is blocked"),
    ("ctypeslib-import", "import numpy.ctypeslib", "import of 'numpy.ctypeslib' is blocked"),
    ("ctypeslib-from", "from numpy.ctypeslib import as_array", "numpy.ctypeslib"),
    ("ctypeslib-attr", "import numpy as np\nnp.ctypeslib.as_array(p)",
     "'numpy.ctypeslib' is blocked"),
    ("frompyfunc", "import numpy as np\nnp.frompyfunc(f, 1, 1)", "'numpy.frompyfunc' is blocked"),
    ("through-list", "import pandas as pd\n[pd][0].read_pickle('x')",
     "access to 'read_pickle' is blocked by profile 'data-science' (as pandas.read_pickle)"),
    ("submodule", "import pandas as pd\npd.core.api.read_pickle('x')",
     "'pandas.core.api.read_pickle' is blocked"),
    ("attrgetter-name", "import operator, pandas\noperator.attrgetter('read_pickle')(pandas)",
     "dynamic attribute access to 'read_pickle' via attrgetter()"),
    ("rebinding", "import pandas\np = pandas\nif False:\n    import math as p\np.read_pickle('x')",
     "access to 'read_pickle' is blocked"),
    ("array-ctypes", "import numpy as np\nnp.zeros(3).ctypes.data", "access to 'ctypes' attribute"),
    ("pandas-io", "import pandas as pd\npd.io.pickle", "access to 'io' attribute"),
    ("pandas-eval", "import pandas as pd\npd.eval('1+1')", "access to 'eval' attribute"),
    ("numpy-distutils", "import numpy\nnumpy.distutils", "access to 'distutils' attribute"),
]  # fmt: skip

UNREADABLE = [
    ("syntax-error", "print((1)", "SyntaxError: '(' was never closed (line 1)"),
    ("syntax-error-line-3", "x = 1\ny = 2\nz = = 3", "(line 3)"),
    ("null-byte", "x = 1\x00", "SyntaxError: source code string cannot contain null bytes"),
    ("coding-utf7", "# coding: utf-7\nx = 1", "Line 1: source encoding declaration 'utf-7'"),
    ("coding-line-2", "#!/usr/bin/env python\n# -*- coding: latin-1 -*-\nx = 1",
     "Line 2: source encoding declaration 'latin-1' is not allowed"),
    ("nested-parens", "x = " + "(" * 300 + ")" * 300, "SyntaxError: too many nested parentheses"),
    ("deep-unary", "x = " + "-" * 100_000 + "1", "Code is nested too deeply to analyse"),
    ("deep-binop", "x" + "+x" * 100_000, "Code is nested too deeply to analyse"),
    ("too-long", "x = 1\n" * 200_000, "Code of 1,200,000 characters is above the 1,000,000"),
    ("deep-indent", "".join(" " * i + "if x:\n" for i in range(101)) + " " * 101 + "pass",
     "SyntaxError: too many levels of indentation"),
]  # fmt: skip


def _cases(*tables: list[tuple[str, ...]]) -> list[tuple[str, str, str, str]]:
    rows = []
    for table in tables:
        for row in table:
            case_id, code, fragment, *rest = row
            rows.append((case_id, code, fragment, rest[0] if rest else "minimal"))
    return rows


ESCAPES = _cases(IMPORTS, BUILTINS, ATTRIBUTES, DUNDERS, FRAMES, NAMES_AND_KEYS, DYNAMIC,
                 MATCH_AND_BINDING, ANNOTATIONS, MODULE_MEMBERS)  # fmt: skip


@pytest.mark.parametrize(("code", "fragment", "profile_name"),
                         [row[1:] for row in ESCAPES], ids=[row[0] for row in ESCAPES])  # fmt: skip
def test_escapes_are_refused(code: str, fragment: str, profile_name: str) -> None:
    """The escape is refused, and one violation says why (as 'Line N: …')."""
    violations = ast_scan(code, profile(profile_name))
    assert any(fragment in v for v in violations), violations
    assert all(v.startswith("Line ") for v in violations)


DS = _cases(PROFILE_BLOCKLIST)


@pytest.mark.parametrize(("code", "fragment"), [r[1:3] for r in DS], ids=[r[0] for r in DS])
def test_data_science_blocklist_is_refused(code: str, fragment: str) -> None:
    """A member the data-science profile blocks is refused however it is reached."""
    violations = ast_scan(code, profile("data-science"))
    assert any(fragment in v for v in violations), violations


@pytest.mark.parametrize(
    ("code", "expected"), [r[1:3] for r in UNREADABLE], ids=[r[0] for r in UNREADABLE]
)
def test_code_that_cannot_be_read_is_one_violation(code: str, expected: str) -> None:
    """Code that does not parse, is too large or too deep is exactly one violation."""
    violations = ast_scan(code, profile("minimal"))
    assert len(violations) == 1
    assert expected in violations[0]


def test_the_tutorial_syntax_error_text_is_exact() -> None:
    """A syntax error reads exactly as the sidecar's contract shows it."""
    assert ast_scan("print((1)", profile("minimal")) == [
        "SyntaxError: '(' was never closed (line 1)"
    ]
