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
  class of ``builtins``, ``pytest``, ``_pytest``, ``pluggy`` and ``unittest`` and of the methods of
  their classes: one replaced by code that is not trusted is a violation (``unittest.TestCase.
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

Trusted code is code in files of the Python installation, of this folder, and of the ``trusted``
workspace paths (the task's tests and test configuration); with ``trusted`` null (the task
generators, which run code they wrote themselves) every file is trusted and the hidden-source
guard is off. Code in the same process can still get around all of this (by finding the recorder
through the garbage collector, by compiling code under a file name it does not have, through a
child process that reads the tests): these checks catch the tampering a policy stumbles on, not
every tampering a determined one could write.
"""

from __future__ import annotations

import builtins
import json
import operator
import os
import sys
import sysconfig
import threading
import time
import types

import pytest

SETTINGS_VARIABLE = "OPENCOMPOSER_TESTRUN"
WATCHED_PACKAGES = ("pytest", "_pytest", "pluggy", "unittest")
STATE_CHECK_EVERY_S = 1.0  # besides after each test module and at the end
DISPLAY_MODULES = ("linecache", "traceback", "warnings", "tokenize")  # read source only to show it
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
        self.config: pytest.Config | None = None
        self.reports: dict[str, dict[str, pytest.TestReport]] = {}
        self.tests = 0
        self.finished = False
        self.violations: set[str] = set()
        self.trust_cache: dict[str, bool] = {}
        self.trusted_hooks: dict[int, object] = {}
        self.distrusted: set[str] = set()
        self.snapshot = snapshot()
        self.collected: dict[str, list[tuple[object, str, object, object]]] = {}
        self.write_lock = threading.Lock()  # a violation may be found on any thread
        self.auditing = threading.local()  # per thread: set while the audit hook checks a file
        self.last_module = ""
        self.last_check = time.monotonic()

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
        """Refuse to open a hidden test source while untrusted code is on the stack."""
        if event != "open" or not self.hidden or getattr(self.auditing, "busy", False):
            return
        path = args[0]
        if not isinstance(path, (str, bytes, os.PathLike)):
            return
        self.auditing.busy = True
        try:
            if os.path.realpath(os.fsdecode(path)) not in self.hidden:
                return
            frame = sys._getframe(1)
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
                else:
                    trusted = self.trusted_file(filename)
                    if innermost_trusted is None:
                        innermost_trusted = trusted
                    untrusted = untrusted or not trusted
                frame = frame.f_back
        finally:
            self.auditing.busy = False
        if untrusted:
            if innermost_trusted is False and not for_display:
                self.violation(f"untrusted code opened the hidden test file {os.fsdecode(path)}")
            raise PermissionError(f"{os.fsdecode(path)}: hidden test files cannot be read by the code under test")


def snapshot() -> list[tuple[dict, tuple[str, ...], tuple[object, ...], tuple[str, ...]]]:
    """(namespace, names, values, labels) for every watched module and each class it defines:
    its functions and classes, or the class's methods, as they are now."""
    import unittest  # noqa: F401  (imported now, before the code under test can replace its asserts)

    groups = []

    def group(namespace, items: list[tuple[str, object]], prefix: str) -> None:
        if items:
            names, values = zip(*items, strict=True)
            groups.append((namespace, names, values, tuple(f"{prefix}{name}" for name in names)))

    modules = [module for name, module in sorted(sys.modules.items())
               if isinstance(module, types.ModuleType) and name.split(".")[0] in WATCHED_PACKAGES]
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


_settings = os.environ.pop(SETTINGS_VARIABLE, None)
_recorder = Recorder(json.loads(_settings)) if _settings else None
if _recorder is not None:
    sys.addaudithook(_recorder.audit)


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
        _recorder.emit("collected", count=len(session.items))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _recorder is not None and _recorder.config is not None and report.failed:
        _recorder.emit("collect_error", nodeid=report.nodeid)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item):
    if _ours(item.config):
        _recorder.check_item(item)
    return (yield)


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
