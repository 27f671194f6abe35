"""codebase_search and find_files: ranking, code words, globs, the sandbox's path rules, argument
checks, ``agent.tools`` and what the prompt lists, and the embeddings rankers (a fake endpoint)."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from opencomposer.agent.loop import AgentLoop
from opencomposer.agent.policies.scripted import ScriptedPolicy, call
from opencomposer.agent.search import (
    INDEX_MAX_FILE_BYTES,
    chunk_file,
    glob_match,
    glob_parts,
    is_test_path,
    openai_embedder,
    tokenize,
)
from opencomposer.agent.tools import TOOL_NAMES, Toolbox, ToolError, tool_schemas
from opencomposer.config import SandboxConfig
from opencomposer.config.agent import DEFAULT_TOOLS, AgentConfig, SearchConfig
from opencomposer.config.agent import TOOL_NAMES as CONFIG_TOOL_NAMES
from opencomposer.config.section import ConfigError
from opencomposer.sandbox.workspace import Sandbox
from opencomposer.types import Context, Episode, PolicyOutput, Task, ToolCall

SEARCH_TOOLS = [*DEFAULT_TOOLS, "codebase_search", "find_files"]
HOST_ONLY = SandboxConfig(isolation="none")  # these tools never run a command
pytestmark = pytest.mark.filterwarnings("ignore:sandbox.isolation")

CART = '''"""The shopping cart."""

from shop.pricing import round_cents


def apply_discount(total, percent):
    """Take ``percent`` off ``total``."""
    return round_cents(total * (1 - percent / 100))


class ShoppingCart:
    """Items and their prices."""

    def __init__(self):
        self.items = []

    def add_item(self, name, price):
        self.items.append((name, price))

    def total(self):
        return sum(price for _, price in self.items)
'''
PRICING = '''from decimal import Decimal


def round_cents(value):
    return float(Decimal(value).quantize(Decimal("0.01")))


def price_after_discounts(cart, percents):
    # calls apply_discount once per code; apply_discount is in shop.cart
    from shop.cart import apply_discount
    total = cart.total()
    for percent in percents:
        total = apply_discount(total, percent)
    return total
'''
TEST_CART = '''from shop.cart import ShoppingCart, apply_discount


def test_apply_discount():
    assert apply_discount(100, 10) == 90


def test_add_item():
    cart = ShoppingCart()
    cart.add_item("tea", 3)
    assert cart.total() == 3
'''


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "src" / "shop").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "src" / "shop" / "__init__.py").write_text("")
    (repo / "src" / "shop" / "cart.py").write_text(CART)
    (repo / "src" / "shop" / "pricing.py").write_text(PRICING)
    (repo / "tests" / "test_cart.py").write_text(TEST_CART)
    (repo / "README.md").write_text("# Shop\n\nA cart with discounts and prices rounded to cents.\n")
    (repo / "docs").mkdir()
    (repo / "docs" / "notes.txt").write_text("\n".join(f"note {i}" for i in range(100)) + "\nwarehouse inventory\n")
    return repo


def make_box(repo: Path, tools=SEARCH_TOOLS, embedder=None, **search) -> Toolbox:
    config = AgentConfig(tools=list(tools), search=SearchConfig(**search))
    return Toolbox(Sandbox(repo, HOST_ONLY), config=config, embedder=embedder)


def run(box: Toolbox, name: str, **arguments) -> str:
    return box.execute(ToolCall(name, arguments))


def heads(output: str) -> list[str]:
    """The header line of each result: 'path:start-end symbol'."""
    return [block.splitlines()[0] for block in output.split("\n\n") if not block.startswith("[")]


# ----------------------------------------------------------------------------------------------
# Words and chunks


def test_tokenize_keeps_identifiers_and_splits_their_words():
    assert tokenize("parseConfigFile") == ["parseconfigfile", "parse", "config", "file"]
    assert tokenize("HTTPServer max_retries") == ["httpserver", "http", "server", "max_retry", "max", "retry"]
    assert tokenize("how do I read the files?") == ["read", "file"]  # stop words out, plural in
    assert tokenize("class Status") == ["class", "status"]


def test_python_files_are_chunked_by_symbol_with_windows_between():
    chunks = chunk_file("src/shop/cart.py", CART)
    assert [(c.start, c.end, c.symbol) for c in chunks] == [
        (1, 3, ""),  # the module docstring and imports
        (6, 8, "def apply_discount"),
        (11, 12, "class ShoppingCart"),
        (14, 15, "def ShoppingCart.__init__"),
        (17, 18, "def ShoppingCart.add_item"),
        (20, 21, "def ShoppingCart.total"),
    ]
    notes = chunk_file("docs/notes.txt", "\n".join(f"n{i}" for i in range(100)))
    assert [(c.start, c.end) for c in notes] == [(1, 40), (41, 80), (81, 100)]
    assert [(c.start, c.end, c.symbol) for c in chunk_file("bad.py", "def broken(:\n  pass\n")] == [(1, 2, "")]


def test_test_files_are_told_apart():
    assert [is_test_path(p) for p in ("tests/test_cart.py", "src/pkg/tests/helpers.py", "test_x.py", "pkg/x_test.py",
                                      "conftest.py", "src/shop/cart.py", "src/testing_utils.py", "contest.py")] == [
        True, True, True, True, True, False, False, False]


def test_globs_match_by_segment():
    assert glob_match(glob_parts("**/*.py"), "a/b/c.py".split("/"))
    assert glob_match(glob_parts("**/*.py"), ["c.py"])
    assert glob_match(glob_parts("src/**/test_*.py"), "src/x/y/test_z.py".split("/"))
    assert not glob_match(glob_parts("src/**/test_*.py"), "tests/test_z.py".split("/"))
    assert not glob_match(glob_parts("*.py"), "a/c.py".split("/"))  # '*' stays in its folder


# ----------------------------------------------------------------------------------------------
# codebase_search


def test_the_file_defining_a_name_ranks_first(workspace: Path):
    box = make_box(workspace)
    assert heads(run(box, "codebase_search", query="apply_discount"))[0] == "src/shop/cart.py:6-8 def apply_discount"
    assert heads(run(box, "codebase_search", query="round_cents", limit=1)) == [
        "src/shop/pricing.py:4-5 def round_cents"]
    found = heads(run(box, "codebase_search", query="add an item to the shopping cart"))
    # the test uses every word of the request too; the implementation is what a request changes
    assert found[0] == "src/shop/cart.py:17-18 def ShoppingCart.add_item"
    assert "tests/test_cart.py:8-11 def test_add_item" in found[1:4]
    first = run(box, "codebase_search", query="warehouse inventory").split("\n\n")[0]
    assert first == "docs/notes.txt:81-101\n   101\twarehouse inventory"  # the window, from its matching line


def test_search_shows_a_snippet_and_follows_edits(workspace: Path):
    box = make_box(workspace)
    assert run(box, "codebase_search", query="apply_discount", limit=1) == (
        "src/shop/cart.py:6-8 def apply_discount\n"
        "     6\tdef apply_discount(total, percent):\n"
        '     7\t    """Take ``percent`` off ``total``."""\n'
        "     8\t    return round_cents(total * (1 - percent / 100))"
    )
    assert run(box, "codebase_search", query="refund_order").startswith("no results for 'refund_order'")
    run(box, "write_file", path="src/shop/refunds.py", content="def refund_order(order):\n    return order\n")
    assert heads(run(box, "codebase_search", query="refund_order")) == ["src/shop/refunds.py:1-2 def refund_order"]
    box.sandbox.resolve("src/shop/refunds.py").unlink()
    assert run(box, "codebase_search", query="refund_order").startswith("no results")
    run(box, "write_file", path="notes.txt", content="kiwi")
    assert heads(run(box, "codebase_search", query="kiwi")) == ["notes.txt:1-1"]
    stamp = box.sandbox.resolve("notes.txt").stat().st_mtime_ns
    run(box, "write_file", path="notes.txt", content="lime")  # same size and, on a coarse clock, same mtime:
    os.utime(box.sandbox.resolve("notes.txt"), ns=(stamp, stamp))
    assert heads(run(box, "codebase_search", query="lime")) == ["notes.txt:1-1"]  # the tool's own write counts


def test_search_glob_restricts_the_files(workspace: Path):
    box = make_box(workspace)
    found = heads(run(box, "codebase_search", query="apply_discount", glob="tests/**"))
    assert found and all(h.startswith("tests/test_cart.py:") for h in found)
    assert "no results for 'apply_discount' in files matching 'docs/*'" in run(
        box, "codebase_search", query="apply_discount", glob="docs/*")


def test_search_arguments_are_checked(workspace: Path):
    box = make_box(workspace)
    cases = [
        ({}, "missing required argument 'query'"),
        ({"query": "  "}, "`query` must not be empty"),
        ({"query": "the of and"}, "has no words to search for"),
        ({"query": "x" * 2001}, "keep it under 2000"),
        ({"query": "cart", "limit": 0}, "limit must be between 1 and 50, got 0"),
        ({"query": "cart", "limit": 51}, "limit must be between 1 and 50, got 51"),
        ({"query": "cart", "limit": "5"}, "argument 'limit' must be an integer"),
        ({"query": "cart", "limit": True}, "argument 'limit' must be an integer"),
        ({"query": "cart", "path": "src"}, "unknown argument 'path'; valid arguments: query, limit, glob"),
        ({"query": "cart", "glob": ""}, "the pattern is empty"),
    ]
    for arguments, message in cases:
        with pytest.raises(ToolError, match=message.replace("(", r"\(").replace("*", r"\*")):
            box.execute(ToolCall("codebase_search", arguments))


# ----------------------------------------------------------------------------------------------
# find_files


def test_find_files_globs_sorted(workspace: Path):
    box = make_box(workspace)
    assert run(box, "find_files", pattern="**/*.py") == (
        "src/shop/__init__.py\nsrc/shop/cart.py\nsrc/shop/pricing.py\ntests/test_cart.py")
    assert run(box, "find_files", pattern="**/test_*.py") == "tests/test_cart.py"
    assert run(box, "find_files", pattern="src/**/c*.py") == "src/shop/cart.py"
    assert run(box, "find_files", pattern="*.md") == "README.md"
    assert run(box, "find_files", pattern="/workspace/docs/*") == "docs/notes.txt"
    assert run(box, "find_files", pattern="*.py") == (
        "no files match '*.py'; a pattern without '/' matches the root folder only: try '**/*.py'")
    assert run(box, "find_files", pattern="src/shop") == "no files match 'src/shop'; 'src/shop' is a folder: try 'src/shop/**'"
    assert run(box, "find_files", pattern="**") == run(box, "find_files", pattern="**/*")
    assert run(box, "find_files", pattern="src/cart.py") == "no files match 'src/cart.py'"


def test_find_files_caps_its_output(workspace: Path):
    many = workspace / "data"
    many.mkdir()
    for i in range(250):
        (many / f"f{i:03d}.txt").write_text("x")
    lines = run(make_box(workspace), "find_files", pattern="data/*.txt").splitlines()
    assert len(lines) == 201 and lines[0] == "data/f000.txt" and lines[199] == "data/f199.txt"
    assert lines[-1] == "[250 files match; the first 200 are shown: narrow the pattern]"


# ----------------------------------------------------------------------------------------------
# The sandbox's path rules


@pytest.fixture
def attacked(workspace: Path, tmp_path: Path) -> Path:
    """The workspace with a folder and a file linked in from outside, a link inside, a git folder
    and a file over the index's size cap; the words 'zebrafish' and 'okapi' are only out of reach."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("def zebrafish_token():\n    return 'hunter2'\n")
    (workspace / "linked_dir").symlink_to(outside)
    (workspace / "leak.py").symlink_to(outside / "secret.py")
    (workspace / "alias").symlink_to("src")  # relative: it points inside the sandbox's copy too
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("okapi = 1\n")
    (workspace / "big.txt").write_text("okapi\n" + "y" * INDEX_MAX_FILE_BYTES)
    return workspace


def test_links_out_are_neither_followed_nor_listed(attacked: Path):
    box = make_box(attacked)
    listed = run(box, "find_files", pattern="**/*")
    assert listed.splitlines() == ["README.md", "big.txt", "docs/notes.txt", "src/shop/__init__.py",
                                   "src/shop/cart.py", "src/shop/pricing.py", "tests/test_cart.py"]
    assert run(box, "find_files", pattern="**/*.py").count("secret") == 0
    assert run(box, "codebase_search", query="zebrafish_token hunter2").startswith("no results")
    with pytest.raises(ToolError, match="resolves outside the workspace"):
        run(box, "find_files", pattern="linked_dir/*.py")
    with pytest.raises(ToolError, match="'alias' is a symbolic link; find_files does not follow links"):
        run(box, "find_files", pattern="alias/**/*.py")


def test_paths_out_of_the_workspace_are_refused(attacked: Path):
    box = make_box(attacked)
    for pattern, message in [("../*", "'..' is not allowed"), ("src/../../*", "'..' is not allowed"),
                             ("/etc/*", "is absolute; give it relative to the workspace root"),
                             ("/workspace/../etc/*", "'..' is not allowed")]:
        with pytest.raises(ToolError, match=message):
            run(box, "find_files", pattern=pattern)
        with pytest.raises(ToolError, match=message):
            run(box, "codebase_search", query="cart", glob=pattern)


def test_git_folder_and_huge_files_are_not_searched(attacked: Path):
    out = run(make_box(attacked), "codebase_search", query="okapi")
    assert out.startswith("no results for 'okapi'")
    assert out.endswith("[1 file(s) over 1 MiB are not searched, e.g. big.txt; use grep]")


# ----------------------------------------------------------------------------------------------
# agent.tools and what the model is given


def test_tool_names_agree_and_the_default_set_is_unchanged():
    assert CONFIG_TOOL_NAMES == TOOL_NAMES
    assert AgentConfig().tools == list(DEFAULT_TOOLS)
    assert [s["function"]["name"] for s in tool_schemas()] == list(DEFAULT_TOOLS)
    names = [s["function"]["name"] for s in tool_schemas(["finish", "find_files", "read_file"])]
    assert names == ["read_file", "finish", "find_files"]  # in TOOLS order, whatever the recipe's order


def test_agent_tools_is_validated():
    with pytest.raises(ConfigError, match="agent.tools: unknown tool 'semantic_search'; the tools are: read_file, "
                                          "list_dir, grep, edit, write_file, run, finish, codebase_search, find_files"):
        AgentConfig(tools=["semantic_search", "finish"])
    with pytest.raises(ConfigError, match="must include 'finish'"):
        AgentConfig(tools=["read_file"])
    with pytest.raises(ConfigError, match="each tool may be listed once"):
        AgentConfig(tools=["finish", "finish"])
    with pytest.raises(ConfigError, match='needs agent.search.embeddings = "openai:MODEL"'):
        SearchConfig(ranker="hybrid")
    with pytest.raises(ConfigError, match="does nothing with agent.search.ranker"):
        SearchConfig(embeddings="openai:e5")
    with pytest.raises(ConfigError, match='does nothing without "codebase_search"'):
        AgentConfig(search=SearchConfig(ranker="embeddings", embeddings="openai:e5"))


def test_a_disabled_tool_is_refused(workspace: Path):
    box = make_box(workspace, tools=DEFAULT_TOOLS)
    with pytest.raises(ToolError, match="tool 'codebase_search' is not enabled in this environment; the tools are: "
                                        "read_file, list_dir, grep, edit, write_file, run, finish"):
        run(box, "codebase_search", query="cart")
    box = make_box(workspace, tools=["read_file", "finish", "find_files"])
    with pytest.raises(ToolError, match="tool 'grep' is not enabled .*the tools are: read_file, finish, find_files"):
        run(box, "grep", pattern="cart")


class ToolsSeen(ScriptedPolicy):
    """The scripted policy, noting the tools each turn was offered."""

    def act(self, context: Context) -> PolicyOutput:
        self.offered = [s["function"]["name"] for s in context.tools]
        return super().act(context)


def episode(repo: Path, tools: list[str]) -> tuple[Episode, list[str]]:
    policy = ToolsSeen([[call("find_files", pattern="**/cart.py")],
                        [call("codebase_search", query="apply_discount", limit=1)]])
    task = Task(id="shop", instruction="Find the discount code.", repo=repo)
    with Sandbox(repo, HOST_ONLY) as sandbox:
        result = AgentLoop(policy, task, sandbox, AgentConfig(tools=tools)).run()
    return result, policy.offered


def tool_outputs(result: Episode) -> list[str]:
    return [m.content for segment in result.segments for m in segment.messages if m.role == "tool"]


def test_the_loop_offers_and_runs_exactly_the_enabled_tools(workspace: Path):
    result, offered = episode(workspace, SEARCH_TOOLS)
    assert offered == SEARCH_TOOLS
    found, ranked = tool_outputs(result)[:2]
    assert found == "src/shop/cart.py" and ranked.startswith("src/shop/cart.py:6-8 def apply_discount")
    result, offered = episode(workspace, list(DEFAULT_TOOLS))
    assert offered == list(DEFAULT_TOOLS)
    assert "tool 'find_files' is not enabled" in tool_outputs(result)[0]
    assert [turn.rejected_tool_calls for turn in result.turns[:2]] == [1, 1]


# ----------------------------------------------------------------------------------------------
# Embeddings


CONCEPTS = {"money": ["discount", "price", "cents", "cheaper", "cost", "total"], "goods": ["item", "cart", "basket"],
            "stock": ["warehouse", "inventory", "shelf"]}


def concept_embed(texts: list[str]) -> list[list[float]]:
    """A fake embedding model: one dimension per concept, counting the words that belong to it."""
    return [[sum(w.startswith(tuple(words)) for w in tokenize(text)) + 1e-3 for words in CONCEPTS.values()]
            for text in texts]


def test_embeddings_rank_by_meaning_where_words_do_not_match(workspace: Path):
    query = "what is on the shelf"  # no word of notes.txt's last window but 'shelf' ~ 'warehouse inventory'
    assert run(make_box(workspace), "codebase_search", query=query).startswith("no results")
    box = make_box(workspace, ranker="embeddings", embeddings="openai:fake", embedder=concept_embed)
    assert heads(run(box, "codebase_search", query=query))[0] == "docs/notes.txt:81-101"
    hybrid = make_box(workspace, ranker="hybrid", embeddings="openai:fake", embedder=concept_embed)
    assert heads(run(hybrid, "codebase_search", query="apply_discount cheaper"))[0] == (
        "src/shop/cart.py:6-8 def apply_discount")


def test_a_failing_endpoint_falls_back_to_words(workspace: Path):
    def broken(texts):
        raise OSError("connection refused")

    out = run(make_box(workspace, ranker="embeddings", embeddings="openai:fake", embedder=broken),
              "codebase_search", query="apply_discount", limit=1)
    assert out.startswith("src/shop/cart.py:6-8 def apply_discount")
    assert out.endswith("[the embeddings endpoint failed (OSError: connection refused); ranked by words alone]")


@pytest.fixture
def endpoint():
    """A fake OpenAI-compatible embeddings server (``concept_embed``); yields its URL and the
    requests it received as (path, Authorization header, body)."""
    requests = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append((self.path, self.headers.get("Authorization"), body))
            data = [{"index": i, "embedding": concept_embed([text])[0]} for i, text in enumerate(body["input"])]
            reply = json.dumps({"data": data[::-1], "model": body["model"]}).encode()  # any order: index decides
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1", requests
    server.shutdown()
    thread.join()


def test_openai_embedder_speaks_the_embeddings_api(endpoint):
    url, requests = endpoint
    texts = [f"cart {i}" for i in range(70)] + ["warehouse"]
    assert openai_embedder(url, "e5-small", api_key="k")(texts) == concept_embed(texts)
    assert [(path, auth, len(body["input"]), body["model"]) for path, auth, body in requests] == [
        ("/v1/embeddings", "Bearer k", 64, "e5-small"), ("/v1/embeddings", "Bearer k", 7, "e5-small")]


def test_the_recipe_names_the_endpoint(endpoint, workspace: Path, monkeypatch):
    url, requests = endpoint
    monkeypatch.setenv("EMBED_KEY", "secret")
    config = AgentConfig(tools=SEARCH_TOOLS, search=SearchConfig(
        ranker="embeddings", embeddings="openai:e5", base_url=url, api_key_env="EMBED_KEY"))
    box = Toolbox(Sandbox(workspace, HOST_ONLY), config=config)
    assert heads(run(box, "codebase_search", query="what is on the shelf"))[0] == "docs/notes.txt:81-101"
    chunks = len(requests[0][2]["input"])
    run(box, "codebase_search", query="cheaper prices")  # the chunks' vectors are kept: only the query is sent
    assert [(auth, body["model"], len(body["input"])) for _, auth, body in requests] == [
        ("Bearer secret", "e5", chunks), ("Bearer secret", "e5", 1)]


def test_an_http_policy_is_sent_the_enabled_tools(workspace: Path):
    from opencomposer.agent.policies.http import OpenAIPolicy
    from opencomposer.config.agent import HttpPolicyConfig

    sent = []
    policy = OpenAIPolicy(HttpPolicyConfig(model="m", base_url="http://127.0.0.1:9/v1"))
    policy._post_chat = lambda body: sent.append(body) or {
        "choices": [{"message": {"content": "done"}, "finish_reason": "stop"}]}
    task = Task(id="shop", instruction="Find the discount code.", repo=workspace)
    for tools in (SEARCH_TOOLS, ["read_file", "finish"]):
        policy.act(Context(task=task, messages=[], token_ids=None, turn_index=0, max_new_tokens=16,
                           tools=tool_schemas(tools)))
    assert [[s["function"]["name"] for s in body["tools"]] for body in sent] == [SEARCH_TOOLS, ["read_file", "finish"]]


def test_the_system_prompt_names_the_search_tools_only_when_enabled():
    from opencomposer.agent.protocol import SYSTEM_PROMPT, system_prompt_for
    from opencomposer.config.agent import DEFAULT_TOOLS

    assert system_prompt_for(DEFAULT_TOOLS) == system_prompt_for(None) == SYSTEM_PROMPT  # trained prompts unchanged
    both = system_prompt_for([*DEFAULT_TOOLS, "codebase_search", "find_files"])
    assert "codebase_search" in both and "find_files" in both and both != SYSTEM_PROMPT
    assert "codebase_search" not in system_prompt_for([*DEFAULT_TOOLS, "find_files"])
    assert "find_files" not in system_prompt_for([*DEFAULT_TOOLS, "codebase_search"])
