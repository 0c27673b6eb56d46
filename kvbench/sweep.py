"""Running a sweep so that no finished work is lost and every GPU is used.

A sweep is a list of *groups* (audit: one context; decode-bench: one context x
batch, plus the capacity search), each a handful of *cells* (one mode each).
Every cell has a key built from everything that changes its measurement; rows
carry it in the `cell` column, so `--resume` skips what a results folder
already holds. Groups are the unit of sharding: they keep fp16 (the reference
of every ratio and comparison) in the same process as the modes compared to it.

`run_sharded` starts one worker process per device; workers pull groups from a
queue and send rows back; the main process writes them (one writer, durable
lines) and, if a worker dies, records its cell as an error and starts another.
"""

from __future__ import annotations

import csv
import os
import queue as queue_mod
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.errors import KvbenchError


# ------------------------------------------------------------------------ sinks
class FileSink:
    """Rows go to the results files (one durable line per row)."""

    def __init__(self, writer) -> None:
        self.writer = writer

    def row(self, row: dict) -> None:
        self.writer.write(row)

    def start(self, cell: dict) -> None:
        pass


class QueueSink:
    """Rows go to the main process (sharded runs)."""

    def __init__(self, q, worker: int) -> None:
        self.q, self.worker = q, worker

    def row(self, row: dict) -> None:
        self.q.put(("row", self.worker, row))

    def start(self, cell: dict) -> None:
        self.q.put(("start", self.worker, cell))


@dataclass
class Sweep:
    """What this process runs: which groups, which cells are already done, and where rows go."""

    sink: object
    groups: set | None = None  # None: every group
    done: set = field(default_factory=set)  # cell keys already in the results
    rows: list = field(default_factory=list)

    def wants(self, group) -> bool:
        return self.groups is None or group in self.groups

    def is_done(self, key: str) -> bool:
        return key in self.done

    def start(self, cell: dict) -> None:
        self.sink.start(cell)

    def emit(self, row: dict) -> None:
        self.sink.row(row)
        self.rows.append(row)


def key(*parts) -> str:
    return "|".join("" if p is None else str(p) for p in parts)


# ----------------------------------------------------------------------- resume
def done_cells(csv_path: Path, *, version: str, model_hash: str, force: bool) -> set[str]:
    """Cell keys already in a results file; refuses files from another kvbench
    version or model unless forced (their numbers would not be comparable)."""
    if not csv_path.exists() or csv_path.stat().st_size == 0:
        return set()
    try:
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise KvbenchError(f"{csv_path} is not a readable CSV ({exc}); choose another --out") from None
    if not force:
        versions = {r.get("kvbench_version") for r in rows} - {version, "", None}
        hashes = {r.get("model_hash") for r in rows} - {model_hash, "", None}
        if versions or hashes:
            what = []
            if versions:
                what.append(f"kvbench {', '.join(sorted(versions))} (this is {version})")
            if hashes:
                what.append(f"model hash {', '.join(sorted(hashes))} (this is {model_hash})")
            raise KvbenchError(
                f"{csv_path} holds results from {' and '.join(what)}; pass --force to mix them, or use another --out"
            )
    return {r["cell"] for r in rows if r.get("cell") and not worker_died(r)}


def worker_died(row: dict) -> bool:
    """A row that says only that a sharded worker's process ended in its cell (a crash, the OS's memory
    killer): nothing about the cell itself, so `--resume` measures it again (the report keeps the later row)."""
    return row.get("status") == "error" and WORKER_DIED in (row.get("notes") or "")


WORKER_DIED = "died (exit code"  # in the error row of a worker's cell: "worker on DEVICE died (exit code N) ..."


def check_fresh(csv_path: Path, resume: bool, force: bool) -> None:
    """Appending a second sweep to a file would duplicate cells: ask what is meant."""
    if resume or force or not csv_path.exists() or csv_path.stat().st_size == 0:
        return
    with open(csv_path, "rb") as f:
        n = sum(1 for _ in f) - 1
    if n <= 0:  # a header alone (a run stopped before its first row): nothing to duplicate
        return
    raise KvbenchError(
        f"{csv_path} already holds {n} rows: pass --resume to continue that sweep "
        "(finished cells are skipped), --force to append anyway, or choose another --out"
    )


# --------------------------------------------------------------------- devices
def parse_devices(spec: str | None) -> list[str]:
    """'0,1' -> cuda:0, cuda:1; 'all' -> every visible GPU; 'cpu,cpu' -> two CPU workers."""
    if not spec:
        return []
    import torch

    spec = spec.strip()
    if spec == "all":
        n = torch.cuda.device_count()
        if n == 0:
            raise KvbenchError("--devices all: no CUDA GPU is visible")
        return [f"cuda:{i}" for i in range(n)]
    out = []
    for part in spec.split(","):
        p = part.strip()
        if p.isdigit():
            p = f"cuda:{p}"
        if p.startswith("cuda"):
            idx = int(p.split(":")[1]) if ":" in p else 0
            if idx >= torch.cuda.device_count():
                raise KvbenchError(f"--devices: {p} is not visible ({torch.cuda.device_count()} CUDA GPU(s))")
        elif p != "cpu":
            raise KvbenchError(f"--devices: '{part}' is not a GPU index, cuda:N, cpu or all")
        out.append(p)
    return out


# ---------------------------------------------------------------- sharded runs
def _worker(job: str, cfg, device: str, wid: int, tasks, results, done: set) -> None:
    """One process per device: pull groups, run them, send rows."""
    import torch

    from kvbench.runtime import Progress
    from kvbench.session import Session

    class Ticks(Progress):
        """This worker's (silent) progress: each cell it finishes or skips (--resume) ticks the main process'
        bar, as a single-process run's bar counts them."""

        def cell_done(self) -> None:
            super().cell_done()
            results.put(("tick", wid, None))

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides when to stop
    cfg.device, cfg.quiet = device, True
    if device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("KVBENCH_WORKERS", "1")))))
    try:
        session = Session.open(cfg, job, log=lambda m: None)
        results.put(("notes", wid, list(session.notes)))  # the model's and modes' notes (a fallback), once shown
        job_cls = job_class(job)
        while True:
            try:
                group = tasks.get(timeout=0.5)
            except queue_mod.Empty:
                continue
            if group is None:
                break
            results.put(("group", wid, group))
            sweep = Sweep(QueueSink(results, wid), {group}, done)
            with Ticks(0, True) as progress:
                runner = job_cls(session, progress, sweep)
                if hasattr(runner, "preflight"):  # as the single-process run does, before the group's cells
                    runner.preflight()
                runner.run()
            results.put(("group_done", wid, group))
    except Exception as exc:  # setup failures (bad model, ...) come back as one line
        from kvbench.runtime import one_line

        results.put(("fatal", wid, str(exc) if isinstance(exc, KvbenchError) else one_line(exc)))
        return
    results.put(("exit", wid, None))


def job_class(job: str):
    if job == "audit":
        from kvbench.audit import AuditJob

        return AuditJob
    from kvbench.bench import BenchJob

    return BenchJob


def run_sharded(
    job: str, cfg, devices: list[str], groups: list, sink, columns: list[str], progress=None, done: set = frozenset()
) -> list[dict]:
    """Run `groups` over one worker per device; rows go to `sink` in the main process."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    tasks = ctx.Queue()
    for g in groups:
        tasks.put(g)
    os.environ["KVBENCH_WORKERS"] = str(len(devices))
    # One results queue per worker: a process that dies while it holds its queue's write lock (os._exit, the OS's
    # memory killer) leaves that lock taken for good; shared, it blocked every other worker. A SimpleQueue writes
    # each message to the pipe before `put` returns: a Queue's feeder thread could still hold the rows a worker
    # had finished when it died (they were lost, and its error row named the cell before the one it died in).
    workers: dict[int, tuple] = {}  # id -> (process, device, its results queue)
    next_id = 0

    def spawn(device: str) -> None:
        nonlocal next_id
        results = ctx.SimpleQueue()
        p = ctx.Process(target=_worker, args=(job, cfg, device, next_id, tasks, results, set(done)), daemon=True)
        p.start()
        workers[next_id] = (p, device, results)
        next_id += 1

    def next_message():
        """The next message of any live worker, or None after ~0.5 s without one."""
        for _ in range(25):
            for _, _, results in list(workers.values()):
                if not results.empty():  # a whole message is there (put writes it in one piece)
                    return results.get()
            time.sleep(0.02)
        return None

    for d in devices:
        spawn(d)
    rows: list[dict] = []
    current: dict[int, dict] = {}  # the cell each worker is in
    groups_of: dict[int, object] = {}  # the group each worker is in (until its group_done)
    lost: list[tuple] = []  # (device, group, whether a cell's error row says where) of the workers that died
    remaining = len(groups)
    finished = 0
    shown: set[str] = set()  # the workers' session notes already printed (each worker sends the same ones)
    try:
        while remaining > 0 and workers:
            message = next_message()
            if message is None:
                for wid, (p, device, _) in list(workers.items()):
                    if p.exitcode is not None and p.exitcode != 0:
                        workers.pop(wid)
                        cell, group = current.pop(wid, None), groups_of.pop(wid, None)
                        if cell is not None:
                            row = {
                                **cell,
                                "status": "error",
                                "notes": f"worker on {device} {WORKER_DIED} {p.exitcode}) in this cell",
                            }
                            sink.row(row)
                            rows.append(row)
                        if group is not None:  # its group is lost with it; the others go on
                            remaining -= 1
                            lost.append((device, group, cell is not None))
                        spawn(device)
                continue
            kind, wid, payload = message
            if kind == "row":
                sink.row(payload)
                rows.append(payload)
                current.pop(wid, None)
            elif kind == "tick":
                if progress:
                    progress.cell_done()
            elif kind == "notes":
                for note in payload:
                    if note not in shown and progress:
                        shown.add(note)
                        progress.log(f"[dim]{note}[/dim]")
            elif kind == "start":
                current[wid] = payload
            elif kind == "group":
                groups_of[wid] = payload
            elif kind == "group_done":
                groups_of.pop(wid, None)
                remaining -= 1
                finished += 1
            elif kind == "fatal":
                raise KvbenchError(payload)
    finally:
        for _ in workers:
            tasks.put(None)
        deadline = time.time() + 5
        for p, _, _ in workers.values():
            p.join(timeout=max(0.1, deadline - time.time()))
            if p.is_alive():
                p.terminate()
    for device, group, in_cell in lost:  # the dead worker's other cells of that group have no row: say so
        where = "one error row says where" if in_cell else "between two of its cells"
        sys.stderr.write(
            f"warning: the worker on {device} died in group {group} ({where}); that group's cells after it have "
            "no row (the same command with --resume measures them, and that cell again)\n"
        )
    return rows
