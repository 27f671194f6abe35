"""The pytest plugin that reports each test's outcome out of the test process as the test ends.

``grading.testrun.run_tests`` copies this file, under a module name drawn per run, into a folder that
only the run's jail sees, and loads it with ``-p``; opencomposer never imports it. It may use only
the standard library and pytest (the opencomposer package is not visible inside the jail).

The code under test runs inside the pytest process that reports on it, so the plugin does not take
that process's word for anything it can check:

- **channel**: records go to an inherited pipe (``results_fd``), one JSON object per line, each
  carrying a nonce read once from a second pipe (``nonce_fd``) that the harness wrote and closed.
  Settings come in ``OPENCOMPOSER_TESTRUN`` and are removed from the environment at import, so
  neither the code under test nor the processes it starts find them there. The harness checks the
  stream (``grading.testrun.read_records``): a foreign line, a node id reported twice, a record after
  the session finished, fewer results than collected tests, a missing finish record or an exit code
  other than the finished session's are tampering.
- **records**: ``start``; ``collected`` (the items pytest will run); ``collect_error`` per module
  that failed to import; ``test`` per item when its setup, call and teardown have all reported
  (``passed``, ``failed``, ``error`` or ``skipped``; an xfail is ``skipped``); ``violation`` per
  integrity problem found; ``finish`` with pytest's exit status and the number of ``test`` records.
- **integrity**, each finding a ``violation`` record:
  a snapshot, taken at import (before any conftest or test module loads), of every function and
  class of ``builtins``, ``pytest``, ``_pytest``, ``pluggy`` and ``unittest`` (with the value
  checks, also of the standard library modules tests compute with: ``math``, ``operator``,
  ``fractions``, ``decimal``, ``collections``, ``random``, ...) and of the methods of their classes: one replaced by code that is not trusted is a violation (``unittest.TestCase.
  assertEqual``, ``_pytest.runner.call_and_report``, ``builtins.__import__``, ...);
  every hook implementation must come from trusted code, checked as each plugin registers and
  again with the snapshot (a ``pytest_plugins`` entry or a plugin registered by the code under
  test is a violation);
  each collected test module must have been loaded from its file (a module planted in
  ``sys.modules`` is a violation), and a test whose function is not trusted code is reported as
  ``error`` whatever it does;
  before each test's call, the test function and the functions and classes its module defines must
  be the ones collected, or replacements by trusted code (a fixture from the solution that swaps
  the checker is a violation).
  The snapshot and the hooks are checked after each test module, at least once a second and when
  the session finishes (each check costs about a millisecond); the test items before every call.
- **hidden test sources**: an audit hook (which cannot be removed once added) refuses to open the
  hidden test files (``hidden``) while untrusted code is on the stack; a direct read is a violation.
- **value checks** (``guard_values``, on unless the run trusts every file): the asserts of the
  trusted workspace files pytest rewrites (the task's test files and conftests) are rewritten
  again, after pytest's own rewriting of each assert (its messages kept) or in place of it where a
  module turns it off, so that every comparison, arithmetic operation and truth test in them calls
  ``ValueChecks`` through names that are not identifiers, put in the module's namespace as it
  loads and checked before and after each test call. A pyc pytest cached for such a file is never
  read (a planted one cannot skip the rewriting). A value is *foreign* when it is, or holds
  through builtin containers, an instance of a class whose comparison, arithmetic or truth methods
  come from untrusted code (classes are noted as ``class`` statements build them) or, for a class
  the solution built, from Python code of a trusted base class (which may call back into what
  the subclass overrides), a weak proxy or a mock (numpy's ``__array_ufunc__`` & co. count as
  comparison methods); untrusted subclasses of builtin types become the builtin value through the base
  type's own methods. Foreign against plain fails the test (``UntrustedValue``, which ``not`` or
  ``except AssertionError`` cannot turn around), except equality with a plain number, string,
  bytes or builtin container: the foreign value's own ``__eq__`` is asked, in a drawn order, about
  that value and sixteen to thirty-one distinct decoys near it (``honest_equality``; a container's
  decoys have one item changed, dropped or added; a list, tuple or dict holding the solution's
  values is asked item by item, so that no item sees its expected value in the decoys of another),
  and a value that calls a decoy equal too fails
  the test, so a domain object equal to ``0`` or to ``(1, 2)`` passes and one equal to everything
  does not. The truth of a
  foreign value with its own ``__bool__``/``__len__`` fails the test too, and so does arithmetic
  that turns a foreign operand and a plain one into a plain result; two foreign values, or a plain value's membership in a foreign container, are
  computed as the solution's classes say; two plain ones as Python computes them. The
  ``unittest.TestCase`` assert methods check their operands the same way.
- **introspection**: the audit hook makes it a violation for untrusted code (the caller of
  ``inspect`` and ``traceback`` when they do the work) to call ``sys._getframe``,
  ``sys._current_frames``, ``gc.get_referrers``/``get_referents``/``get_objects``,
  ``sys.settrace``/``setprofile`` (``threading.settrace``'s hook is checked as threads start and
  with the snapshot), to take a frame from a traceback, generator or coroutine (through
  ``traceback`` only frames of the run itself count), or to read the code object of the tests,
  pytest or this plugin. Once collected, each hidden test module is replaced in ``sys.modules``
  (and on its package) by a stand-in that passes attributes to trusted code and answers untrusted
  code with AttributeError and a violation (its name and file excepted). A signal handler the solution installs is called
  without the interrupted frame. The repository's own code (``unchanged``: files the change left
  as the task has them, their digests given) is exempt when its code objects equal those compiled
  afresh from the file and no untrusted code stands between it and the tests on the stack
  (``repository_code``): a project's own frame reads on the tests' behalf grade, the solution
  calling them does not.

Trusted code is code in files of the Python installation, of this folder, and of the ``trusted``
workspace paths (the task's tests and test configuration); with ``trusted`` null (the task
generators, which run code they wrote themselves) every file is trusted and the hidden-source
guard, the value checks and the introspection audit are off. Code in the same process can still
get around all of this (by finding the recorder through pytest's objects, by compiling code under a
file name it does not have, through a child process that reads the tests): these checks catch the
tampering a policy stumbles on, not every tampering a determined one could write. The value checks
see only what asserts and the unittest assert methods compare (not a comparison elsewhere in a
test, nor a conversion such as ``round`` or ``len``), and a legitimate value of the solution's own
class whose own ordering or truth is tested against a plain value fails them: an ordering cannot be
asked with decoys, since a class that answers as if it stood below everything satisfies any one-sided
check (a tolerance check after the class's own ``__abs__``, say) and is indistinguishable from a value
that does (docs/harness.md, "Grading integrity", lists the limits).
"""

from __future__ import annotations

import ast
import builtins
import collections
import functools
import hashlib
import json
import operator
import os
import sys
import sysconfig
import threading
import time
import types
import weakref

import _pytest
import pluggy
import pytest

SETTINGS_VARIABLE = "OPENCOMPOSER_TESTRUN"
WATCHED_PACKAGES = ("pytest", "_pytest", "pluggy", "unittest")
# what tests compute expected values and tolerances with; watched with the value checks
WATCHED_STDLIB = ("math", "cmath", "operator", "copy", "random", "re", "string", "json", "numbers", "fractions",
                  "decimal", "statistics", "itertools", "functools", "collections", "heapq", "bisect")
STATE_CHECK_EVERY_S = 1.0  # besides after each test module and at the end
DISPLAY_MODULES = ("linecache", "traceback", "warnings", "tokenize")  # read source only to show it
# introspection: what hands out frames, code objects or every object, and what traces execution
INTROSPECTION_EVENTS = frozenset({"sys._getframe", "sys._current_frames", "gc.get_referrers", "gc.get_referents",
                                  "gc.get_objects", "sys.settrace", "sys.setprofile"})
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
CODE_ATTRIBUTES = frozenset({"__code__", "f_code", "gi_code", "cr_code", "ag_code"})
PASS_THROUGH = ("inspect.py", "traceback.py")  # introspection on behalf of their caller
MODULE_METADATA = frozenset({"__name__", "__file__", "__path__", "__package__", "__cached__"})
_MISSING = object()


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def _code_file(value: object) -> str | None:
    """The file the code of ``value`` (function, method, descriptor, class) was compiled from."""
    for attribute in ("__func__", "fget"):
        value = getattr(value, attribute, None) or value
    code = getattr(value, "__code__", None)
    if isinstance(code, types.CodeType):
        return code.co_filename
    if isinstance(value, type):
        module = sys.modules.get(value.__module__)
        return getattr(module, "__file__", None)
    return None


class Recorder:
    """Everything the plugin keeps for one run: the channel, the trust rules, the snapshots."""

    def __init__(self, settings: dict) -> None:
        self.results_fd = int(settings["results_fd"])
        nonce_fd = int(settings["nonce_fd"])
        with os.fdopen(nonce_fd, "rb") as source:
            self.nonce = source.read().decode("ascii")
        os.set_inheritable(self.results_fd, False)
        trusted = settings.get("trusted")
        self.trust_all = trusted is None
        self.trusted = tuple(os.path.realpath(p) for p in trusted or ())
        self.hidden = frozenset(os.path.realpath(p) for p in settings.get("hidden") or ())
        roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                 sysconfig.get_paths()["stdlib"], os.path.dirname(os.path.abspath(__file__))}
        self.installation = tuple(sorted({os.path.realpath(r) for r in roots}))
        self.stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
        self.pass_through = frozenset(os.path.join(root, name) for root in {sysconfig.get_paths()["stdlib"], self.stdlib}
                                      for name in PASS_THROUGH)
        self.guard_values = bool(settings.get("guard_values", True)) and not self.trust_all
        self.run_code = tuple(os.path.realpath(os.path.dirname(os.path.abspath(module.__file__)))
                              for module in (_pytest, pluggy, pytest, sys.modules[__name__]))
        self.values = ValueChecks(self)
        self.class_origin: dict[int, tuple[type, bool]] = {}  # id -> (class, built by trusted code)
        self.guarded_modules: dict[str, types.ModuleType] = {}  # test modules whose asserts were rewritten
        self.stand_ins: dict[int, types.ModuleType] = {}  # id of a stand-in in sys.modules -> the module
        self.config: pytest.Config | None = None
        self.reports: dict[str, dict[str, pytest.TestReport]] = {}
        self.tests = 0
        self.finished = False
        self.violations: set[str] = set()
        self.trust_cache: dict[str, bool] = {}
        self.trusted_hooks: dict[int, object] = {}
        self.distrusted: set[str] = set()
        self.snapshot = snapshot(WATCHED_PACKAGES + (WATCHED_STDLIB if self.guard_values else ()))
        self.collected: dict[str, list[tuple[object, str, object, object]]] = {}
        self.write_lock = threading.Lock()  # a violation may be found on any thread
        self.auditing = threading.local()  # per thread: set while the audit hook checks a file
        self.last_module = ""
        self.last_check = time.monotonic()
        self.unchanged: dict[str, str] = {}  # the repository's own files the change left alone -> sha256
        if settings.get("unchanged") and not self.trust_all:
            with open(settings["unchanged"], encoding="utf-8") as source:
                self.unchanged = dict(json.load(source))
        self.unchanged_index: dict[str, dict[tuple[str, int], types.CodeType] | None] = {}

    # ------------------------------------------------------------------------------------------
    def emit(self, kind: str, **fields: object) -> None:
        data = (json.dumps({"nonce": self.nonce, "kind": kind, **fields}) + "\n").encode()
        with self.write_lock:
            while data:
                data = data[os.write(self.results_fd, data):]

    def violation(self, what: str) -> None:
        if what not in self.violations:
            self.violations.add(what)
            self.emit("violation", what=what)

    def trusted_file(self, filename: str | None) -> bool:
        """Whether code compiled from ``filename`` is trusted (see the module docstring)."""
        if self.trust_all:
            return True
        if not filename:
            return False
        if filename.startswith("<frozen "):
            return True
        known = self.trust_cache.get(filename)
        if known is None:
            if os.path.isabs(filename):
                real = os.path.realpath(filename)
                known = _under(real, self.installation) or _under(real, self.trusted)
            else:
                known = False  # "<string>", or a path relative to a working folder that may have moved
            self.trust_cache[filename] = known
        return known

    def trusted_value(self, value: object) -> bool:
        return self.trusted_file(_code_file(value))

    # ------------------------------------------------------------------------------------------
    def check_state(self) -> None:
        """The snapshot of the test machinery and every hook implementation, against now."""
        for namespace, names, originals, labels in self.snapshot:
            if all(map(operator.is_, map(namespace.get, names), originals)):
                continue  # the common case, checked at C speed: nothing in this namespace moved
            for name, original, label in zip(names, originals, labels, strict=True):
                current = namespace.get(name, _MISSING)
                if current is not original and (current is _MISSING or not self.trusted_value(current)):
                    self.violation(f"{label} was replaced or removed during the run")
        if self.guard_values:
            self.check_tracers()
        if self.config is not None:
            for hook_name, caller in vars(self.config.pluginmanager.hook).items():
                for impl in getattr(caller, "get_hookimpls", list)():
                    self.check_hook(hook_name, impl.function)

    def check_hook(self, hook_name: str, function: object) -> None:
        if id(function) in self.trusted_hooks:
            return
        if not self.trusted_value(function):
            self.violation(f"hook {hook_name} is implemented by untrusted code ({_code_file(function)})")
        else:
            self.trusted_hooks[id(function)] = function  # kept alive, so the id stays its own

    def remember_items(self, items: list[pytest.Item]) -> None:
        """Note what each collected test is made of; a test whose function is not trusted code (a
        ``test_*`` function the solution wrote) will be reported as ``error``, whatever it does."""
        modules: dict[int, list[tuple[object, str, object, object]]] = {}
        for item in items:
            entries: list[tuple[object, str, object, object]] = []
            function = getattr(item, "obj", None)
            if function is not None:
                entries.append((item, "obj", function, getattr(function, "__code__", None)))
                if not self.trusted_value(function):
                    self.distrusted.add(item.nodeid)
            module = getattr(item, "module", None)
            if isinstance(module, types.ModuleType):
                origin = getattr(getattr(module, "__spec__", None), "origin", None)
                if not self.trust_all and (not origin or os.path.realpath(origin) != os.path.realpath(item.path)):
                    self.violation(f"{item.nodeid}: its module {module.__name__} was not loaded from {item.path}")
                if id(module) not in modules:
                    namespace = vars(module)
                    modules[id(module)] = [
                        (namespace, name, value, getattr(value, "__code__", None))
                        for name, value in list(namespace.items())
                        if isinstance(value, (types.FunctionType, type))
                        and getattr(value, "__module__", None) == module.__name__
                    ]
                entries += modules[id(module)]
            self.collected[item.nodeid] = entries

    def check_item(self, item: pytest.Item) -> None:
        """The test function and its module's own functions and classes, against collection."""
        if "runtest" in vars(item) and not self.trusted_value(vars(item)["runtest"]):
            self.violation(f"{item.nodeid}: runtest was replaced on the item")
        for holder, name, original, code in self.collected.get(item.nodeid, ()):
            current = getattr(holder, name, _MISSING) if holder is item else holder.get(name, _MISSING)
            current_code = getattr(current, "__code__", None)
            if current is original and current_code is code:
                continue
            replacement = current_code if current is original else current
            if current is _MISSING or not self.trusted_file(
                    replacement.co_filename if isinstance(replacement, types.CodeType) else _code_file(replacement)):
                self.violation(f"{item.nodeid}: {name} was replaced before the test ran")

    # ------------------------------------------------------------------------------------------
    def audit(self, event: str, args: tuple) -> None:
        """The audit hook: hidden test sources, and introspection by untrusted code."""
        if event == "open":
            if not self.hidden:
                return
        elif event == "object.__getattr__":
            if not self.guard_values or len(args) != 2 or (args[1] not in FRAME_ATTRIBUTES
                                                           and args[1] not in CODE_ATTRIBUTES):
                return
        elif event not in INTROSPECTION_EVENTS or not self.guard_values:
            return
        if getattr(self.auditing, "busy", False):
            return
        self.auditing.busy = True
        try:
            caller = sys._getframe(1)
            refused = self.opened(args, caller) if event == "open" else self.introspected(event, args, caller)
        finally:
            self.auditing.busy = False
        if refused:
            raise PermissionError(f"{refused}: hidden test files cannot be read by the code under test")

    def opened(self, args: tuple, frame: types.FrameType | None) -> str | None:
        """The hidden test file ``args`` opens when untrusted code is on the stack (a violation when
        that code opened it, not the standard library on its behalf to show source), or None."""
        path = args[0]
        if not isinstance(path, (str, bytes, os.PathLike)) or os.path.realpath(os.fsdecode(path)) not in self.hidden:
            return None
        innermost_trusted: bool | None = None
        for_display = False
        untrusted = False
        while frame is not None:
            filename = frame.f_code.co_filename
            real = os.path.realpath(filename) if os.path.isabs(filename) else ""
            in_stdlib = filename.startswith("<frozen ") or (
                _under(real, (self.stdlib,)) and f"{os.sep}site-packages{os.sep}" not in real)
            if in_stdlib:
                if innermost_trusted is None and frame.f_globals.get("__name__") in DISPLAY_MODULES:
                    for_display = True
            else:  # the repository's own unchanged code too (click.open_file(__file__) in a test)
                trusted = self.trusted_file(filename) or self.unchanged_code(frame.f_code)
                if innermost_trusted is None:
                    innermost_trusted = trusted
                untrusted = untrusted or not trusted
            frame = frame.f_back
        if not untrusted:
            return None
        if innermost_trusted is False and not for_display:
            self.violation(f"untrusted code opened the hidden test file {os.fsdecode(path)}")
        return os.fsdecode(path)

    def culprit(self, frame: types.FrameType | None) -> tuple[types.FrameType | None, bool]:
        """The frame that asked for an introspection ``frame`` made (inspect and traceback work for
        their caller), and whether it went through them."""
        through = False
        while frame is not None and frame.f_code.co_filename in self.pass_through:
            frame, through = frame.f_back, True
        return frame, through

    def untrusted_caller(self, frame: types.FrameType | None) -> str | None:
        """The file of the code that made the call ``frame`` is in, when it is not trusted."""
        frame, _ = self.culprit(frame)
        filename = frame.f_code.co_filename if frame is not None else None
        return None if frame is None or self.trusted_file(filename) or self.repository_code(frame) else filename

    def repository_code(self, frame: types.FrameType | None) -> bool:
        """Whether ``frame`` runs the repository's own code as the task has it (``unchanged_code``)
        on the tests' behalf: every frame from it out to the first frame of the test run (the
        tests, pytest) is trusted code or such repository code too, so no code of the solution
        asked for what it reads (click's ``version_option`` reads its caller's globals, pyparsing's
        ``autoname_elements`` its caller's locals). Code of the solution that calls such a function
        to reach the tests' frames is on that path and is refused, and so is such a function run
        with no test below it on its stack (a thread's target the solution started)."""
        if not self.unchanged or frame is None or not self.unchanged_code(frame.f_code):
            return False
        frame = frame.f_back
        while frame is not None:
            filename = frame.f_code.co_filename
            if self.protected_file(filename):
                return True
            if not self.trusted_file(filename) and not self.unchanged_code(frame.f_code):
                return False
            frame = frame.f_back
        return False  # no test below it (a thread's target): no test asked for it

    def unchanged_code(self, code: types.CodeType) -> bool:
        """Whether ``code`` is, value for value, code compiled from one of the repository's files
        that the change left alone (``unchanged``), as that file stands now with the digest the
        task gives it: code compiled from other source under that file's name, or loaded from the
        file while the solution had rewritten it, is not."""
        filename = code.co_filename
        index = self.unchanged_index.get(filename, _MISSING)
        if index is _MISSING:
            index = self.unchanged_index[filename] = self.compile_unchanged(filename)
        if not index:
            return False
        candidate = index.get((getattr(code, "co_qualname", code.co_name), code.co_firstlineno))
        return candidate is not None and candidate == code

    def compile_unchanged(self, filename: str) -> dict[tuple[str, int], types.CodeType] | None:
        """Every code object of the unchanged file ``filename`` compiled afresh, by (qualified
        name, first line); None when it is not such a file or no longer has its digest."""
        digest = self.unchanged.get(filename)
        if digest is None and os.path.isabs(filename):
            digest = self.unchanged.get(os.path.realpath(filename))
        if digest is None:
            return None
        try:
            with open(filename, "rb") as source_file:
                source = source_file.read()
            if hashlib.sha256(source).hexdigest() != digest:
                return None
            pending = [compile(source, filename, "exec", dont_inherit=True)]
        except (OSError, SyntaxError, ValueError):
            return None
        index: dict[tuple[str, int], types.CodeType] = {}
        while pending:
            code = pending.pop()
            index[(getattr(code, "co_qualname", code.co_name), code.co_firstlineno)] = code
            pending += [const for const in code.co_consts if isinstance(const, types.CodeType)]
        return index

    def protected_file(self, filename: str | None) -> bool:
        """Code of the test run itself: the task's tests, pytest, pluggy and this plugin (not the
        standard library, nor the libraries the solution may use)."""
        if self.trust_all or not filename or not os.path.isabs(filename):
            return False
        return _under(os.path.realpath(filename), self.trusted + self.run_code)

    def introspected(self, event: str, args: tuple, caller: types.FrameType | None) -> None:
        """A violation when untrusted code reaches frames or code objects of the test run, every
        object (gc), or installs a tracing or profiling hook (which can skip an assert's line)."""
        frame, through = self.culprit(caller)
        if frame is None:
            return
        filename = frame.f_code.co_filename
        if self.trusted_file(filename):
            if event in ("sys.settrace", "sys.setprofile") and frame.f_globals.get("__name__") == "threading":
                self.check_tracers()  # threading.settrace's hook, installed as a thread starts
            return
        if event not in ("sys.settrace", "sys.setprofile") and self.repository_code(frame):
            return  # the repository's own code, asked by the tests: what it always did
        what = event
        if event == "object.__getattr__":
            target, name = args
            what = f"the {name} attribute"
            if name in CODE_ATTRIBUTES:  # its own code is the solution's business; the tests' is not
                code = getattr(target, "__code__" if name == "__code__" else name, None)
                if not isinstance(code, types.CodeType) or not self.protected_file(code.co_filename):
                    return
                what += f" of {code.co_name} ({code.co_filename})"
            elif through:  # a traceback formatted for the solution: fine while it shows only its frames
                reached = getattr(target, name, None)
                if not isinstance(reached, types.FrameType) or not self.protected_file(reached.f_code.co_filename):
                    return
        self.violation(f"untrusted code introspected the test run: {what} from {filename}")

    def check_tracers(self) -> None:
        for hook in (sys.gettrace(), sys.getprofile(), getattr(threading, "_trace_hook", None),
                     getattr(threading, "_profile_hook", None)):
            if isinstance(hook, (types.FunctionType, types.MethodType)) and not self.trusted_value(hook):
                self.violation(f"untrusted code introspected the test run: a tracing hook from {_code_file(hook)}")

    # ------------------------------------------------------------------------------------------
    def guarded_source(self, path: object) -> bool:
        """Whether the asserts of the module compiled from ``path`` go through the value checks:
        the task's own test files (trusted workspace files)."""
        if not self.guard_values or not isinstance(path, (str, os.PathLike)):
            return False
        real = os.path.realpath(os.fspath(path))
        return _under(real, self.trusted) and not _under(real, self.installation)

    def check_value_helpers(self, item: pytest.Item) -> None:
        module = getattr(item, "module", None)
        if not isinstance(module, types.ModuleType) or self.guarded_modules.get(module.__name__) is not module:
            return
        namespace = vars(module)
        if any(namespace.get(name) is not helper for name, helper in self.values.helpers.items()):
            self.violation(f"{item.nodeid}: the value checks of {module.__name__} were replaced")

    def hide_test_modules(self, items: list[pytest.Item]) -> None:
        """Put a stand-in in ``sys.modules`` (and on the parent package) for each collected hidden
        test module: trusted code reaches the module through it, untrusted code gets nothing (and
        a violation). pytest keeps the module itself on its items."""
        for module in {id(m): m for m in (getattr(item, "module", None) for item in items)}.values():
            origin = getattr(module, "__file__", None)
            if not isinstance(module, types.ModuleType) or not origin or os.path.realpath(origin) not in self.hidden:
                continue
            name = module.__name__
            stand_in = _HiddenModule(name)
            self.stand_ins[id(stand_in)] = module
            if sys.modules.get(name) is module:
                sys.modules[name] = stand_in
            parent_name, _, child = name.rpartition(".")
            parent = sys.modules.get(parent_name) if parent_name else None
            if isinstance(parent, types.ModuleType) and vars(parent).get(child) is module:
                setattr(parent, child, stand_in)

    def stand_in_module(self, stand_in: types.ModuleType, name: str,
                        caller: types.FrameType | None) -> types.ModuleType:
        """The module behind ``stand_in``, for trusted code; untrusted code gets AttributeError."""
        module = self.stand_ins[id(stand_in)]
        if name in MODULE_METADATA:  # where it lives, as inspect.getmodule asks of every module
            return module
        if self.for_getdoc(caller):
            return module
        filename = self.untrusted_caller(caller)
        if filename is not None:
            self.violation(f"untrusted code introspected the test run: it looked up the hidden test module "
                           f"{module.__name__} ({name!r}) from {filename}")
            raise AttributeError(name)
        return module


    def for_getdoc(self, caller: types.FrameType | None) -> bool:
        """Whether a lookup in a hidden test module is ``inspect.getdoc`` looking for the class of a
        function without a docstring (``getdoc`` -> ``_finddoc`` -> ``_findclass``, as click's
        ``command`` decorator asks of a test's nested command): it gives back a docstring or None,
        never the module or what it holds, so whoever called ``getdoc`` learns nothing more (a
        direct call of ``inspect._findclass``, which returns the class, is not this)."""
        chain = []
        while caller is not None and caller.f_code.co_filename in self.pass_through and len(chain) < 3:
            chain.append(caller.f_code.co_name)
            caller = caller.f_back
        return chain == ["_findclass", "_finddoc", "getdoc"]


class _HiddenModule(types.ModuleType):
    """What ``sys.modules`` holds for a hidden test module once it is collected."""

    def __getattribute__(self, name: str) -> object:
        return getattr(_recorder.stand_in_module(self, name, sys._getframe(1)), name)

    def __setattr__(self, name: str, value: object) -> None:
        setattr(_recorder.stand_in_module(self, name, sys._getframe(1)), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(_recorder.stand_in_module(self, name, sys._getframe(1)), name)

    def __dir__(self) -> list[str]:
        return dir(_recorder.stand_in_module(self, "__dir__", sys._getframe(1)))


def snapshot(watched: tuple[str, ...]) -> list[tuple[dict, tuple[str, ...], tuple[object, ...], tuple[str, ...]]]:
    """(namespace, names, values, labels) for every module of the ``watched`` packages and each
    class it defines: its functions and classes, or the class's methods, as they are now."""
    import importlib

    for name in watched:  # imported now, before the code under test can replace what they hold
        if name not in ("pytest", "_pytest", "pluggy"):
            importlib.import_module(name)

    groups = []

    def group(namespace, items: list[tuple[str, object]], prefix: str) -> None:
        if items:
            names, values = zip(*items, strict=True)
            groups.append((namespace, names, values, tuple(f"{prefix}{name}" for name in names)))

    modules = [module for name, module in sorted(sys.modules.items())
               if isinstance(module, types.ModuleType) and name.split(".")[0] in watched]
    group(sys.modules, [(module.__name__, module) for module in modules], "module ")
    for module in [builtins, *modules]:
        members = [(name, value) for name, value in list(vars(module).items())
                   if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type))]
        group(vars(module), members, f"{module.__name__}.")
        for name, value in members:
            if isinstance(value, type) and module is not builtins and value.__module__ == module.__name__:
                methods = [(attr, member) for attr, member in list(vars(value).items())
                           if isinstance(member, (types.FunctionType, classmethod, staticmethod, property))]
                group(vars(value), methods, f"{module.__name__}.{name}.")
    return groups


# ----------------------------------------------------------------------------------------------
# Value checks: the comparisons and truth tests in the asserts of the task's tests


HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: classes made at run time; the others are written in C
COMPARISON_DUNDERS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__contains__",
                      "__iter__", "__getitem__")
TRUTH_DUNDERS = ("__bool__", "__len__")
ARITHMETIC_DUNDERS = tuple(f"__{prefix}{name}__" for name in (
    "add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "divmod", "pow", "lshift", "rshift", "and",
    "xor", "or") for prefix in ("", "r")) + ("__neg__", "__pos__", "__abs__", "__invert__", "__round__",
                                              "__float__", "__int__", "__index__", "__complex__")
ARRAY_HOOKS = ("__array_ufunc__", "__array_function__", "__array_wrap__", "__array_priority__")  # numpy defers to
VALUE_DUNDERS = COMPARISON_DUNDERS + TRUTH_DUNDERS + ARITHMETIC_DUNDERS + ARRAY_HOOKS
# what an untrusted subclass of a trusted Python class (UserList, Fraction) may steer through overrides
DELEGATING = frozenset(VALUE_DUNDERS) - {"__hash__", "__bool__", "__len__", "__iter__", "__getitem__"}
SCALARS = frozenset({int, float, complex, str, bytes, bool, type(None), type(Ellipsis), type(NotImplemented)})
CONTAINERS = (list, tuple, dict, set, frozenset)
# the builtin types an untrusted subclass is turned back into, with the base type's own methods
NORMALISE = (
    (int, int.__int__),
    (float, float.__float__),
    (complex, lambda v: complex(complex.real.__get__(v), complex.imag.__get__(v))),
    (str, str.__str__),
    (bytes, bytes.__bytes__),
    (bytearray, lambda v: bytearray(memoryview(v))),
    (list, list.copy),
    (tuple, lambda v: tuple.__getitem__(v, slice(None))),
    (dict, lambda v: dict(dict.items(v))),
    (frozenset, lambda v: frozenset(frozenset.__iter__(v))),
    (set, lambda v: set(set.__iter__(v))),
)
NORMALISERS = dict(NORMALISE)
ITEMS = {list: list.__iter__, tuple: tuple.__iter__, set: set.__iter__, frozenset: frozenset.__iter__}
COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
           ">=": operator.ge, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
           "is": operator.is_, "is not": operator.is_not}
ARITHMETIC = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.MatMult: "@", ast.Div: "/", ast.FloorDiv: "//",
              ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitXor: "^",
              ast.BitAnd: "&"}
OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "@": operator.matmul, "/": operator.truediv,
             "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "<<": operator.lshift,
             ">>": operator.rshift, "|": operator.or_, "^": operator.xor, "&": operator.and_}
COMPARE_SYMBOLS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
                   ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
MAX_DEPTH = 200
# the names the rewritten asserts call; not identifiers, so no source code can spell them
UNITTEST_PAIRS = ("assertEqual", "assertNotEqual", "assertLess", "assertLessEqual", "assertGreater",
                  "assertGreaterEqual", "assertIn", "assertNotIn", "assertAlmostEqual", "assertNotAlmostEqual",
                  "assertCountEqual", "assertListEqual", "assertTupleEqual", "assertDictEqual", "assertSetEqual",
                  "assertSequenceEqual", "assertMultiLineEqual")
UNITTEST_TRUTHS = ("assertTrue", "assertFalse")
MEMBERSHIP = frozenset({"in", "not in", "assertIn", "assertNotIn"})
HELPERS = ("@opencomposer_compare", "@opencomposer_chain", "@opencomposer_arithmetic", "@opencomposer_truth")
_type_dict = type.__dict__["__dict__"].__get__
_type_mro = type.__dict__["__mro__"].__get__
_type_flags = type.__dict__["__flags__"].__get__
_type_module = type.__dict__["__module__"].__get__
_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)
_urandom = os.urandom  # taken at import, before any code of the solution runs
EQUALITY = frozenset({"==", "!=", "assertEqual", "assertNotEqual", "assertListEqual", "assertTupleEqual",
                      "assertDictEqual", "assertSetEqual", "assertSequenceEqual", "assertMultiLineEqual"})
DECOYS_AT_LEAST = 16
DECOY_LETTERS, DECOY_DIGITS = "abcdefghijklmnopqrstuvwxyz", "0123456789"


def _draw(n: int) -> int:
    """A number in ``range(n)`` from the operating system's random source."""
    return int.from_bytes(_urandom(4), "little") % n


def _decoys(plain: object) -> list[object]:
    """Sixteen to thirty-one distinct plain values of ``plain``'s type, near it and different from
    it (fewer where there are not that many), or [] for a value that has none (None, NaN, and bool,
    whose one other value would let a value that remembers what it was asked pick out the odd
    one): what a value's own ``__eq__`` must not call equal. A container's decoys have one item
    replaced by one of its own decoys, one item (or key) dropped, or one added. A value that
    calls equal whatever it was asked about at some position wins with probability
    1/(decoys + 1) per assert."""
    make = _decoy_maker(plain)
    if make is None:
        return []
    count, decoys = DECOYS_AT_LEAST + _draw(DECOYS_AT_LEAST), []
    for _ in range(8 * count):
        decoy = make()
        if decoy != plain and all(type(decoy) is not type(other) or decoy != other for other in decoys):
            decoys.append(decoy)
            if len(decoys) == count:
                break
    return decoys


def _decoy_maker(plain: object):
    """A function that makes one random near value of ``plain`` (see ``_decoys``), or None."""
    cls = type(plain)
    sign = lambda: 1 if _draw(2) else -1  # noqa: E731
    if cls is int:
        return lambda: plain + (1 + _draw(64)) * sign()
    if cls is float:
        if plain != plain or plain in (float("inf"), float("-inf")):
            return None
        return lambda: plain + (1.0 + abs(plain)) * (0.25 + _draw(16) / 8) * sign()
    if cls is str:
        return lambda: _near(plain)
    if cls is bytes and plain.isascii():
        return lambda: _near(plain.decode("ascii")).encode("ascii")
    if cls in (list, tuple):
        return lambda: cls(_changed_items(list(plain)))
    if cls in (set, frozenset):
        return lambda: cls(_changed_set(set(plain)))
    if cls is dict:
        return lambda: _changed_dict(dict(plain))
    return None


def _near_item(items: list) -> object:
    """A plain value near one of ``items`` (a random small int for items that have none)."""
    makers = [maker for maker in map(_decoy_maker, items) if maker is not None]
    return makers[_draw(len(makers))]() if makers else _draw(64)


def _changed_items(items: list) -> list:
    replaceable = [i for i, item in enumerate(items) if _decoy_maker(item) is not None]
    move = _draw(4)
    if replaceable and move < 2:  # most often: one item replaced, which the items' own __eq__ is asked about
        i = replaceable[_draw(len(replaceable))]
        items[i] = _decoy_maker(items[i])()
    elif items and move == 2:
        del items[_draw(len(items))]
    else:
        items.insert(_draw(len(items) + 1), _near_item(items))
    return items


def _changed_set(items: set) -> set:
    if items and _draw(2):
        items.discard(list(items)[_draw(len(items))])
        return items
    added = _near_item(list(items))
    if isinstance(added, (list, dict, set)):
        added = _draw(64)
    items.add(added)
    return items


def _changed_dict(items: dict) -> dict:
    keys, move = list(items), _draw(4)
    replaceable = [key for key in keys if _decoy_maker(items[key]) is not None]
    if replaceable and move < 2:
        key = replaceable[_draw(len(replaceable))]
        items[key] = _decoy_maker(items[key])()
    elif keys and move == 2:
        del items[keys[_draw(len(keys))]]
    else:
        key = _near_item([key for key in keys if isinstance(key, (int, str, bytes))])
        items[key] = _near_item(list(items.values()))
    return items


def _near(text: str) -> str:
    """``text`` with one letter or digit replaced by another of its kind (a letter keeps its case,
    so a comparison that ignores case still tells them apart), or with a letter added when it has
    none: a decoy a parser of such strings still reads."""
    places = [i for i, c in enumerate(text) if c.isascii() and c.isalnum()]
    if not places:
        return text + DECOY_LETTERS[_draw(26)]
    i = places[_draw(len(places))]
    kind = DECOY_DIGITS if text[i].isdigit() else DECOY_LETTERS if text[i].islower() else DECOY_LETTERS.upper()
    options = kind.replace(text[i], "")
    return text[:i] + options[_draw(len(options))] + text[i + 1:]


class _Unequal:
    """Stands in for a value of the solution's class its own ``__eq__`` found unequal to a plain
    value, so the assert (or the unittest method) fails as it would have, showing that value."""

    def __init__(self, value: object) -> None:
        self.shown = _describe(value)

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<{self.shown}, not equal by its own __eq__>"


class UntrustedValue(pytest.fail.Exception):
    """A test's assert met a value whose comparison or truth the solution's own code decides."""


class ValueChecks:
    """The trusted side of the asserts in the task's tests (see the module docstring).

    A value is *foreign* when it is, or holds (through builtin containers), an instance of a class
    whose comparison, truth or arithmetic methods come from code that is not trusted (the classes
    the solution defines, a weak proxy, a mock); untrusted subclasses of builtin types are turned
    back into the builtin value with the base type's own methods. A comparison or arithmetic
    operation between a foreign value and one that is not fails the test (equality with a plain
    number or string is asked with decoys, ``honest_equality``); between two foreign
    values (a solution's domain object against one the test built from the solution's class) or
    two trusted ones it is computed as Python computes it."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.static_kinds: dict[type, tuple[bool, bool]] = {}
        self.helpers = {HELPERS[0]: self.compare, HELPERS[1]: self.chain, HELPERS[2]: self.arithmetic,
                        HELPERS[3]: self.truth}

    # -- what a class may decide ---------------------------------------------------------------
    def class_trusted(self, klass: type) -> bool:
        """Whether ``klass`` was made by trusted code: written in C, built by a ``class`` statement
        in a trusted file (noted as it is built), or defined by a module of a trusted file."""
        origin = self.recorder.class_origin.get(id(klass))
        if origin is not None:
            return origin[1]
        if not _type_flags(klass) & HEAPTYPE:
            return True
        module = sys.modules.get(_type_module(klass))
        filename = getattr(module, "__file__", None) if isinstance(module, types.ModuleType) else None
        return isinstance(filename, str) and self.recorder.trusted_file(filename)

    def method_trusted(self, klass: type, value: object) -> bool:
        if value is None:  # __hash__ = None: unhashable, which cannot lie
            return True
        function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if isinstance(function, types.FunctionType):
            filename = function.__code__.co_filename
            if not filename.startswith("<"):
                return self.recorder.trusted_file(filename)
        return self.class_trusted(klass)  # C methods, generated code: as trusted as the class itself

    def kinds(self, cls: type) -> tuple[bool, bool]:
        """(whether code that is not trusted decides comparisons or arithmetic of ``cls``, whether
        it decides its truth)."""
        known = self.static_kinds.get(cls)
        if known is not None:
            return known
        decides = truth = False
        mro = _type_mro(cls)
        own = not self.class_trusted(cls)
        for name in VALUE_DUNDERS:
            for klass in mro:
                namespace = _type_dict(klass)
                if name in namespace:
                    method = namespace[name]
                    if not self.method_trusted(klass, method):
                        decides = True
                        truth = truth or name in TRUTH_DUNDERS
                    elif own and klass is not object and name in DELEGATING and isinstance(method, types.FunctionType):
                        decides = True  # a trusted class's Python method may call back into what the subclass overrides
                    break
        if issubclass(cls, _PROXIES) or _is_mock(cls):
            decides = True
        if not _type_flags(cls) & HEAPTYPE:
            self.static_kinds[cls] = (decides, truth)
        return decides, truth

    # -- values --------------------------------------------------------------------------------
    def clean(self, value: object) -> tuple[object, bool]:
        """(``value`` with untrusted builtin subclasses made builtin, whether it is foreign)."""
        return self._clean(value, {}, 0)

    def _clean(self, value: object, seen: dict[int, tuple[object, bool]], depth: int) -> tuple[object, bool]:
        cls = type(value)
        if cls in SCALARS:
            return value, False
        if id(value) in seen:
            return seen[id(value)]
        if depth > MAX_DEPTH:
            raise UntrustedValue(f"a value nested more than {MAX_DEPTH} deep cannot be checked", pytrace=False)
        seen[id(value)] = (value, False)  # a container that holds itself
        if cls in CONTAINERS:
            result = self._contents(value, cls, seen, depth)
        else:
            decides, _ = self.kinds(cls)
            base = _builtin_base(cls)
            if base is not None:  # an untrusted subclass becomes the builtin value; a trusted one keeps its type
                plain = NORMALISERS[base](value) if decides or not self.class_trusted(cls) else value
                result = self._contents(plain, base, seen, depth) if base in CONTAINERS else (plain, False)
            elif decides:
                result = (value, True)
            else:
                result = (value, self._holds_foreign(value, seen, depth))
        seen[id(value)] = result
        return result

    def _contents(self, value, base: type, seen, depth: int) -> tuple[object, bool]:
        """A builtin container (or a trusted subclass, read through the base type): its items
        cleaned, rebuilt as the base type when one of them changed."""
        foreign = changed = False
        if base is dict:
            pairs = []
            for key, item in dict.items(value):
                new_key, key_foreign = self._clean(key, seen, depth + 1)
                new_item, item_foreign = self._clean(item, seen, depth + 1)
                foreign = foreign or key_foreign or item_foreign
                changed = changed or new_key is not key or new_item is not item
                pairs.append((new_key, new_item))
            return (dict(pairs) if changed else value), foreign
        items = []
        for item in ITEMS[base](value):
            new_item, item_foreign = self._clean(item, seen, depth + 1)
            foreign = foreign or item_foreign
            changed = changed or new_item is not item
            items.append(new_item)
        return (base(items) if changed else value), foreign

    def _holds_foreign(self, value: object, seen, depth: int) -> bool:
        """Whether a trusted value that compares by its contents (a deque, a namespace, a user
        container, a numpy array of objects) holds a foreign one."""
        cls = type(value)
        if isinstance(value, collections.deque):
            parts: object = list(collections.deque.__iter__(value))
        elif isinstance(value, (types.SimpleNamespace, collections.UserDict, collections.UserList,
                                collections.UserString)):
            parts = list(object.__getattribute__(value, "__dict__").values())
        elif _type_module(cls).split(".")[0] == "numpy" and getattr(getattr(value, "dtype", None), "hasobject", False):
            parts = value.tolist()
        else:
            return False
        return self._clean(parts, seen, depth + 1)[1]

    @staticmethod
    def refuse(what: str) -> None:
        raise UntrustedValue(f"{what}: the solution's own code would decide this check, so it does not pass "
                             "(a value the tests compare must be a plain value, or compared with one of its "
                             "own kind)", pytrace=False)

    # -- the helpers the rewritten asserts call -------------------------------------------------
    def pair(self, what: str, left: object, right: object) -> tuple[object, object]:
        """The two operands of a comparison as it will be made: cleaned when neither is foreign,
        as they are when both are (two of the solution's values: as the solution says)."""
        clean_left, left_foreign = self.clean(left)
        if what in MEMBERSHIP and not left_foreign and self.own_container(right):
            return clean_left, right  # a plain value in one of the solution's containers: the container says
        clean_right, right_foreign = self.clean(right)
        if left_foreign != right_foreign:
            if what in EQUALITY:  # a domain object equal to a number or a string: asked with decoys
                foreign, plain = (clean_left, clean_right) if left_foreign else (clean_right, clean_left)
                equal = self.honest_equality(foreign, plain, lambda value: self.clean(value)[1])
                if equal is not None:
                    if equal:
                        return plain, plain
                    return (_Unequal(left), plain) if left_foreign else (plain, _Unequal(right))
            self.refuse(f"{_describe(left)} {what} {_describe(right)}")
        return (left, right) if left_foreign else (clean_left, clean_right)

    @staticmethod
    def honest_equality(foreign: object, plain: object, is_foreign=None) -> bool | None:
        """Whether ``foreign`` (a value whose class has its own ``__eq__``, or a container holding
        such values) equals the plain number, string, bytes or container ``plain``, by its own
        ``__eq__``, asked in a drawn order among sixteen to thirty-one decoys of ``plain`` (plain
        values near it): None, and the check fails, when it calls a decoy equal
        too (as well as the value itself) or answers with something other than a bool. A class that answers "equal" to anything
        is caught; one that computes its answer from the value it is given is not lying.

        A list, tuple or dict (with plain keys) of such values is compared item by item, each item
        of the solution's asked with decoys of its own: asked through the whole container, an item
        would see its expected value in every decoy that changes another item, and a value that
        calls equal what it has seen before would pass. ``is_foreign`` tells an item of the
        solution's from a plain one (default: anything but a builtin scalar)."""
        is_foreign = is_foreign or (lambda value: type(value) not in SCALARS)
        if type(foreign) in (list, tuple) or type(foreign) is dict and not any(map(is_foreign, foreign)):
            return ValueChecks._honest_items(foreign, plain, is_foreign)
        decoys = _decoys(plain)
        if not decoys:
            return None
        asked = [plain, *decoys]
        for i in range(len(asked) - 1, 0, -1):  # Fisher-Yates with the OS's random source
            j = _draw(i + 1)
            asked[i], asked[j] = asked[j], asked[i]
        answers = []
        for value in asked:
            try:
                answer = foreign == value
            except Exception:
                if value is plain:
                    raise  # as the comparison itself would have
                answer = False  # a parser that refuses a decoy does not call it equal
            if type(answer) is not bool:
                return None
            answers.append((value is plain, answer))
        equal = next(answer for is_plain, answer in answers if is_plain)
        if equal and any(answer for is_plain, answer in answers if not is_plain):
            return None  # equal to the value and to a decoy: its answer says nothing
        return equal  # a value equal to a decoy only is simply another value (``Version("2.0") != "2.1"``)

    @staticmethod
    def _honest_items(foreign: list | tuple | dict, plain: object, is_foreign) -> bool | None:
        """``honest_equality`` of a builtin list, tuple or dict with plain keys, item by item: False
        where Python's own comparison is False before any item is asked (another type, length or
        key set); None when an item's answer says nothing."""
        if not isinstance(plain, list if type(foreign) is list else tuple if type(foreign) is tuple else dict):
            return False
        if len(foreign) != len(plain):
            return False
        if type(foreign) is dict:
            if set(foreign) != set(plain):
                return False
            pairs = [(foreign[key], plain[key]) for key in foreign]
        else:
            pairs = list(zip(foreign, plain))
        equal = True
        for item, expected in pairs:
            answer = (ValueChecks.honest_equality(item, expected, is_foreign) if is_foreign(item)
                      else bool(item == expected))
            if answer is None:
                return None
            equal = equal and answer
        return equal

    def compare(self, symbol: str, left: object, right: object) -> object:
        if symbol in ("is", "is not"):
            return COMPARE[symbol](left, right)
        return COMPARE[symbol](*self.pair(symbol, left, right))

    def own_container(self, value: object) -> bool:
        """Whether ``value`` is an instance of one of the solution's own classes (not a builtin
        subclass) whose membership test is its own."""
        cls = type(value)
        if cls in SCALARS or cls in CONTAINERS or _builtin_base(cls) is not None:
            return False
        mro = _type_mro(cls)
        for name in ("__contains__", "__iter__", "__getitem__"):
            klass = next((k for k in mro if name in _type_dict(k)), None)
            if klass is not None and not self.method_trusted(klass, _type_dict(klass)[name]):
                return True
        return False

    def chain(self, left: object, *steps: object) -> bool:
        """``left op1 b op2 c ...``: ``steps`` alternate symbols and thunks of the operands."""
        for symbol, thunk in zip(steps[::2], steps[1::2], strict=True):
            right = thunk()
            if not self.truth(self.compare(symbol, left, right)):
                return False
            left = right
        return True

    def arithmetic(self, symbol: str, left: object, right: object) -> object:
        operation = OPERATORS[symbol]
        clean_left, left_foreign = self.clean(left)
        clean_right, right_foreign = self.clean(right)
        if left_foreign and right_foreign:
            return operation(left, right)
        if not left_foreign and not right_foreign:
            return operation(clean_left, clean_right)
        result = operation(left if left_foreign else clean_left, right if right_foreign else clean_right)
        if self.clean(result)[1]:
            return result  # still the solution's own value: the comparison that follows decides
        self.refuse(f"{_describe(left)} {symbol} {_describe(right)} makes a plain value through the solution's "
                    "own operator")

    def truth(self, value: object) -> bool:
        cls = type(value)
        if cls is bool:
            return value
        if cls in SCALARS or cls in CONTAINERS:
            return bool(value)
        _, decides_truth = self.kinds(cls)
        if decides_truth:
            base = _builtin_base(cls)
            if base is None:
                self.refuse(f"the truth of {_describe(value)}")
            return bool(NORMALISERS[base](value))
        return bool(value)


def _builtin_base(cls: type) -> type | None:
    return next((base for base in NORMALISERS if issubclass(cls, base)), None)


def _is_mock(cls: type) -> bool:
    mock = sys.modules.get("unittest.mock")
    return mock is not None and issubclass(cls, mock.NonCallableMock)


def _describe(value: object) -> str:
    cls = type(value)
    return f"a {cls.__qualname__} ({_type_module(cls)})" if cls not in SCALARS else repr(value)[:60]


class GuardAsserts(ast.NodeTransformer):
    """Rewrites the expressions of an assert (pytest's rewriting of it included) so that every
    comparison, arithmetic operation and truth test goes through ``ValueChecks``."""

    def _call(self, name: str, args: list[ast.expr], like: ast.AST) -> ast.expr:
        call = ast.Call(ast.Name(name, ast.Load()), args, [])
        for node in (call, call.func, *(arg for arg in args if isinstance(arg, (ast.Constant, ast.Lambda)))):
            ast.copy_location(node, like)
        return call

    def truth(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return node
        if isinstance(node, ast.BoolOp):
            node.values = [self.truth(value) for value in node.values]
            return node
        if isinstance(node, ast.Constant) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in HELPERS[:2]):
            return node
        return self._call(HELPERS[3], [node], node)

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        if all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) or (
                isinstance(node.left, ast.Constant) and isinstance(node.comparators[0], ast.Call)
                and isinstance(node.comparators[0].func, ast.Name) and node.comparators[0].func.id == "locals"):
            return node  # identity cannot lie; pytest's own "name in locals()" checks
        symbols = [ast.Constant(COMPARE_SYMBOLS[type(op)]) for op in node.ops]
        if len(node.ops) == 1:
            return self._call(HELPERS[0], [symbols[0], node.left, node.comparators[0]], node)
        steps: list[ast.expr] = []
        for symbol, operand in zip(symbols, node.comparators, strict=True):
            thunk = ast.Lambda(ast.arguments([], [], None, [], [], None, []), operand)
            steps += [symbol, thunk]
        return self._call(HELPERS[1], [node.left, *steps], node)

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
            return node  # pytest's explanation templates
        return self._call(HELPERS[2], [ast.Constant(ARITHMETIC[type(node.op)]), node.left, node.right], node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = self.truth(node.operand)
        return node

    def _test(self, node):
        self.generic_visit(node)
        node.test = self.truth(node.test)
        return node

    visit_If = visit_While = visit_IfExp = visit_Assert = _test

    def visit_comprehension(self, node: ast.comprehension) -> ast.comprehension:
        self.generic_visit(node)
        node.ifs = [self.truth(test) for test in node.ifs]
        return node


def _checked_assert(values: ValueChecks, name: str, original):
    """``unittest.TestCase.<name>`` with its operands checked as the rewritten asserts check them."""
    if name in UNITTEST_TRUTHS:
        def checked(self, expr, *args, **kwargs):
            return original(self, values.truth(expr), *args, **kwargs)
    else:
        def checked(self, first, second, *args, **kwargs):
            first, second = values.pair(name, first, second)
            return original(self, first, second, *args, **kwargs)
    return functools.wraps(original)(checked)


def install_value_checks(recorder: Recorder) -> None:
    """Route the asserts of the task's test files through ``recorder.values`` (pytest's rewriting
    of them kept, a cached pyc of them never used), and note which classes trusted code builds."""
    import unittest

    from _pytest.assertion import rewrite

    visit_assert = rewrite.AssertionRewriter.visit_Assert
    rewrite_asserts = rewrite.rewrite_asserts
    read_pyc, write_pyc = rewrite._read_pyc, rewrite._write_pyc
    exec_module = rewrite.AssertionRewritingHook.exec_module
    build_class = builtins.__build_class__

    def guarded_visit_assert(self, assert_: ast.Assert) -> list[ast.stmt]:
        statements = visit_assert(self, assert_)
        if recorder.guarded_source(self.module_path):
            guard = GuardAsserts()
            statements = [guard.visit(statement) for statement in statements]
        return statements

    def guarded_rewrite_asserts(mod: ast.Module, source: bytes, module_path: str | None = None,
                                config: pytest.Config | None = None) -> None:
        rewrite_asserts(mod, source, module_path, config)
        if recorder.guarded_source(module_path):  # asserts pytest left alone (PYTEST_DONT_REWRITE)
            for node in ast.walk(mod):
                if isinstance(node, ast.Assert):
                    GuardAsserts().visit(node)

    def guarded_read_pyc(source, pyc, trace=lambda message: None):
        return None if recorder.guarded_source(source) else read_pyc(source, pyc, trace)

    def guarded_write_pyc(state, co, source_hash, pyc) -> bool:
        return False if recorder.guarded_source(co.co_filename) else write_pyc(state, co, source_hash, pyc)

    def guarded_exec_module(self, module: types.ModuleType) -> None:
        if recorder.guarded_source(getattr(module.__spec__, "origin", None)):
            vars(module).update(recorder.values.helpers)
            recorder.guarded_modules[module.__name__] = module
        return exec_module(self, module)

    def noted_build_class(function, name, *bases, **keywords):
        cls = build_class(function, name, *bases, **keywords)
        if isinstance(cls, type):
            recorder.class_origin[id(cls)] = (cls, recorder.trusted_file(function.__code__.co_filename))
        return cls

    import _signal

    set_handler = _signal.signal

    def frameless_handlers(signalnum, handler):
        """``_signal.signal`` (which ``signal.signal`` calls): a handler from untrusted code gets no
        frame (the frame a signal interrupts is the test's, as often as not)."""
        if callable(handler) and not recorder.trusted_value(handler):
            untrusted = handler
            handler = functools.wraps(untrusted)(lambda signum, frame: untrusted(signum, None))
        return set_handler(signalnum, handler)

    _signal.signal = frameless_handlers
    for name in UNITTEST_PAIRS + UNITTEST_TRUTHS:
        setattr(unittest.TestCase, name, _checked_assert(recorder.values, name, getattr(unittest.TestCase, name)))
    rewrite.AssertionRewriter.visit_Assert = guarded_visit_assert
    rewrite.rewrite_asserts = guarded_rewrite_asserts
    rewrite._read_pyc, rewrite._write_pyc = guarded_read_pyc, guarded_write_pyc
    rewrite.AssertionRewritingHook.exec_module = guarded_exec_module
    builtins.__build_class__ = noted_build_class


_settings = os.environ.pop(SETTINGS_VARIABLE, None)
_recorder = Recorder(json.loads(_settings)) if _settings else None
if _recorder is not None:
    sys.addaudithook(_recorder.audit)
    if _recorder.guard_values:
        install_value_checks(_recorder)


def _ours(config: pytest.Config) -> bool:
    return _recorder is not None and _recorder.config is config


def pytest_configure(config: pytest.Config) -> None:
    if _recorder is not None and _recorder.config is None:
        _recorder.config = config  # an in-process nested session (pytester) is not reported


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if _ours(session.config):
        _recorder.emit("start", pid=os.getpid())


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    if _ours(session.config):
        _recorder.remember_items(session.items)
        if _recorder.guard_values:
            _recorder.hide_test_modules(session.items)
        _recorder.emit("collected", count=len(session.items))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _recorder is not None and _recorder.config is not None and report.failed:
        _recorder.emit("collect_error", nodeid=report.nodeid)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item):
    if not _ours(item.config):
        return (yield)
    _recorder.check_item(item)
    _recorder.check_value_helpers(item)
    try:
        return (yield)
    finally:
        _recorder.check_value_helpers(item)  # replaced while the test ran


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _recorder is not None and not _recorder.finished:
        _recorder.reports.setdefault(report.nodeid, {})[report.when] = report


def pytest_plugin_registered(plugin: object, manager: pytest.PytestPluginManager) -> None:
    if _recorder is not None:
        for caller in manager.get_hookcallers(plugin) or ():
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    _recorder.check_hook(caller.name, impl.function)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    if _recorder is None or _recorder.config is None or _recorder.finished:
        return
    module = nodeid.split("::")[0]
    if module != _recorder.last_module or time.monotonic() - _recorder.last_check >= STATE_CHECK_EVERY_S:
        _recorder.check_state()
        _recorder.last_module, _recorder.last_check = module, time.monotonic()
    result = outcome(_recorder.reports.pop(nodeid, {}))
    _recorder.emit("test", nodeid=nodeid, outcome="error" if nodeid in _recorder.distrusted else result)
    _recorder.tests += 1


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _ours(session.config) and not _recorder.finished:
        _recorder.check_state()
        _recorder.finished = True
        _recorder.emit("finish", exitstatus=int(session.exitstatus), tests=_recorder.tests)


def outcome(reports: dict[str, pytest.TestReport]) -> str:
    """One item's outcome from its setup, call and teardown reports: an error in setup, then a
    failing call, then an error in teardown, then a skip (xfail included) decide it."""
    setup, call, teardown = (reports.get(when) for when in ("setup", "call", "teardown"))
    if setup is None or setup.failed:
        return "error"
    if call is not None and call.failed:
        return "failed"
    if teardown is not None and teardown.failed:
        return "error"
    if setup.skipped or (call is not None and call.skipped):
        return "skipped"
    return "passed" if call is not None and call.passed else "error"
