"""Rotate the keys of a stored array chunk by chunk with Dask, against one NumPy process.

The keys live on disk as a .npy file of shape (batch, heads, seq, head_dim). Dask reads them
through a memory map in chunks of whole heads' sequence blocks, rotates each chunk with its own
positions (numba on each NumPy chunk) and writes the result into another memory-mapped .npy:
memory per worker is a few chunks, whatever the array's size. One NumPy process loads the whole
array, rotates it and saves it.

    python docs/examples/rotate_stored_keys.py --gib 2 --workers 2

prints both throughputs in GB/s (bytes read plus bytes written, as for a copy; the median of
``--repeat`` runs, each in a fresh process) and the peak anonymous memory each needed beyond
the interpreter's (the page cache behind the memory maps is the kernel's, and reclaimable).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


class AnonymousPeak:
    """The peak of the process's anonymous memory (RssAnon: what it holds itself, not the page
    cache that memory-mapped files use), sampled every 5 ms in a thread; Linux only."""

    def __init__(self) -> None:
        self.peak = self.base = self._now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    @staticmethod
    def _now() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._now())

    def stop(self) -> float:
        """The peak above the starting level, in MiB."""
        self._stop.set()
        self._thread.join()
        return max(self.peak, self._now()) - self.base


def make(path: Path, gib: float) -> tuple[int, ...]:
    heads, head_dim, seq = 8, 128, 8192
    batch = max(1, round(gib * 2**30 / (heads * seq * head_dim * 4)))
    shape = (batch, heads, seq, head_dim)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
    rng = np.random.default_rng(0)
    for b in range(batch):
        out[b] = rng.standard_normal((heads, seq, head_dim), dtype=np.float32)
    out.flush()
    return shape


def with_numpy(source: Path, target: Path) -> float:
    import anyrope

    start = time.perf_counter()
    keys = np.load(source)
    np.save(target, anyrope.RoPE(keys.shape[-1])(keys, offset=0))
    return time.perf_counter() - start


class Stored:
    """A .npy file read one chunk at a time: ``dask.array.from_array`` would read a NumPy memory
    map whole, into memory, as it builds the graph; given this it reads each chunk in its task."""

    def __init__(self, path: Path) -> None:
        mapped = np.load(path, mmap_mode="r")
        self.path, self.shape, self.dtype, self.ndim = path, mapped.shape, mapped.dtype, mapped.ndim

    def __getitem__(self, index: object) -> np.ndarray:
        return np.array(np.load(self.path, mmap_mode="r")[index])


def with_dask(source: Path, target: Path, workers: int, seq_chunk: int) -> float:
    import dask
    import dask.array as da

    import anyrope

    start = time.perf_counter()
    stored = Stored(source)
    keys = da.from_array(stored, chunks=(1, stored.shape[1], seq_chunk, stored.shape[3]))
    rotated = anyrope.RoPE(stored.shape[-1])(keys, offset=0)  # lazy: nothing read yet
    out = np.lib.format.open_memmap(target, mode="w+", dtype=stored.dtype, shape=stored.shape)
    with dask.config.set(scheduler="threads", num_workers=workers):
        da.store(rotated, out, lock=False)
    out.flush()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="size of the stored keys")
    parser.add_argument("--workers", type=int, default=2, help="dask threads")
    parser.add_argument("--seq-chunk", type=int, default=4096, help="tokens per chunk")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each")
    parser.add_argument("--run", choices=["numpy", "dask"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:  # one measurement in a fresh process, for its own peak memory
        import anyrope  # imported (and its kernel compiled) before the clock and the watch start

        anyrope.RoPE(128)(np.zeros((1, 1, 4, 128), dtype=np.float32))
        folder = Path(args.dir)
        watch = AnonymousPeak()
        if args.run == "numpy":
            seconds = with_numpy(folder / "keys.npy", folder / "numpy.npy")
        else:
            seconds = with_dask(folder / "keys.npy", folder / "dask.npy", args.workers, args.seq_chunk)
        print(seconds, watch.stop())
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        shape = make(Path(tmp) / "keys.npy", args.gib)
        nbytes = 2 * 4 * int(np.prod(shape))
        print(f"keys {shape} float32, {nbytes / 2 / 2**30:.2f} GiB")
        runs: dict[str, list[tuple[float, float]]] = {"numpy": [], "dask": []}
        for _ in range(args.repeat):  # alternating, so both meet the same state of the page cache
            for how, found in runs.items():
                command = [
                    sys.executable,
                    __file__,
                    "--run",
                    how,
                    "--dir",
                    tmp,
                    "--workers",
                    str(args.workers),
                ]
                command += ["--seq-chunk", str(args.seq_chunk)]
                result = subprocess.run(command, check=True, capture_output=True, text=True).stdout.split()
                found.append((float(result[0]), float(result[1])))
        for how, found in runs.items():
            seconds = statistics.median(s for s, _ in found)
            peak = max(p for _, p in found)
            print(
                f"{how:6s} {nbytes / seconds / 1e9:5.2f} GB/s (median of {len(found)})  peak memory +{peak:5.0f} MiB"
            )
        rotated_numpy = np.load(Path(tmp) / "numpy.npy", mmap_mode="r")
        rotated_dask = np.load(Path(tmp) / "dask.npy", mmap_mode="r")
        same = all(np.array_equal(rotated_numpy[b], rotated_dask[b]) for b in range(shape[0]))
        print("dask's result equals NumPy's:", same)
    return 0


if __name__ == "__main__":
    sys.exit(main())
