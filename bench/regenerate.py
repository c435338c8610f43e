"""Regenerates bench/RESULTS.md and bench/figures/*.png from one run of the benchmarks.

    ./dev.sh bench            builds build-torch2/ and the Python package, then runs this:
    .venv/bin/python bench/regenerate.py --build-dir build-torch2 [--quick] [--out FILE]

It runs a lean selection of the benchmark programs (bench/*.cpp under
<build-dir>/tools/shardrun/shardrun, bench/python_bench.py under .venv/bin/shardrun), reads
the figures each writes with --json FILE, and writes the results file from scratch: a short
header, then one table per benchmark, each with its machine, date, torch version and command,
every timed figure as min / median / max, and ratios against the baseline measured in the same
run (torch's DTensor, the raw c10d / torch.distributed collective, the hand-written program,
one process, plain torch). Figures: per-op overhead against DTensor, and redistribute against
DTensor and the raw collective, as PNGs in figures/ beside the results file.

--quick runs everything at tiny sizes and few repetitions (a minute or two), to check this
script and the benchmarks' output; its figures mean nothing, so it writes to a temporary folder
unless --out is given. --only picks benchmarks by key (see BENCHES); since the file would then
hold only those tables, it too writes to a temporary folder unless --out is given. A full run
keeps the sections of the results file it does not write (before-and-after tables from
bench/before_after.sh, a lent GPU's figures) after its own, as they were. --save-raw DIR
keeps every run's output and JSON, and --render-only DIR rewrites the results file from such a
folder without running anything.

Before each benchmark it waits while a build or a test suite runs on the machine
(pgrep -f 'ctest|pytest|cc1plus'), since on 2 shared cores those would be the figures.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUSY_PATTERN = "ctest|pytest|cc1plus"
# What the programs were measured with: glibc keeps freed memory (README, "Performance"), so a
# fresh 16 MiB result does not page-fault again; redistribute_bench and python_bench also set it
# themselves.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456"}


# ---------------------------------------------------------------------------------------------
# The machine and the tree
# ---------------------------------------------------------------------------------------------

def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores (nproc)", cores


def git_tree():
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return f"commit {head}" + (" with uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"


def cxx_torch(build_dir):
    """The libtorch the C++ build uses: its version (TorchConfigVersion.cmake) and the line's name."""
    cache = os.path.join(build_dir, "CMakeCache.txt")
    torch_dir = line = None
    try:
        with open(cache) as f:
            for entry in f:
                if entry.startswith("Torch_DIR:"):
                    torch_dir = entry.split("=", 1)[1].strip()
                elif entry.startswith("SHARDTENSOR_TORCH_LINE:"):
                    line = entry.split("=", 1)[1].strip()
    except OSError:
        return "unknown (no CMakeCache.txt)"
    version = None
    if torch_dir:
        try:
            with open(os.path.join(torch_dir, "TorchConfigVersion.cmake")) as f:
                m = re.search(r'set\(PACKAGE_VERSION "([^"]+)"\)', f.read())
                version = m.group(1) if m else None
        except OSError:
            pass
    where = "the torch wheel in .venv" if torch_dir and ".venv" in torch_dir else torch_dir
    text = f"libtorch {version}" if version else (line or "unknown")
    return f"{text} ({where})" if where else text


def busy():
    try:
        out = subprocess.run(["pgrep", "-f", BUSY_PATTERN], capture_output=True, text=True).stdout.split()
    except OSError:
        return []
    return [p for p in out if int(p) != os.getpid()]


def wait_for_quiet(max_wait, log):
    start = time.time()
    told = False
    while busy():
        if time.time() - start > max_wait:
            log(f"  still busy after {max_wait:.0f} s ({BUSY_PATTERN} running); measuring anyway")
            return time.time() - start
        if not told:
            log(f"  waiting: a build or test suite is running ({BUSY_PATTERN}); checking every 30 s")
            told = True
        time.sleep(30)
    return time.time() - start


def load_average():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


# ---------------------------------------------------------------------------------------------
# Running one benchmark
# ---------------------------------------------------------------------------------------------

class Runner:
    def __init__(self, args):
        self.args = args
        self.build_dir = os.path.relpath(os.path.abspath(args.build_dir), REPO)
        self.shardrun = os.path.join(self.build_dir, "tools", "shardrun", "shardrun")
        venv_shardrun = os.path.join(os.path.dirname(sys.executable), "shardrun")
        self.py_shardrun = os.path.relpath(venv_shardrun, REPO) if os.path.exists(venv_shardrun) else self.shardrun
        self.python = os.path.relpath(sys.executable, REPO) if sys.executable.startswith(REPO) else sys.executable
        self.work = args.save_raw or tempfile.mkdtemp(prefix="shardtensor-bench-")
        os.makedirs(self.work, exist_ok=True)

    def log(self, text):
        print(text, file=sys.stderr, flush=True)

    def bench(self, name):
        return os.path.join(self.build_dir, "bench", name)

    def run(self, key, cmd, env=None, timeout=300, wants_json=True):
        """Runs `cmd` (a list; paths relative to the repository root) with --json <file> appended
        when wants_json; returns a record with its output, its JSON and how it went."""
        json_path = os.path.join(self.work, f"{key}.json")
        if os.path.exists(json_path):
            os.remove(json_path)
        full = list(cmd) + (["--json", json_path] if wants_json else [])
        shown_env = dict(MALLOC_ENV, **(env or {}))
        shown = " ".join(f"{k}={v}" for k, v in (env or {}).items())
        shown = (shown + " " if shown else "") + shlex.join(cmd)
        waited = 0.0 if self.args.no_wait else wait_for_quiet(self.args.max_wait, self.log)
        record = {"key": key, "command": shown, "load_before": load_average(), "waited_s": waited,
                  "busy_at_start": bool(busy()),
                  "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
        self.log(f"[{key}] {shown}")
        start = time.time()
        try:
            proc = subprocess.run(full, cwd=REPO, env=dict(os.environ, **shown_env), capture_output=True, text=True,
                                  timeout=timeout)
            record.update(rc=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)
        except subprocess.TimeoutExpired as e:
            record.update(rc=124, stdout=e.stdout or "", stderr=(e.stderr or "") + f"\n(timed out after {timeout} s)")
            if isinstance(record["stdout"], bytes):
                record["stdout"] = record["stdout"].decode(errors="replace")
            if isinstance(record["stderr"], bytes):
                record["stderr"] = record["stderr"].decode(errors="replace")
        except OSError as e:
            record.update(rc=127, stdout="", stderr=str(e))
        record["seconds"] = time.time() - start
        record["busy_at_end"] = bool(busy())
        record["data"] = None
        if wants_json and os.path.exists(json_path):
            with open(json_path) as f:
                record["data"] = json.load(f)
        if record["rc"] != 0 or (wants_json and record["data"] is None):
            tail = (record["stderr"] or record["stdout"])[-1500:]
            record["error"] = f"exit status {record['rc']}" + ("" if record["data"] is not None or not wants_json
                                                               else ", no JSON written") + f": {tail.strip()}"
            self.log(f"[{key}] FAILED after {record['seconds']:.0f} s: {record['error'][:600]}")
        else:
            self.log(f"[{key}] done in {record['seconds']:.0f} s")
        with open(os.path.join(self.work, f"{key}.record.json"), "w") as f:
            json.dump(record, f, indent=1)
        return record


# Sizes and repetitions: the programs' own defaults (python_bench's 51 rounds of 1000 calls per
# op, 61 runs per redistribute, ...; attention at S = 4096 and 16384), about 5-6 minutes of
# running on the 2-core VM; the quick ones only check that everything runs and parses.
def settings(quick):
    if quick:
        return dict(py_ops=["--op-number", "100", "--op-rounds", "5"], py_tp=["--tp-steps", "5", "--tp-sizes", "32x256x1024"],
                    py_redist=["--redist-runs", "5"], dispatch=["--reps", "200"], runs=["--runs", "5"],
                    halo=["--steps", "3"], attention=["--seq", "1024", "--steps", "2"], checkpoint_launches=1,
                    tp=["--steps", "5"], arena_rounds=1)
    return dict(py_ops=[], py_tp=[], py_redist=[], dispatch=[], runs=[], halo=[],
                attention=["--seq", "4096,16384"], checkpoint_launches=3, tp=[], arena_rounds=5)


def run_python_bench(r, key, ranks, sections, extra, timeout):
    cmd = [r.py_shardrun, "-n", str(ranks), "--timeout", str(timeout), r.python, "bench/python_bench.py",
           "--sections", sections, "--cxx", "none", "--cxx-dispatch", "none"] + extra
    return r.run(key, cmd, timeout=timeout + 30)


def run_cxx(r, key, ranks, program, extra, timeout, env=None, wants_json=True):
    cmd = [r.shardrun, "-n", str(ranks), "--timeout", str(timeout), r.bench(program)] + extra
    return r.run(key, cmd, env=env, timeout=timeout + 30, wants_json=wants_json)


# key -> (what it runs, how): each returns a list of records.
def bench_python_ops(r, s):
    return [run_python_bench(r, "python_2ranks", 2, "1,3", s["py_ops"] + s["py_tp"], 600)]


def bench_python_redistribute(r, s):
    return [run_python_bench(r, "python_4ranks", 4, "2", s["py_redist"], 600)]


def bench_dispatch(r, s):
    return [run_cxx(r, "dispatch", 2, "dispatch_bench", s["dispatch"], 300)]


def bench_redistribute(r, s):
    return [run_cxx(r, "redistribute_4ranks", 4, "redistribute_bench", s["runs"], 600),
            run_cxx(r, "redistribute_2ranks", 2, "redistribute_bench", s["runs"], 600)]


def bench_redistribute_messages(r, s):
    return [run_cxx(r, "redistribute_messages", 4, "redistribute_bench", s["runs"], 600,
                    env={"SHARDTENSOR_PEER_MEMORY": "0"})]


def bench_redistribute_arena(r, s):
    return [run_cxx(r, f"redistribute_arena_{n}ranks", n, "redistribute_bench", s["runs"], 600,
                    env={"SHARDTENSOR_ARENA": "1"}) for n in (4, 2)]


def bench_arena_apps(r, s):
    """The halo convolution and the C++ TP-MLP at 4 ranks without and with shared arenas, in turns
    (the arena replaces a process's allocator, so each setting is a process of its own)."""
    records = []
    for round_ in range(s["arena_rounds"]):
        for arena in ("0", "1"):
            env = {"SHARDTENSOR_ARENA": arena}
            records.append(run_cxx(r, f"arena_apps_halo_{arena}_{round_}", 4, "halo_conv_bench", s["halo"], 300, env=env))
            records.append(run_cxx(r, f"arena_apps_tp_{arena}_{round_}", 4, "tp_mlp_bench", s["tp"], 300, env=env))
    return records


def bench_small(r, s):
    return [run_cxx(r, "redistribute_small", 4, "redistribute_bench", ["--small"] + s["runs"], 300)]


def bench_halo(r, s):
    return [run_cxx(r, f"halo_{n}ranks", n, "halo_conv_bench", s["halo"], 300) for n in (2, 4)]


def bench_attention(r, s):
    return [run_cxx(r, f"attention_{n}ranks", n, "attention_bench", s["attention"], 400) for n in (2, 4)]


def bench_checkpoint(r, s):
    folder = tempfile.mkdtemp(prefix="checkpoint-bench-", dir=r.work)
    records = [run_cxx(r, f"checkpoint_{i}", 4, "checkpoint_bench", [folder], 400, wants_json=False)
               for i in range(s["checkpoint_launches"])]
    shutil.rmtree(folder, ignore_errors=True)
    for rec in records:  # the command as one would type it
        rec["command"] = rec["command"].replace(folder, "/tmp")
    return records


# The "before" column: the same program run on the tree before issue 52's changes (f1b1390),
# kept as its --json output (bench/data/), since that build is not at hand in later runs.
COLLECTIVES_BEFORE = os.path.join("bench", "data", "collectives_per_op_f1b1390.json")


def bench_collectives(r, s):
    before = ["--before", COLLECTIVES_BEFORE] if os.path.exists(os.path.join(REPO, COLLECTIVES_BEFORE)) else []
    cmd = [r.py_shardrun, "-n", "4", "--timeout", "300", r.python, "bench/collectives_per_op.py"] + before
    return [r.run("collectives_4ranks", cmd, timeout=330)]


def bench_handlers(r, s):
    quick = ["--rounds", "3", "--number", "200"] if r.args.quick else []
    return [r.run("handlers_2ranks", [r.py_shardrun, "-n", "2", "--timeout", "300", r.python, "bench/handler_overhead.py"]
                  + quick, timeout=330)]


def bench_tp_block(r, s):
    steps = ["--steps", "5"] if r.args.quick else []
    return [r.run("tp_block_2ranks", [r.py_shardrun, "-n", "2", "--timeout", "900", r.python, "bench/tp_block_bench.py"]
                  + steps, timeout=930)]


def bench_unet_dp(r, s):
    steps = ["--steps", "3"] if r.args.quick else []
    return [r.run("unet_dp_4ranks", [r.py_shardrun, "-n", "4", "--timeout", "600", r.python, "bench/unet_dp_domain_bench.py"]
                  + steps, timeout=630)]


def bench_compile(r, s):
    steps = ["--steps", "5"] if r.args.quick else []
    return [r.run("compile_4ranks", [r.py_shardrun, "-n", "4", "--timeout", "900", r.python, "bench/compile_bench.py"]
                  + steps, timeout=930)]


def bench_compile_eager(r, s):
    steps = ["--steps", "5"] if r.args.quick else []
    return [r.run("compile_eager_4ranks", [r.py_shardrun, "-n", "4", "--timeout", "900", r.python, "bench/compile_bench.py"]
                  + steps, env={"SHARDTENSOR_COMPILE": "eager"}, timeout=930)]


# Benchmarks that run only the installed Python package (no C++ program of build-torch2).
PYTHON_ONLY = {"collectives", "handlers", "tp_block", "unet_dp", "compile", "compile_eager"}

BENCHES = {
    "python_ops": bench_python_ops,            # per-op overhead and the TP-MLP step from Python, 2 ranks
    "dispatch": bench_dispatch,                # per-op overhead from C++
    "redistribute": bench_redistribute,        # C++, 4 and 2 ranks, peer memory (+ planning)
    "python_redistribute": bench_python_redistribute,  # vs DTensor and raw torch.distributed, 4 ranks
    "redistribute_messages": bench_redistribute_messages,  # C++, 4 ranks, Gloo messages
    "redistribute_arena": bench_redistribute_arena,  # C++, 4 and 2 ranks, peer memory read in place from shared arenas
    "arena_apps": bench_arena_apps,            # halo conv and TP-MLP, 4 ranks, without and with shared arenas in turns
    "small": bench_small,                      # small transfers
    "halo": bench_halo,
    "attention": bench_attention,
    "checkpoint": bench_checkpoint,
    "collectives": bench_collectives,          # collectives per op against DTensor and the minimum (counts)
    "handlers": bench_handlers,                # handlers' and register_sharding's cost to other operators
    "tp_block": bench_tp_block,                # a TP transformer block through parallelize_module, vs DTensor and by hand
    "unet_dp": bench_unet_dp,                  # the U-Net step under DDP x domain: ms and bytes against the fewest
    "compile": bench_compile,                  # torch.compile against eager: TP-MLP (vs DTensor) and the U-Net, traced
    "compile_eager": bench_compile_eager,      # the same behind graph breaks (SHARDTENSOR_COMPILE=eager)
}


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------

def mmm(stat, digits=3):
    """min / median / max of a {"min", "median", "max"} dict."""
    if not stat:
        return "n/a"
    return f"{stat['min']:.{digits}f} / {stat['median']:.{digits}f} / {stat['max']:.{digits}f}"


def med(stat):
    return stat["median"] if stat else float("nan")


def ratio(a, b, digits=2):
    if b == 0 or a != a or b != b:
        return "n/a"
    return f"{a / b:.{digits}f}"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


class Doc:
    def __init__(self, machine_text, cxx_torch_text):
        self.parts = []
        self.contents = []
        self.machine = machine_text
        self.cxx_torch = cxx_torch_text
        self.failures = []
        self.titles = []

    def _listed(self, title):
        """``title`` in the table of contents, linked to its section."""
        self.titles.append(title)
        anchor = re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")
        self.contents.append(f"[{title}](#{anchor})")

    def keep(self, title, text):
        """A section of the previous results file that no benchmark here writes, as it was."""
        self._listed(title)
        self.parts.append(text)

    def section(self, title, what, records, body, torch_text=None, figure=None):
        """One benchmark: a title, one or two sentences, where and how it ran, the table."""
        self._listed(title)
        lines = [f"## {title}", "", what, ""]
        if torch_text is None:
            torch_text = self.cxx_torch
        dates = sorted({rec["date"] for rec in records})
        secs = sum(rec.get("seconds", 0) for rec in records)
        loads = ", ".join(f"{rec['load_before']:.1f}" for rec in records)
        meta = [f"Machine: {self.machine}", f"date: {dates[0] if len(dates) == 1 else dates[0] + ' to ' + dates[-1]}",
                f"torch: {torch_text}", f"{secs:.0f} s", f"load average before: {loads}"]
        if any(rec.get("busy_at_start") or rec.get("busy_at_end") for rec in records):
            meta.append("**a build or test suite was running** (figures are noise)")
        lines.append(" · ".join(meta) + "  ")
        cmds = [rec["command"] for rec in records]
        lines.append("Command" + ("s" if len(set(cmds)) > 1 else "") + ": " +
                     "; ".join(f"`{c}`" for c in dict.fromkeys(cmds)))
        lines.append("")
        failed = [rec for rec in records if rec.get("error")]
        for rec in failed:
            self.failures.append(f"{rec['key']}: {rec['error'][:300]}")
            lines.append(f"**Not measured: `{rec['key']}` failed** ({rec['error'][:400].strip()})")
            lines.append("")
        if body:
            lines.append(body)
            lines.append("")
        if figure:
            lines.append(f"![{title}](figures/{figure})")
            lines.append("")
        self.parts.append("\n".join(lines))


def python_torch(records):
    for rec in records:
        if rec.get("data"):
            d = rec["data"]
            return f"{d['torch']} (Python {d['python']}, shardtensor {d['shardtensor']}, {d['backend']})"
    return "unknown"


def section_of(records, name):
    for rec in records:
        if rec.get("data"):
            return rec["data"].get("sections", {}).get(name, [])
    return []


def render_python_ops(doc, records, figs):
    rows = []
    data = section_of(records, "ops")
    for r in data:
        plain, st_, dt = med(r["plain_us"]), med(r["shardtensor_us"]), med(r["dtensor_us"])
        so, do = st_ - plain, dt - plain
        rel = f"{do / so:.1f}x" if so > 0.05 else f"> {do / 0.05:.0f}x (shardtensor over ≈ 0)"
        rows.append([r["op"], r["layout"], f"{r['n']}x{r['n']}", mmm(r["plain_us"], 2), mmm(r["shardtensor_us"], 2),
                     mmm(r["dtensor_us"], 2), f"{so:.2f}", f"{do:.2f}", rel,
                     f"{r['python_calls_shardtensor']:.0f} / {r['python_calls_dtensor']:.0f}"])
    world = records[0]["data"]["world"] if records and records[0].get("data") else "?"
    settings_ = records[0]["data"]["settings"] if records and records[0].get("data") else {}
    body = table(["op", "layout", "local piece", "plain torch µs", "shardtensor µs", "DTensor µs",
                  "shardtensor over µs", "DTensor over µs", "DTensor over / shardtensor over",
                  "Python calls per op (shardtensor / DTensor)"], rows) if rows else ""
    fig = figs.get("per_op")
    doc.section("Per-op overhead from Python: shardtensor vs DTensor",
                f"The same op on a plain torch tensor (the baseline: this rank's local piece), on a shardtensor "
                f"ShardTensor and on a torch DTensor with the same layout, propagation caches warm, no communication "
                f"(checked), timed on rank 0 of {world} while the others wait; µs per op, min / median / max over "
                f"{settings_.get('op_rounds', '?')} timeit loops of {settings_.get('op_number', '?')} calls, the three "
                f"in turns. \"over\" = median minus plain torch's median.",
                records, body, python_torch(records), fig)


def render_dispatch(doc, records, figs):
    rows = []
    d = records[0].get("data") or {}
    for r in d.get("rows", []):
        over = med(r["hit_us"]) - med(r["plain_us"])
        rows.append([r["op"], f"{r['n']}", mmm(r["plain_us"], 2), mmm(r["hit_us"], 2), f"{over:.2f}",
                     ratio(med(r["hit_us"]), med(r["plain_us"])), mmm(r["miss_us"], 2)])
    body = table(["op", "n (piece [n, n] of [n * world, n], S(0))", "plain ATen µs", "ShardTensor µs, cache hit",
                  "overhead µs (hit − plain)", "hit / plain", "ShardTensor µs, cache miss"], rows) if rows else ""
    doc.section("Per-op overhead from C++ (`dispatch_bench`)",
                f"An op on a ShardTensor from C++ against the plain ATen op on its local piece (the baseline) in the same "
                f"run, on each of {d.get('world', '?')} ranks at once; µs per call, min / median / max over "
                f"{d.get('reps', '?')} calls (cache miss: {d.get('miss_reps', '?')} calls, the propagation cache "
                f"dropped before each).", records, body)


def redistribute_rows(d, with_ranks):
    rows = []
    for r in d.get("rows", []):
        ours = med(r["ours"])
        row = ([str(d["world"])] if with_ranks else []) + [r["name"], mmm(r["ours"]), r["raw_name"], mmm(r["raw"]),
                                                         ratio(ours, med(r["raw"]))]
        if "raw_with_own" in r:
            row += [mmm(r["raw_with_own"]), ratio(ours, med(r["raw_with_own"]))]
        else:
            row += ["(= raw)", ratio(ours, med(r["raw"]))]
        if "hand_written" in r:
            row += [mmm(r["hand_written"]), ratio(ours, med(r["hand_written"])), mmm(r["copies"]),
                    ratio(ours, med(r["raw"]) + med(r["copies"]))]
        else:
            row += ["(a reduction: none)", "", "", ""]
        row += [mmm(r["floor"]), ratio(ours, med(r["floor"]))] if "floor" in r else ["", ""]
        row += [mmm(r["one_exchange"])] if "one_exchange" in r else [""]
        row += [ratio(med(r["ours_span"]), med(r["floor_span"]))] if "floor_span" in r else [""]
        rows.append(row)
    return rows


REDIST_HEADER = ["transition", "shardtensor ms", "raw c10d", "raw ms", "shardtensor / raw",
                 "raw ms, own part included (P(sum)->S(0): then summed)", "shardtensor / it",
                 "hand-written ms (pack, all_to_all, place)", "shardtensor / hand-written", "copies alone ms",
                 "shardtensor / (raw + copies)", "copy floor ms", "shardtensor / floor", "one empty exchange ms",
                 "shardtensor / floor, as spans"]


def redistribute_table(records, with_ranks):
    """The rows of every record's redistribute_bench run as one table, and their runs per figure."""
    rows, runs = [], "?"
    for rec in records:
        if rec.get("data"):
            rows += redistribute_rows(rec["data"], with_ranks)
            runs = rec["data"]["runs"]
    header = (["ranks"] if with_ranks else []) + REDIST_HEADER
    return (table(header, rows) if rows else ""), runs


def render_redistribute(doc, records, figs):
    body, runs = redistribute_table(records, True)
    doc.section("redistribute from C++ (`redistribute_bench`), peer memory",
                f"`redistribute()` on 16 MiB float32 ([2048, 2048] even, [2047, 2049] uneven; the 4-rank rows also "
                f"2x2 meshes and a [256, 128, 128] S(2)->S(1)) against, in turns in the same run, the raw c10d "
                f"collective moving the minimal bytes on buffers prepared in advance, the same with this rank's own "
                f"part, the program one writes by hand around it, the local copies alone, and the copy floor "
                f"(`bench/copy_floor.h`: every rank's piece and result in one shared mapping, each result made by plain "
                f"copies of exactly its bytes, or one summing pass from a pending sum; checked once against the "
                f"expected values), and one empty exchange (redistribute S(0)->R of a [ranks] tensor: the "
                f"synchronization any exchange needs, and how far apart the ranks leave the barrier before each run, "
                f"both of which the floor program leaves out); ms of the slowest rank (each rank's own duration), "
                f"min / median / max over {runs} runs; ratios of medians. The last column times the same runs as spans, "
                f"from the first rank's start to the last rank's end: with more ranks than cores, a floor rank that "
                f"waits for a core starts its own clock late, so its slowest duration is less than the copying all "
                f"ranks need (4 ranks on 2 cores), while the span counts it (and the ranks' skew leaving the barrier).",
                records, body, figure=figs.get("redistribute"))


def render_redistribute_messages(doc, records, figs):
    body, runs = redistribute_table(records, False)
    doc.section("redistribute from C++ over Gloo messages (`SHARDTENSOR_PEER_MEMORY=0`)",
                f"The same program and baselines as above, 4 ranks, with shardtensor's transfers sent as Gloo "
                f"messages (what runs between hosts) instead of through peer memory; min / median / max over {runs} "
                f"runs.", records, body)


def floor_bar_verdict(records, bar=1.5):
    """Issue 53's bar on the rows of redistribute_bench runs: each at most `bar` times its copy
    floor; and the bar proposed instead where the rows carry an empty exchange: at most `bar`
    times the floor plus that one synchronization, which the floor program does not pay."""
    rows = [(rec["data"]["world"], r) for rec in records if rec.get("data") for r in rec["data"].get("rows", []) if "floor" in r]
    over, over_proposed = [], []
    for world, r in rows:
        ours, floor = med(r["ours"]), med(r["floor"])
        if ours > bar * floor:
            over.append(f"{world} ranks {r['name']} ({ratio(ours, floor)}x)")
        if "one_exchange" in r and ours > bar * floor + med(r["one_exchange"]):
            over_proposed.append(f"{world} ranks {r['name']}")
    text = (f"Issue 53's bar, every row at most {bar}x its copy floor: "
            + ("met." if not over else f"not met by {len(over)} of {len(rows)} rows: " + ", ".join(over) + "."))
    if all("floor_span" in r for _, r in rows) and rows:
        spans = [(world, r, med(r["ours_span"]) / med(r["floor_span"])) for world, r in rows]
        over_spans = [f"{world} ranks {r['name']} ({x:.2f}x)" for world, r, x in spans if x > bar]
        text += (f" Timed as spans instead (from the first rank's start to the last rank's end, which counts the "
                 f"copying that ranks sharing cores do one after another, and the ranks' skew leaving the barrier), "
                 f"shardtensor is {min(x for *_, x in spans):.2f}x to {max(x for *_, x in spans):.2f}x the floor"
                 + (" (every row within the bar)." if not over_spans else ", over the bar: " + ", ".join(over_spans) + "."))
    if all("one_exchange" in r for _, r in rows) and rows:
        text += (f" The bar proposed instead, at most {bar}x the floor plus one empty exchange (both medians of the same run): "
                 + ("met by every row." if not over_proposed else
                    f"not met by {len(over_proposed)} of {len(rows)} rows: " + ", ".join(over_proposed) + "."))
    return text


def render_redistribute_arena(doc, records, figs):
    body, runs = redistribute_table(records, True)
    doc.section("redistribute from C++ with shared arenas (`SHARDTENSOR_ARENA=1`)",
                f"The same program and baselines as the peer-memory table, with every rank's large tensors in its "
                f"shared arena (`src/redistribute/transports/peer_memory/arena.h`): peers read parts in place, and a "
                f"reduce-scatter combines its terms straight from the holders' memory; min / median / max over {runs} "
                f"runs. {floor_bar_verdict(records)}", records, body)


def arena_apps_rows(records):
    """(what, [medians without arena], [medians with]) per figure of the arena_apps runs."""
    figures = {}
    for rec in records:
        d, arena = rec.get("data"), rec["key"].split("_")[3]
        if not d:
            continue
        if d["bench"] == "halo_conv_bench":
            found = [(f"halo conv2d {d['shape']} fwd+bwd, sharded step", d["sharded_ms"])]
        else:
            found = [(f"TP-MLP {x['size']} step", x["sharded_ms"]) for x in d["sizes"]]
        for what, stat in found:
            figures.setdefault(what, ([], []))[arena == "1"].append(med(stat))
    return [(what, off, on) for what, (off, on) in figures.items()]


def render_arena_apps(doc, records, figs):
    rows, slower, spread = [], [], []
    for what, off, on in arena_apps_rows(records):
        if not off or not on:
            continue
        off_m, on_m = statistics.median(off), statistics.median(on)
        # Slower only when every run with arenas is slower than every run without: 5 runs each make
        # that 1 chance in 252 by noise alone; the medians alone flip with the machine's drift.
        verdict = "no slower" if on_m <= off_m else ("slower" if min(on) > max(off) else "within the runs' spread")
        {"slower": slower, "within the runs' spread": spread}.get(verdict, []).append(what)
        rows.append([what, " / ".join(f"{x:.2f}" for x in off), " / ".join(f"{x:.2f}" for x in on),
                     ratio(on_m, off_m), verdict])
    body = table(["step", "without arena: each run's median ms", "with SHARDTENSOR_ARENA=1: each run's median ms",
                  "with / without (median of the runs)", "issue 53's bar"], rows) if rows else ""
    bar = ("Issue 53's bar (no slower with arenas than without): "
           + ("not met by " + ", ".join(slower) + "." if slower else
              "met" + (f" ({', '.join(spread)} within the runs' own spread)." if spread else ".")))
    doc.section("Halo convolution and TP-MLP with shared arenas",
                "`halo_conv_bench` and the C++ `tp_mlp_bench` (the sharded step; 4 ranks), run without and with "
                "`SHARDTENSOR_ARENA=1` in turns, each setting a process group of its own (the arena replaces the "
                f"process's CPU allocator). {bar}", records, body)


def render_planning(doc, records, figs):
    rec = records[0]
    rows = [[p["name"], mmm(p["us"], 3)] for p in (rec.get("data") or {}).get("planning", [])]
    body = table(["plan (no communication; rank 0 alone)", "µs per plan, min / median / max over 15 batches"], rows) \
        if rows else ""
    doc.section("Redistribute planning (`redistribute_bench`)",
                "Time to plan a redistribution, looked up in the plan cache or planned afresh (greedy or graph search); "
                "no baseline (plan A: [S(0), S(1), P] -> [R, S(0), S(2)] on 1000x64x8; plan B: [S(0), S(0), S(0)] -> "
                "[R, S(1), S(0)]).", [rec], body)


def render_small(doc, records, figs):
    rec = records[0]
    d = rec.get("data") or {}
    rows = []
    for r in d.get("small", []):
        rows.append([r["name"], f"{r['bytes']} B", mmm(r["peer_memory"]), mmm(r["gloo_checked"]), r["raw_name"],
                     mmm(r["raw"]), ratio(med(r["peer_memory"]), med(r["raw"])), ratio(med(r["gloo_checked"]), med(r["raw"]))])
    body = table(["transition", "bytes per rank", "peer memory ms", "Gloo messages (checked) ms", "raw c10d", "raw ms",
                  "peer memory / raw", "Gloo / raw"], rows) if rows else ""
    doc.section("Small transfers (`redistribute_bench --small`)",
                f"redistribute of 64 B to 128 KiB per rank through peer memory (the default) and over Gloo messages, "
                f"against the raw c10d collective in the same run; {d.get('world', '?')} ranks, min / median / max over "
                f"{d.get('runs', '?')} runs.", records, body)


def render_python_redistribute(doc, records, figs):
    rows = []
    data = section_of(records, "redistribute")
    for r in data:
        s, d_, r1, r2 = (med(r[k]) for k in ("shardtensor_ms", "dtensor_ms", "raw_next_to_shardtensor_ms",
                                             "raw_next_to_dtensor_ms"))
        rows.append([r["transition"], mmm(r["shardtensor_ms"]), mmm(r["dtensor_ms"]), r["raw_name"],
                     mmm(r["raw_next_to_shardtensor_ms"]), mmm(r["raw_next_to_dtensor_ms"]), ratio(s, r1), ratio(d_, r2),
                     ratio(d_, s, 1) + "x"])
    d = records[0].get("data") or {}
    body = table(["transition", "shardtensor ms", "DTensor ms", "raw torch.distributed", "raw ms, in turns with shardtensor",
                  "raw ms, in turns with DTensor", "shardtensor / raw", "DTensor / raw", "DTensor / shardtensor"],
                 rows) if rows else ""
    doc.section("redistribute from Python: shardtensor vs DTensor vs raw torch.distributed",
                f"`x.redistribute()` on 16 MiB float32 ([2048, 2048] even, [2047, 2049] uneven) with shardtensor and "
                f"with torch's DTensor, each in turns with the raw torch.distributed collective (buffers prepared in "
                f"advance, output the whole result), {d.get('world', '?')} ranks; ms of the slowest rank, min / median "
                f"/ max over {(d.get('settings') or {}).get('redist_runs', '?')} runs. DTensor on Gloo runs S(0)->S(1) "
                f"as all-gather + chunk (no all_to_all on CPU).", records, body, python_torch(records),
                figs.get("redistribute_python"))


def render_tp(doc, records, figs):
    rows = []
    for r in section_of(records, "tp_mlp"):
        h, s, d = med(r["hand_written_ms"]), med(r["shardtensor_ms"]), med(r["dtensor_ms"])
        rows.append([f"{r['batch']} x {r['dim']} x {r['hidden']}", mmm(r["hand_written_ms"]), mmm(r["shardtensor_ms"]),
                     mmm(r["dtensor_ms"]), ratio(s, h), ratio(d, h),
                     f"{r['collectives_shardtensor']}; {r['collectives_dtensor']}"])
    d = records[0].get("data") or {}
    body = table(["batch x dim x hidden", "hand-written ms", "shardtensor ms", "DTensor ms", "shardtensor / hand-written",
                  "DTensor / hand-written", "collectives per step (shardtensor; DTensor)"], rows) if rows else ""
    doc.section("Tensor-parallel MLP step from Python",
                f"One training step (W1 column-parallel, W2 row-parallel; forward, MSE, backward, SGD) written by hand "
                f"on local tensors with one `dist.all_reduce` (the baseline), with shardtensor and with DTensor, the "
                f"three in turns, {d.get('world', '?')} ranks; ms of the slowest rank, min / median / max over "
                f"{(d.get('settings') or {}).get('tp_steps', '?')} steps.", records, body, python_torch(records))


def render_tp_block(doc, records, figs):
    d = next((rec["data"] for rec in records if rec.get("data")), None) or {}
    rows = []
    for r in d.get("rows", []):
        h, s, t = med(r["hand_written_ms"]), med(r["shardtensor_ms"]), med(r["dtensor_ms"])
        rows.append([f"{r['size']}: batch {r['batch']}, sequence {r['seq']}, dim {r['dim']}, {r['heads']} heads "
                     f"({r.get('kv_heads', r['heads'])} key/value), feed-forward {r['hidden']}", mmm(r["hand_written_ms"]), mmm(r["shardtensor_ms"]),
                     mmm(r["dtensor_ms"]), ratio(s, h), ratio(s, t),
                     f"{r['collectives_shardtensor']}; {r['collectives_dtensor']}"])
    body = table(["block", "hand-written ms", "shardtensor ms", "DTensor ms", "shardtensor / hand-written",
                  "shardtensor / DTensor", "collectives per step (shardtensor; DTensor)"], rows) if rows else ""
    if rows:
        body += (f"\n\nBars (issue 47): shardtensor ≤ {d.get('bar_hand')}x the hand-written step at both sizes, and "
                 f"≤ {d.get('bar_dtensor')}x DTensor's at the small one. The hand-written program makes 4 all-gathers, "
                 f"4 reduce-scatters and 1 all-reduce (both norm weights' gradients in one); shardtensor's "
                 f"SequenceParallel adds one small all-gather per norm (the sizes of uneven sequence pieces, which "
                 f"DTensor assumes even), and the two norm weights' gradients are reduced apart.")
        hand_worst = max(r["shardtensor_over_hand"] for r in d["rows"])
        small = [r["shardtensor_over_dtensor"] for r in d["rows"] if r["size"] == "small"]
        met = hand_worst <= d.get("bar_hand", 1.05) and all(v <= d.get("bar_dtensor", 0.5) for v in small)
        body += (f" In this run: **{'met' if met else 'not met'}** (worst {hand_worst:.2f}x hand-written"
                 + (f", {small[0]:.2f}x DTensor at the small size" if small else "") + ").")
    doc.section("Tensor-parallel transformer block through parallelize_module",
                f"One training step of a llama block (RMSNorm, causal grouped-query attention with rotary positions, "
                f"SwiGLU; forward, mean-square loss, "
                f"backward, SGD) under torchtitan's classic plan with sequence parallelism "
                f"(`bench/tp_block_bench.py`): the hand-written torch.distributed program on local tensors, "
                f"shardtensor's `parallelize_module`, and torch's DTensor `parallelize_module` with the same plan, "
                f"in turns, {d.get('world', '?')} ranks; ms of the slowest rank, min / median / max over "
                f"{d.get('steps', '?')} steps; each checked against the hand-written step first.", records, body,
                f"{d.get('torch', '?')} (Python {d.get('python', '?')})")


def render_unet_dp(doc, records, figs):
    d = next((rec["data"] for rec in records if rec.get("data")), None) or {}
    rows = []
    for r in d.get("rows", []):
        f = r["fewest"]
        how = " (`sum_gradients_with_ddp`)" if r.get("one_sum") else ""
        rows.append([f"{r['dp']} x {r['domain']}{how}", mmm(r["ms"], 1), f"{r['shardtensor_bytes']:,} + {r['ddp_bytes']:,}",
                     f"{f['halo']:,} + {f['statistics']:,} + {f['gradients']:,}", f"{r['over_fewest']:.2f}"])
    body = table(["dp x domain", "ms per step", "bytes sent (shardtensor + DDP)",
                  "fewest (halos + statistics + one gradient sum)", "sent / fewest"], rows) if rows else ""
    if rows:
        body += ("\n\nBy default the gradients are summed twice where both axes have more than one rank: shardtensor "
                 "sums each plain weight's gradient over \"domain\" as it becomes ready, and DDP then averages it over "
                 "\"dp\". With `shardtensor.parallel.sum_gradients_with_ddp(ddp, mesh)` each rank hands DDP its term "
                 "and DDP's buckets are summed once over all ranks. The norms' statistics are reduced in double "
                 "precision (the fewest counts them in float32).")
    doc.section("U-Net step under DDP x domain parallelism",
                f"The demo's U-Net ({d.get('height', '?')} x {d.get('width', '?')} field, batch {d.get('batch', '?')} "
                f"per dp group, float32) under PhysicsNeMo's recipe: plain weights, torch's DDP over \"dp\", the "
                f"field split over H on \"domain\" (`bench/unet_dp_domain_bench.py`), every (dp, domain) split of "
                f"{d.get('world', '?')} ranks in turns; ms of the slowest rank, min / median / max over "
                f"{d.get('steps', '?')} steps, each layout's first loss checked against one process first. Bytes are "
                f"what the busiest rank sends in one step, as payloads (a halo its rows, an all-reduce its tensor): "
                f"shardtensor's counted by CommDebugMode, DDP's by a comm hook plus the buffers it broadcasts; the "
                f"fewest the layout allows are worked out in the script's docstring.", records, body,
                f"{d.get('torch', '?')} (Python {d.get('python', '?')})")


def render_compile(doc, records, figs, traced=True):
    d = next((rec["data"] for rec in records if rec.get("data")), None) or {}
    variants = ["shardtensor eager", "shardtensor compiled", "DTensor eager", "DTensor compiled"]
    # The step's local work alone in plain torch (each rank's pieces, no all-reduce), where the run has it.
    local = ["torch eager", "torch compiled"] if all("torch eager" in r for r in d.get("tp_mlp", [])) and d.get("tp_mlp") else []
    rows = [[f"TP-MLP {r['batch']} x {r['dim']} x {r['hidden']}", *(mmm(r[v]) for v in variants + local),
             ratio(med(r["shardtensor compiled"]), med(r["shardtensor eager"])),
             ratio(med(r["shardtensor compiled"]), med(r["DTensor compiled"])),
             *([ratio(med(r["torch compiled"]), med(r["torch eager"]))] if local else [])] for r in d.get("tp_mlp", [])]
    u = d.get("unet")
    if u:
        rows.append([f"U-Net {u['height']} x {u['width']}, batch {u['batch']}, H split {u['sizes']}", mmm(u["eager"], 1),
                     mmm(u["compiled"], 1), "", "", *([""] * len(local)), ratio(med(u["compiled"]), med(u["eager"])), "",
                     *([""] if local else [])])
    body = table(["step", "shardtensor eager ms", "shardtensor compiled ms", "DTensor eager ms", "DTensor compiled ms",
                  *(["torch eager ms (local work)", "torch compiled ms (local work)"] if local else []),
                  "shardtensor compiled / eager", "shardtensor compiled / DTensor compiled",
                  *(["torch compiled / eager (local work)"] if local else [])], rows) if rows else ""
    if rows and traced:
        body += ("\n\nshardtensor's operators are traced (the default: `python/shardtensor/"
                 "_compile_trace.py`): the compiled TP-MLP step is one graph of local operators and shardtensor's "
                 "moves, which Inductor compiles; ShardTensors enter and leave the graph as their plain pieces, so "
                 "AOTAutograd's runtime wrappers are those of a plain graph. On these same-host ranks the row-parallel "
                 "all-reduce is one `shardtensor::all_reduce_parts` call, which runs eager mode's transport through "
                 "peer memory (torch's functional collectives on Gloo made the step 2-3x slower than eager). The "
                 "U-Net step is one graph too: its halos, batch-norm statistics and upsampling traced. What a "
                 "compiled step still pays over eager is torch.compile's own Python per call (dynamo's guards, "
                 "AOTAutograd's and Inductor's wrappers), which on 4 ranks sharing 2 cores each rank pays twice. The "
                 "local-work columns show what torch.compile does to the same step's local operators in plain torch "
                 "(each rank's pieces, no communication): where it makes them slower, a compiled step whose graph is "
                 "those operators and one all-reduce cannot be faster than the eager one.")
    elif rows:
        body += ("\n\nWith `SHARDTENSOR_COMPILE=eager` shardtensor's operators on ShardTensors are not traced: under "
                 "torch.compile they run eagerly behind graph breaks (`python/shardtensor/_compile.py`), so its compiled "
                 "step is its eager C++ work plus what dynamo's frame checks cost, and Inductor fuses nothing of it. The "
                 "default, traced, is the table above.")
    doc.section("torch.compile against eager" if traced else "torch.compile against eager, SHARDTENSOR_COMPILE=eager",
                f"One training step, {d.get('world', '?')} ranks (`bench/compile_bench.py`): the tensor-parallel MLP "
                f"(W1 Shard(0), W2 Shard(1); forward and mean-square loss under `torch.compile(backend=\"inductor\")`, "
                f"with the backward compiled alongside, and an eager SGD update) with shardtensor and with torch's DTensor, eager and compiled, and its local work alone in plain "
                f"torch (each rank's pieces, no all-reduce: what torch.compile saves or costs on this computation); the demo's "
                f"U-Net (float32, Replicate parameters) on its field split unevenly over H, eager and compiled. In "
                f"turns, ms of the slowest rank, min / median / max over {d.get('steps', '?')} steps after the compiling "
                f"warm-up; each variant's first loss checked against shardtensor's eager one first.", records, body,
                f"{d.get('torch', '?')} (Python {d.get('python', '?')})")


def render_collectives(doc, records, figs):
    d = next((rec["data"] for rec in records if rec.get("data")), None) or {}
    rows_in = d.get("rows", [])
    has_before = any("before" in r for r in rows_in)
    rows = []
    for r in rows_in:
        ours = r["shardtensor"] if r.get("shardtensor") is not None else f"failed: {r.get('shardtensor_error')}"
        theirs = r["dtensor"] if r.get("dtensor") is not None else f"fails: {r.get('dtensor_error')}"
        rows.append([r["case"], r["minimum"]] + ([r.get("before", "n/a")] if has_before else []) +
                    [ours, theirs, r.get("placements", ""), r["note"]])
    header = ["case", "minimum"] + (["before (f1b1390)"] if has_before else []) + [
        "shardtensor", "DTensor", "shardtensor's output", "why the minimum"]
    body = table(header, rows) if rows else ""
    doc.section("Collectives per operation",
                f"Counts, not times: collectives one call makes (inputs made beforehand, after a warm-up call), "
                f"shardtensor against torch's DTensor on the same program (sizes the mesh divides, so DTensor runs "
                f"every case) and against the fewest the layout allows; {d.get('world_size', '?')} ranks, every "
                f"result checked against one process first. \"before\": the same program on the tree before "
                f"issue 52 (`{COLLECTIVES_BEFORE}`).", records, body, python_torch_of_collectives(d))


def render_handlers(doc, records, figs):
    d = next((rec["data"] for rec in records if rec.get("data")), None) or {}

    def spread(values):
        return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"

    rows = [[f"`{name}`", spread(r["none_all"]), spread(r["others_all"]),
             f"{min(r['others_all']) - min(r['none_all']):+.2f}", f"{r['others'] - r['none']:+.2f}"]
            for name, r in d.get("ops", {}).items()]
    body = table(["op (8x8 local pieces, S(0))", "no handler µs", "handlers for other operators µs",
                  "difference of minima µs", "difference of medians µs"], rows) if rows else ""
    rs = d.get("register_sharding") or {}
    if rs.get("cxx") and rs.get("python"):
        def cell(phase, op):
            return f"{rs[phase][op + '_min']:.2f} / {rs[phase][op]:.2f}" if op + "_min" in rs[phase] else f"{rs[phase][op]:.2f}"

        body += "\n\n" + table(["aten::neg on a cache hit", "neg µs (min / median)", "control: abs µs (rule unchanged)"],
                                [["built-in C++ rule", cell("cxx", "neg"), cell("cxx", "abs")],
                                 ["register_sharding rule (Python)", cell("python", "neg"), cell("python", "abs")]])
        body += (f"\n\nregister_sharding minus the C++ rule on a hit (neg's change minus the control's): "
                 f"**{rs.get('delta_min_us', rs['delta_us']):+.2f} µs** of the minima, {rs['delta_us']:+.2f} µs of the "
                 f"medians (bar: within ±0.30 µs; the medians move with the VM's slow spells, the minima much less).")
    doc.section("Handlers and register_sharding: what they cost other operators",
                f"Per-op time from Python (the call through a lambda, so above the per-op table's figures) with no "
                f"handler registered and with a dispatch handler for aten::special_i0e and a function handler for "
                f"F.softsign registered, the two states in turns every round; then aten::neg with its C++ rule and "
                f"with a register_sharding rule of the same layouts (cache warm), aten::abs timed alongside as the "
                f"control. Rank 0 of {d.get('world_size', '?')}; µs, min / median / max over {d.get('rounds', '?')} "
                f"rounds of {d.get('number', '?')} calls.", records, body,
                f"{d.get('torch', 'unknown')} (shardtensor, Gloo)")


def python_torch_of_collectives(d):
    return f"{d.get('torch', 'unknown')} (shardtensor {d.get('shardtensor', '?')}, Gloo)"


def render_halo(doc, records, figs):
    rows = []
    steps, shape = "?", "?"
    for rec in records:
        d = rec.get("data")
        if not d:
            continue
        steps, shape = d["steps"], d["shape"]
        rows.append([str(d["world"]), ", ".join(str(x) for x in d["rows_per_rank"]), mmm(d["one_process_ms"], 1),
                     mmm(d["sharded_ms"], 1), ratio(med(d["one_process_ms"]), med(d["sharded_ms"])) + "x",
                     str(d["bytes_sent"]), str(d["halo_bytes"]),
                     f"{d['collectives']}" + (f" ({d['all_gathers']} all-gathers!)" if d["all_gathers"] else "")])
    body = table(["ranks", "rows per rank (H)", "one process ms", "sharded ms", "speed-up (one process / sharded)",
                  "bytes sent by rank 0 per step", "its halo bytes", "collectives per step"], rows) if rows else ""
    doc.section("Halo convolution (`halo_conv_bench`)",
                f"conv2d forward + backward on {shape} (kernel 3, padding 1), H split unevenly over the ranks, against "
                f"the same convolution in one process (the baseline, rank 0 alone); ms, min / median / max over {steps} "
                f"steps. The bytes sent must equal the halo rows: the forward's gather and the backward's scatter-add of "
                f"the input gradient's (the backward rebuilds the window from the rows the forward received); the "
                f"program fails otherwise.", records, body)


def render_attention(doc, records, figs):
    rows = []
    shape = "?"
    for rec in records:
        d = rec.get("data")
        if not d:
            continue
        shape = d["shape"]
        for r in d["rows"]:
            digits = 0 if med(r["one_process_ms"]) >= 100 else 1
            rows.append([str(d["world"]), str(r["seq"]), str(r["steps"]), mmm(r["one_process_ms"], digits),
                         mmm(r["ring_ms"], digits), mmm(r["gather_ms"], digits), ratio(med(r["ring_ms"]), med(r["gather_ms"])),
                         ratio(med(r["ring_ms"]), med(r["one_process_ms"])),
                         f"{r['ring_peak_mib']:.1f} / {r['gather_peak_mib']:.1f} / {r['one_process_peak_mib']:.1f}",
                         f"{r['gathered_kv_mib']:.1f}"])
    body = table(["ranks", "S", "steps", "one process ms", "ring ms", "gather-then-attend ms", "ring / gather",
                  "ring / one process", "peak extra MiB, rank 0 (ring / gather / one process)", "gathered K/V MiB"],
                 rows) if rows else ""
    doc.section("Context-parallel attention (`attention_bench`)",
                f"SDPA forward + backward, [B, H, S, D] = {shape} float32, Q/K/V split over S: the ring (K/V blocks "
                f"passed round) against gather-then-attend (K/V redistributed to Replicate) and one process (rank 0 "
                f"alone); ms, min / median / max over the steps.", records, body)


CHECKPOINT_PAIRS = {"save, fsync = false (as torch::save)": "torch::save, 1 process",
                    "save (fsync, atomic rename)": "torch::save + fsync, 1 process",
                    "load, same layout": "torch::load, 1 process",
                    "load resharded (S(0)<->S(1))": "torch::load, 1 process"}


def parse_checkpoint(stdout):
    rows = {}
    for line in stdout.splitlines():
        line = re.sub(r"^\[rank \d+\] ", "", line)
        m = re.match(r"\|\s*(.+?)\s*\|\s*([0-9.]+)\s*\|\s*([0-9.]+)\s*\|\s*(-?[0-9.]+)\s*\|\s*$", line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)), float(m.group(4)))
    return rows


def render_checkpoint(doc, records, figs):
    runs = [parse_checkpoint(rec.get("stdout", "")) for rec in records if not rec.get("error")]
    runs = [r for r in runs if r]
    rows = []
    if runs:
        for step in runs[0]:
            secs = [r[step][0] for r in runs if step in r]
            stat = {"min": min(secs), "median": statistics.median(secs), "max": max(secs)}
            gbs = statistics.median([r[step][1] for r in runs if step in r])
            rss = max(r[step][2] for r in runs if step in r)
            base = CHECKPOINT_PAIRS.get(step)
            rel = ""
            if base and base in runs[0]:
                bsecs = statistics.median([r[base][0] for r in runs if base in r])
                rel = f"{ratio(stat['median'], bsecs)} ({base})"
            rows.append([step, mmm(stat), f"{gbs:.2f}", f"{rss:.0f}", rel])
    body = table(["step (4 ranks, 1 GiB in 16 tensors)", "s (slowest rank)", "GB/s aggregate (median)",
                  "peak RSS rise MiB (max rank)", "time / one process's"], rows) if rows else ""
    doc.section("Distributed checkpoint (`checkpoint_bench`)",
                f"Saving and loading 1 GiB of sharded parameters against one process's `torch::save` / `torch::load` "
                f"of the same bytes in the same run; s, min / median / max over {len(runs)} launches.", records, body)


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------

def make_figures(results, fig_dir, quick, log):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log(f"no figures: matplotlib is missing ({e})")
        return {}
    os.makedirs(fig_dir, exist_ok=True)
    made = {}
    note = " (QUICK RUN: not figures to read)" if quick else ""

    ops = section_of(results.get("python_ops", []), "ops")
    cxx = {}
    for rec in results.get("dispatch", []):
        for r in (rec.get("data") or {}).get("rows", []):
            cxx[(r["op"], r["n"])] = med(r["hit_us"]) - med(r["plain_us"])
    cxx_names = {"add": "add", "mul scalar": "mul scalar", "relu": "relu", "sum unsharded dim": "sum(1)",
                 "mm S(0) x R": "mm", "view": "view", "t": "t"}
    cxx = {(cxx_names.get(k[0], k[0]), k[1]): v for k, v in cxx.items()}
    if ops:
        sizes = sorted({r["n"] for r in ops})
        fig, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 4.6), sharey=True, squeeze=False)
        for ax, n in zip(axes[0], sizes):
            rows = [r for r in ops if r["n"] == n]
            names = [r["op"] for r in rows]
            st_over = [max(med(r["shardtensor_us"]) - med(r["plain_us"]), 0.01) for r in rows]
            dt_over = [max(med(r["dtensor_us"]) - med(r["plain_us"]), 0.01) for r in rows]
            cx_over = [max(cxx.get((r["op"], n), float("nan")), 0.01) for r in rows]
            xs = range(len(rows))
            w = 0.27
            ax.bar([x - w for x in xs], st_over, w, label="shardtensor, from Python", color="#1f77b4")
            ax.bar(list(xs), cx_over, w, label="shardtensor, from C++ (dispatch_bench; n/a: not in it)", color="#9ecae1")
            ax.bar([x + w for x in xs], dt_over, w, label="DTensor, from Python", color="#d62728")
            for x, so, do in zip(xs, st_over, dt_over):
                ax.text(x + w, do * 1.08, f"{do / so:.0f}x", ha="center", va="bottom", fontsize=8)
            ax.set_yscale("log")
            ax.set_xticks(list(xs))
            ax.set_xticklabels(names, rotation=35, ha="right")
            ax.set_title(f"local piece {n}x{n}")
            ax.grid(axis="y", which="both", alpha=0.3)
        axes[0][0].set_ylabel("µs per op above the plain torch op (median)")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
        fig.suptitle("Per-op overhead: shardtensor vs torch DTensor (labels: DTensor over / shardtensor over)" + note,
                     fontsize=10)
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        fig.savefig(os.path.join(fig_dir, "per_op_overhead.png"), dpi=110)
        plt.close(fig)
        made["per_op"] = "per_op_overhead.png"

    py = section_of(results.get("python_redistribute", []), "redistribute")
    cpp = None
    for rec in results.get("redistribute", []):
        if rec.get("data") and rec["data"]["world"] == 4:
            cpp = rec["data"]
    if py or cpp:
        panels = (1 if py else 0) + (1 if cpp else 0)
        fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 5), squeeze=False)
        axes = list(axes[0])
        if py:
            ax = axes.pop(0)
            names = [r["transition"] for r in py]
            xs = range(len(py))
            w = 0.27
            for off, key, label, color in ((-w, "shardtensor_ms", "shardtensor", "#1f77b4"),
                                           (0, "dtensor_ms", "DTensor", "#d62728"),
                                           (w, "raw_next_to_shardtensor_ms", "raw torch.distributed", "#7f7f7f")):
                m = [med(r[key]) for r in py]
                lo = [med(r[key]) - r[key]["min"] for r in py]
                hi = [r[key]["max"] - med(r[key]) for r in py]
                ax.bar([x + off for x in xs], m, w, yerr=[lo, hi], capsize=2, label=label, color=color,
                       error_kw={"elinewidth": 0.8})
            for x, r in zip(xs, py):
                ax.text(x, r["dtensor_ms"]["max"] * 1.02, f"{med(r['dtensor_ms']) / med(r['shardtensor_ms']):.1f}x",
                        ha="center", va="bottom", fontsize=8)
            ax.set_xticks(list(xs))
            ax.set_xticklabels(names, rotation=30, ha="right")
            ax.set_ylabel("ms, slowest rank (median; bars: min to max)")
            world = (results["python_redistribute"][0].get("data") or {}).get("world", "?")
            ax.set_title(f"From Python, {world} ranks, 16 MiB float32 (labels: DTensor / shardtensor)", fontsize=10)
            ax.set_ylim(0, max(r[k]["max"] for r in py for k in ("shardtensor_ms", "dtensor_ms",
                                                                  "raw_next_to_shardtensor_ms")) * 1.25)
            ax.legend(fontsize=8, loc="upper left", ncol=3)
            ax.grid(axis="y", alpha=0.3)
        if cpp:
            ax = axes.pop(0)
            rows = cpp["rows"]
            names = [r["name"] for r in rows]
            ys = range(len(rows))
            h = 0.4
            raw = [med(r["ours"]) / med(r["raw"]) for r in rows]
            hand = [med(r["ours"]) / med(r["hand_written"]) if "hand_written" in r else float("nan") for r in rows]
            ax.barh([y - h / 2 for y in ys], raw, h, label="shardtensor / raw c10d collective (minimal bytes)",
                    color="#1f77b4")
            ax.barh([y + h / 2 for y in ys], hand, h, label="shardtensor / hand-written program", color="#ff7f0e")
            ax.axvline(1.0, color="black", linewidth=0.8)
            ax.set_yticks(list(ys))
            ax.set_yticklabels(names, fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel("ratio of medians (under 1: shardtensor faster)")
            ax.set_title(f"From C++, {cpp['world']} ranks, peer memory", fontsize=10)
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1, frameon=False)
            ax.grid(axis="x", alpha=0.3)
        fig.suptitle("redistribute against DTensor and the raw collective (2-core CPU, Gloo)" + note, fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(fig_dir, "redistribute.png"), dpi=110)
        plt.close(fig)
        made["redistribute"] = "redistribute.png"
    return made


# ---------------------------------------------------------------------------------------------

def sections_not_regenerated(path, doc) -> list:
    """The sections of the results file at ``path`` that this run did not write (``doc`` holds
    those it did): (title, text) in their order. Hand-made tables live there (before-and-after
    comparisons, a lent GPU's figures), which a full run would otherwise drop."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        parts = re.split(r"^## ", f.read(), flags=re.M)[1:]
    written = set(doc.titles)
    return [(part.split("\n", 1)[0].strip(), "## " + part.rstrip() + "\n") for part in parts
            if part.split("\n", 1)[0].strip() not in written]


def render(results, args, machine_text, cxx_torch_text, total_s, out, tree):
    fig_dir = os.path.join(os.path.dirname(os.path.abspath(out)), "figures")
    figs = make_figures(results, fig_dir, args.quick, lambda t: print(t, file=sys.stderr))
    # The redistribute figure goes under the Python table when there is one, else under C++'s.
    figs_py = dict(figs)
    if "redistribute" in figs and results.get("python_redistribute"):
        figs_py["redistribute_python"] = figs["redistribute"]
        figs_cpp = {k: v for k, v in figs.items() if k != "redistribute"}
    else:
        figs_cpp = figs
    doc = Doc(machine_text, cxx_torch_text)
    order = [
        ("python_ops", render_python_ops, figs),
        ("dispatch", render_dispatch, figs),
        ("python_redistribute", render_python_redistribute, figs_py),
        ("redistribute", render_redistribute, figs_cpp),
        ("redistribute_messages", render_redistribute_messages, figs),
        ("redistribute_arena", render_redistribute_arena, figs),
        ("arena_apps", render_arena_apps, figs),
        ("small", render_small, figs),
        ("redistribute", lambda d, r, f: render_planning(d, [x for x in r if x.get("data") and x["data"]["world"] == 4]
                                                         or r[:1], f), figs),
        ("python_ops", render_tp, figs),
        ("halo", render_halo, figs),
        ("attention", render_attention, figs),
        ("checkpoint", render_checkpoint, figs),
        ("collectives", render_collectives, figs),
        ("handlers", render_handlers, figs),
        ("tp_block", render_tp_block, figs),
        ("unet_dp", render_unet_dp, figs),
        ("compile", render_compile, figs),
        ("compile_eager", lambda d, r, f: render_compile(d, r, f, traced=False), figs),
    ]
    for key, fn, f in order:
        if results.get(key):
            fn(doc, results[key], f)
    kept = [] if args.quick or args.only else sections_not_regenerated(out, doc)
    for title, text in kept:
        doc.keep(title, text)
    rerun = "`./dev.sh bench" + (" --quick" if args.quick else "") + "`"
    ran_s = sum(rec.get("seconds", 0) for recs in results.values() for rec in recs)
    waited_s = sum(rec.get("waited_s", 0) for recs in results.values() for rec in recs)
    took = f"in {total_s / 60:.1f} minutes" + (f" ({ran_s / 60:.1f} of them running benchmarks, {waited_s / 60:.1f} waiting "
                                                f"for builds and test suites to finish)" if waited_s >= 60 else "")
    head = [
        "# Benchmark results",
        "",
        ("**QUICK RUN: tiny sizes and few repetitions, to check the script; these are not figures to read.**\n"
         if args.quick else ""),
        f"Regenerated by {rerun} (it builds `build-torch2/` and the Python package, then runs "
        f"`.venv/bin/python bench/regenerate.py --build-dir build-torch2`; `--quick` for a smoke test of a minute or two, "
        f"`--only KEYS` for some benchmarks) {took}, on the tree at {tree}. "
        f"The file is written from scratch each time" + (
            f", but for {len(kept)} sections that no program here produces, kept as they were, each with its own "
            f"machine, date and command (before-and-after runs of `bench/before_after.sh`, a lent GPU's run)" if kept else "")
        + "; earlier figures are in git history "
        f"(`git log -p bench/RESULTS.md`; the stop-by-stop log this file was before it was generated: "
        f"`git show 655ea7b:bench/RESULTS.md`).",
        "",
        f"These are **2-core CPU figures with Gloo**: every rank is a local process on {machine_text} "
        f"(so 4 ranks oversubscribe the cores), and shardtensor's local ranks move data through peer memory unless "
        f"a table says otherwise. Absolute times drift by up to 2x between days on this VM; the ratios, against a "
        f"baseline timed in turns in the same run, are what to compare. Timed cells are min / median / max; "
        f"ratios are of medians. Environment: "
        + " ".join(f"`{k}={v}`" for k, v in MALLOC_ENV.items()) + ", `OMP_NUM_THREADS=1` per rank (shardrun).",
        "",
        "Tables: " + " · ".join(doc.contents),
        "",
    ]
    text = "\n".join(h for h in head if h is not None) + "\n" + "\n".join(doc.parts)
    text = re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    return doc.failures


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build-dir", default="build-torch2", help="the C++ build with bench/ and tools/shardrun/ (build-torch2)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, few repetitions: a smoke test of about a minute")
    p.add_argument("--out", help="results file (default bench/RESULTS.md; with --quick or --only a temporary folder's)")
    p.add_argument("--only", help="comma-separated benchmark keys: " + ", ".join(BENCHES))
    p.add_argument("--save-raw", metavar="DIR", help="keep every run's output and JSON in DIR")
    p.add_argument("--render-only", metavar="DIR", help="rewrite the results file from a --save-raw folder, running nothing")
    p.add_argument("--no-wait", action="store_true", help="do not wait for builds and test suites to finish")
    p.add_argument("--max-wait", type=float, default=3600, help="seconds to wait for a quiet machine before each benchmark")
    a = p.parse_args()
    if a.out is None:
        a.out = (os.path.join(tempfile.gettempdir(), "shardtensor-bench-partial", "RESULTS.md") if a.quick or a.only
                 else os.path.join(REPO, "bench", "RESULTS.md"))
    keys = list(BENCHES) if not a.only else [k.strip() for k in a.only.split(",") if k.strip()]
    unknown = [k for k in keys if k not in BENCHES]
    if unknown:
        p.error(f"unknown benchmark keys {unknown}; known: {', '.join(BENCHES)}")
    a.keys = keys
    return a


def main():
    args = parse_args()
    machine_text, _ = machine()
    build_dir = os.path.join(REPO, args.build_dir) if not os.path.isabs(args.build_dir) else args.build_dir
    cxx_torch_text = cxx_torch(build_dir)
    start = time.time()
    results = {}
    if args.render_only:
        with open(os.path.join(args.render_only, "results.json")) as f:
            saved = json.load(f)
        results, total_s = saved["results"], saved["seconds"]
        machine_text, cxx_torch_text = saved["machine"], saved["cxx_torch"]
        tree = saved.get("tree", "unknown")
        args.quick = saved.get("quick", args.quick)
    else:
        missing = [p for p in (os.path.join(build_dir, "tools", "shardrun", "shardrun"),
                               os.path.join(build_dir, "bench", "redistribute_bench")) if not os.path.exists(p)]
        if missing and not set(args.keys) <= PYTHON_ONLY:
            sys.exit(f"regenerate.py: {', '.join(missing)} missing: build {args.build_dir} first (./dev.sh bench does)")
        tree = git_tree()
        runner = Runner(args)
        s = settings(args.quick)
        print(f"regenerate.py: {len(args.keys)} benchmarks on {machine_text}, raw output in {runner.work}",
              file=sys.stderr, flush=True)
        for key in args.keys:
            results[key] = BENCHES[key](runner, s)
        total_s = time.time() - start
        with open(os.path.join(runner.work, "results.json"), "w") as f:
            json.dump({"results": results, "seconds": total_s, "machine": machine_text, "cxx_torch": cxx_torch_text,
                       "quick": args.quick, "tree": tree}, f, indent=1)
        if not args.save_raw:
            shutil.rmtree(runner.work, ignore_errors=True)
    failures = render(results, args, machine_text, cxx_torch_text, total_s, args.out, tree)
    print(f"regenerate.py: wrote {args.out} and its figures in {total_s:.0f} s", file=sys.stderr)
    if failures:
        print("regenerate.py: some benchmarks failed:\n  " + "\n  ".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
