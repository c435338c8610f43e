"""Every code block of README.md and docs/*.md runs, and the pages keep their conventions.

A fenced block's language says what happens to it (docs/testing.md, "The documentation"):

  ```python   first line `# ranks: N` (1-4): run on N local ranks, as `python block.py` in a
              fresh folder; it must exit 0 on every rank. README.md's block and any block that
              sets os.environ run under the package's launcher (`<venv>/bin/shardrun -n N
              --timeout 300 <python> block.py`), the others in ranks forked from the test
              ranks' fork server (launched_fresh below says why).
  ```cpp      first line `// ranks: N`: a complete program, built against the C++ build tree
              ($SHARDTENSOR_BUILD_DIR, default build-torch2/) installed into a scratch prefix,
              with that tree's compiler, then run under the tree's `shardrun -n N`.
  ```cmake    the CMakeLists.txt of the ```cpp block just above it (which is its main.cpp);
              cpp blocks without one are built with DEFAULT_CMAKELISTS below.
  ```sh       README.md's first one is the set-up block: checked, not run. Every other one
              starts with `# ranks: 0` and runs as `bash -euo pipefail` from the repository
              root, with the venv's bin/ first on PATH (so `python` and `shardrun` are the
              package's).
  ```text     output listings and diagrams: not run.

Python and shell blocks get SHARDTENSOR_TIMEOUT_S=60 and SHARDTENSOR_STRICT=1 (as the rest of
the suite), so a block that hangs fails within a minute and one that falls back to gathering
fails. A failing block's test is named after its file and line: docs/python.md:12.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from ranks import run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ["README.md"] + sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
README_MAX_LINES = 200
MAX_CPP_BLOCKS = 3
LANGUAGES = ("python", "cpp", "cmake", "sh", "text")
SETUP_BLOCK = [
    "./dev.sh demo    # installs what is missing, builds, runs the demo on 4 local ranks",
    "./dev.sh test    # installs what is missing, builds and runs the whole test suite",
]
RUN_TIMEOUT_S = 300        # shardrun's limit for one block
BLOCK_ENV = {"SHARDTENSOR_TIMEOUT_S": "60", "SHARDTENSOR_STRICT": "1", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
DEFAULT_CMAKELISTS = """\
cmake_minimum_required(VERSION 3.18)
project(doc_example CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(shardtensor REQUIRED)
add_executable(doc_example main.cpp)
target_link_libraries(doc_example PRIVATE shardtensor::shardtensor)
"""
FENCE = re.compile(r"^(\s*)```(.*)$")
MARKER = {"python": re.compile(r"^# ranks: ([0-9]+)\s*$"), "cpp": re.compile(r"^// ranks: ([0-9]+)\s*$"),
          "sh": re.compile(r"^# ranks: 0\s*$")}


@dataclasses.dataclass
class Block:
    page: str       # relative to the repository root
    line: int       # of the opening fence, 1-based
    language: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def ranks(self) -> int:
        marker = MARKER.get(self.language) if self.language != "sh" else None
        found = marker.match(self.code.splitlines()[0]) if marker and self.code.strip() else None
        return int(found.group(1)) if found else 0


def read(page: str) -> str:
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        return f.read()


def blocks_of(page: str) -> list[Block]:
    """The fenced blocks of a page, in order (fences may be indented, as inside a list item)."""
    blocks, lines, i = [], read(page).splitlines(), 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, language, start = opened.group(1), opened.group(2).strip(), i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{page}:{start + 1}: a ``` block is never closed")
        blocks.append(Block(page, start + 1, language, "\n".join(body) + "\n"))
        i += 1
    return blocks


ALL_BLOCKS = [b for page in PAGES for b in blocks_of(page)]


def setup_block() -> Block | None:
    sh = [b for b in ALL_BLOCKS if b.page == "README.md" and b.language == "sh"]
    return sh[0] if sh else None


def blocks(language: str) -> list[Block]:
    skip = setup_block()
    return [b for b in ALL_BLOCKS if b.language == language and b is not skip]


def cmake_of(block: Block) -> Block | None:
    """The ```cmake block that directly follows a ```cpp block on its page, if any."""
    same_page = [b for b in ALL_BLOCKS if b.page == block.page]
    after = same_page.index(block) + 1
    return same_page[after] if after < len(same_page) and same_page[after].language == "cmake" else None


def tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run(cmd, *, where: str, cwd: str, env: dict, timeout: float = RUN_TIMEOUT_S + 60) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{where}: `{' '.join(map(str, cmd))}` ran past {timeout} s\n{tail(str(e.stdout or ''))}", pytrace=False)
    if result.returncode != 0:
        pytest.fail(f"{where}: `{' '.join(map(str, cmd))}` exited {result.returncode}\n"
                    f"--- stdout ---\n{tail(result.stdout)}\n--- stderr ---\n{tail(result.stderr)}", pytrace=False)
    return result


def block_env(**extra) -> dict:
    env = dict(os.environ, **BLOCK_ENV, **extra)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


# ---- the pages themselves (cheap) ---------------------------------------------------------

def test_readme_is_at_most_200_lines():
    n = len(read("README.md").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; keep it to {README_MAX_LINES} and move reference to docs/"


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def test_relative_links_point_at_existing_files():
    broken = []
    for page in PAGES:
        in_block = False
        for number, line in enumerate(read(page).splitlines(), start=1):
            if FENCE.match(line):
                in_block = not in_block
                continue
            if in_block:
                continue
            for found in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                target = found.group(1) or found.group(2)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # a URL, or an anchor in this page
                path = os.path.normpath(os.path.join(REPO, os.path.dirname(page), target.split("#")[0]))
                if not os.path.exists(path):
                    broken.append(f"{page}:{number}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_code_blocks_follow_the_conventions():
    problems = []
    for b in ALL_BLOCKS:
        first = b.code.splitlines()[0] if b.code.strip() else ""
        if b.language not in LANGUAGES:
            problems.append(f"{b.where}: ```{b.language or ''} block; use one of {', '.join(LANGUAGES)}")
        elif b.language in ("python", "cpp") and not (MARKER[b.language].match(first) and 1 <= b.ranks <= 4):
            marker = "# ranks: N" if b.language == "python" else "// ranks: N"
            problems.append(f"{b.where}: a {b.language} block starts with `{marker}` (N = 1..4), not {first!r}")
        elif b.language == "sh" and b is not setup_block() and not MARKER["sh"].match(first):
            problems.append(f"{b.where}: a sh block starts with `# ranks: 0` (runnable from the repository root), "
                            f"or is ```text if it is not meant to run")
        elif b.language == "cmake":
            same_page = [c for c in ALL_BLOCKS if c.page == b.page]
            before = same_page.index(b) - 1
            if before < 0 or same_page[before].language != "cpp":
                problems.append(f"{b.where}: a cmake block is the CMakeLists.txt of the cpp block right above it")
            elif not re.search(r"add_executable\(\s*([A-Za-z0-9_]+)\s+main\.cpp", b.code):
                problems.append(f"{b.where}: the cmake block builds its cpp block as add_executable(NAME main.cpp)")
        if b.language == "sh" and re.search(r"<<-?\s*['\"]?[A-Za-z_]+", b.code):
            problems.append(f"{b.where}: no here-documents in sh blocks: write the code as a block of its own")
    cpp = blocks("cpp")
    if len(cpp) > MAX_CPP_BLOCKS:
        problems.append(f"{len(cpp)} cpp blocks ({', '.join(b.where for b in cpp)}); at most {MAX_CPP_BLOCKS}: "
                        f"each costs a compile")
    assert not problems, "\n".join(problems)


def test_every_docs_page_starts_with_a_runnable_example():
    for page in PAGES[1:]:
        text = read(page)
        first = blocks_of(page)[0] if blocks_of(page) else None
        assert first is not None and first.language in ("python", "cpp", "sh"), \
            f"{page}: the first code block is a runnable python, cpp or sh block"
        second_heading = [m.start() for m in re.finditer(r"^## ", text, flags=re.M)]
        first_at = sum(len(line) + 1 for line in text.splitlines()[:first.line - 1])
        assert not second_heading or first_at < second_heading[0], \
            f"{page}: the runnable example comes before the first section (line {first.line})"


def test_readme_setup_block_names_real_commands():
    block = setup_block()
    assert block is not None and block.code.splitlines() == SETUP_BLOCK, \
        f"README.md's first sh block must be exactly:\n" + "\n".join(SETUP_BLOCK)
    first_fence = min(b.line for b in ALL_BLOCKS if b.page == "README.md")
    assert block.line == first_fence, "the set-up block is README.md's first code block"
    ci = read(".ci/run")
    assert re.search(r"^(exec\s+)?\./dev\.sh test\s*$", ci, flags=re.M), ".ci/run does not run ./dev.sh test"
    dev = read("dev.sh")
    assert re.search(r"^\s*demo\)", dev, flags=re.M), "dev.sh has no `demo` command"
    assert re.search(r"^\s*test\)", dev, flags=re.M), "dev.sh has no `test` command"


# ---- running the blocks -------------------------------------------------------------------

def launched_fresh(block: Block) -> bool:
    """Whether a python block runs under the package's launcher with a fresh interpreter per
    rank: README.md's (the program a user copies first, run as the README runs it) and any block
    that sets environment variables, which torch and the library may read at import. The others
    run in ranks forked from the test ranks' fork server (tests/python/ranks.py), which has
    imported torch and shardtensor once: a fresh interpreter per rank spent about 3 s of CPU on
    those imports, most of a block's time."""
    return block.page == "README.md" or "os.environ" in block.code


def run_block_as_main(rank, world_size, script, folder):
    """One rank of a python block, as `python block.py` runs it: from its own folder, as
    __main__, with the script as sys.argv."""
    import runpy

    os.chdir(folder)
    sys.argv = [script]
    runpy.run_path(script, run_name="__main__")


@pytest.mark.parametrize("block", blocks("python"), ids=lambda b: b.where)
def test_python_block(block, tmp_path):
    script = tmp_path / f"{os.path.basename(block.page).replace('.', '_')}_line{block.line}.py"
    script.write_text(block.code)
    if not launched_fresh(block):
        try:
            run_ranks(run_block_as_main, block.ranks, str(script), str(tmp_path), timeout=RUN_TIMEOUT_S,
                      env={name: BLOCK_ENV[name] for name in ("SHARDTENSOR_TIMEOUT_S", "MPLBACKEND")})
        except AssertionError as e:
            pytest.fail(f"{block.where}: {e}", pytrace=False)
        return
    shardrun = os.path.join(os.path.dirname(sys.executable), "shardrun")
    if not os.access(shardrun, os.X_OK):
        pytest.fail(f"{block.where}: {shardrun} is missing: the Python package is not installed in this environment "
                    f"(./dev.sh python installs it into .venv)", pytrace=False)
    run([shardrun, "-n", str(block.ranks), "--timeout", str(RUN_TIMEOUT_S), sys.executable, str(script)],
        where=block.where, cwd=str(tmp_path), env=block_env())


@pytest.mark.parametrize("block", blocks("sh"), ids=lambda b: b.where)
def test_sh_block(block, tmp_path):
    script = tmp_path / f"{os.path.basename(block.page).replace('.', '_')}_line{block.line}.sh"
    script.write_text(block.code)
    run(["bash", "-euo", "pipefail", str(script)], where=block.where, cwd=REPO, env=block_env())


@dataclasses.dataclass
class CppToolchain:
    problem: str = ""          # non-empty: why no block can be built here
    prefix: str = ""           # the build tree installed here
    shardrun: str = ""
    configure_args: tuple = ()
    launcher: tuple = ()


def cache_value(cache: str, name: str) -> str:
    found = re.search(rf"^{re.escape(name)}:[A-Z]+=(.*)$", cache, flags=re.M)
    return found.group(1).strip() if found else ""


@pytest.fixture(scope="session")
def cpp_toolchain(tmp_path_factory) -> CppToolchain:
    """The C++ build tree, installed once into a scratch prefix (as tests/package does), and the
    compiler, flags and build type it was configured with."""
    build_dir = os.environ.get("SHARDTENSOR_BUILD_DIR", "build-torch2")
    build_dir = build_dir if os.path.isabs(build_dir) else os.path.join(REPO, build_dir)
    cache_file = os.path.join(build_dir, "CMakeCache.txt")
    shardrun = os.path.join(build_dir, "tools", "shardrun", "shardrun")
    cmake = shutil.which("cmake")
    if cmake is None:
        return CppToolchain(problem="cmake is not on PATH; the cpp blocks are built with CMake")
    if not os.path.isfile(cache_file):
        return CppToolchain(problem=f"no C++ build tree at {build_dir} (no CMakeCache.txt): build it first "
                                    f"(TORCH_LINE=wheel ./dev.sh build), or point SHARDTENSOR_BUILD_DIR at one")
    if not os.access(shardrun, os.X_OK):
        return CppToolchain(problem=f"{shardrun} is missing: the build tree {build_dir} is not built")
    root = tmp_path_factory.mktemp("doc_cpp")
    prefix = os.path.join(root, "prefix")
    installed = subprocess.run([cmake, "--install", build_dir, "--prefix", prefix], capture_output=True, text=True)
    if installed.returncode != 0:
        return CppToolchain(problem=f"cmake --install {build_dir} failed (is it built?):\n{tail(installed.stdout)}\n"
                                    f"{tail(installed.stderr)}")
    with open(cache_file, encoding="utf-8") as f:
        cache = f.read()
    args = [f"-DCMAKE_PREFIX_PATH={prefix}"]
    for name in ("CMAKE_CXX_COMPILER", "CMAKE_BUILD_TYPE", "CMAKE_CXX_FLAGS", "Torch_DIR", "GLOO_INCLUDE_DIR"):
        value = cache_value(cache, name)
        if value and not value.endswith("-NOTFOUND"):
            args.append(f"-D{name}={value}")
    launcher = ()
    ccache = shutil.which("ccache")
    if ccache:  # as the main build: paths relative to pytest's base folder, so a rerun of an unchanged block hits
        base = tmp_path_factory.getbasetemp()
        launcher = (f"-DCMAKE_CXX_COMPILER_LAUNCHER={cmake};-E;env;CCACHE_BASEDIR={base};CCACHE_NOHASHDIR=1;{ccache}",)
    return CppToolchain(prefix=prefix, shardrun=shardrun, configure_args=tuple(args), launcher=launcher)


@pytest.mark.parametrize("block", blocks("cpp"), ids=lambda b: b.where)
def test_cpp_block(block, cpp_toolchain, tmp_path):
    if cpp_toolchain.problem:
        pytest.fail(f"{block.where}: cannot build the C++ example: {cpp_toolchain.problem}", pytrace=False)
    cmake = shutil.which("cmake")
    source, build = tmp_path / "src", tmp_path / "build"
    source.mkdir()
    (source / "main.cpp").write_text(block.code)
    own = cmake_of(block)
    cmakelists = own.code if own else DEFAULT_CMAKELISTS
    (source / "CMakeLists.txt").write_text(cmakelists)
    target = re.search(r"add_executable\(\s*([A-Za-z0-9_]+)", cmakelists).group(1)
    where = block.where + (f" (built by {own.where})" if own else "")
    env = dict(os.environ)
    run([cmake, "-S", str(source), "-B", str(build), *cpp_toolchain.configure_args, *cpp_toolchain.launcher],
        where=where, cwd=str(tmp_path), env=env, timeout=600)
    run([cmake, "--build", str(build), "-j", "2"], where=where, cwd=str(tmp_path), env=env, timeout=900)
    libs = sorted(glob.glob(os.path.join(cpp_toolchain.prefix, "lib*")))  # lib/, or lib64/ where GNUInstallDirs says so
    env = block_env(LD_LIBRARY_PATH=os.pathsep.join(libs + [os.environ.get("LD_LIBRARY_PATH", "")]))
    run([cpp_toolchain.shardrun, "-n", str(block.ranks), "--timeout", str(RUN_TIMEOUT_S), str(build / target)],
        where=where, cwd=str(tmp_path), env=env)
