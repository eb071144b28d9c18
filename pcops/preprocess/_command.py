"""``python -m pcops.preprocess``: point-cloud files in, one preprocess cache out.

    python -m pcops.preprocess INPUTS... -o OUT --npoint N --nsample S [--radius R | --knn]
                               [--normalize] [--batch-size B] [--device auto|cpu|cuda[:i]]

INPUTS are files or folders (searched recursively for pcops.io.SUPPORTED_EXTENSIONS). OUT is a
.npz file, or a folder of shards ``shard_<rank>_<k>.npz`` plus ``manifest.json`` (for big
inputs, and under torchrun). Each cache holds centres, idx, lengths, num_points, shift, scale,
sources and the settings (see pcops.io.read_cache). A re-run skips the inputs already in the
cache (with other settings it stops, unless --overwrite). Inputs that cannot be read are listed
with their reason at the end; the others are still written, and the exit code is 1.

Under ``torchrun --nproc_per_node N`` (torch.distributed: nccl with one GPU per process, gloo on
the CPU) the inputs are split across the processes and each writes its own shards.
"""
import argparse
import collections
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .. import io as pio
from . import GraphedPreprocess, preprocess

def _die(message: str):
    """A usage or set-up error: the message on stderr, exit code 2 (1 means some inputs failed)."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


_OUT_KEYS = ("centres", "idx", "lengths", "num_points", "shift", "scale")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pcops.preprocess",
        description="Samples (FPS) and groups (kNN or ball query) point-cloud files into a cache.")
    p.add_argument("inputs", nargs="+", help="cloud files or folders (recursive, by extension: "
                   + " ".join(pio.SUPPORTED_EXTENSIONS) + ")")
    p.add_argument("-o", "--out", required=True,
                   help="the cache: a .npz file, or a folder of shards (needed under torchrun)")
    p.add_argument("--npoint", type=int, required=True, help="FPS centres per cloud")
    p.add_argument("--nsample", type=int, required=True, help="neighbours per centre")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--radius", type=float, default=None, help="ball query with this radius")
    g.add_argument("--knn", action="store_true", help="k nearest neighbours (the default)")
    p.add_argument("--normalize", action="store_true",
                   help="centre each cloud on its mean and scale it into the unit sphere first")
    p.add_argument("--batch-size", type=int, default=8, help="clouds per call (default 8)")
    p.add_argument("--device", default="auto", help="auto (a GPU when present), cpu, cuda, cuda:i")
    p.add_argument("--graph", action="store_true", help="replay CUDA graphs (GPU only)")
    p.add_argument("--nan", choices=("drop", "raise", "keep"), default="drop",
                   help="points with non-finite coordinates: drop them (default) or fail the file")
    p.add_argument("--shard-size", type=int, default=256,
                   help="clouds per shard file in folder mode (default 256)")
    p.add_argument("--workers", type=int, default=2, help="file-reading threads (default 2)")
    p.add_argument("--overwrite", action="store_true", help="replace a cache with other settings")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


class _Dist:
    """rank / world size, and the few collectives the command needs (a no-op on one process)."""

    def __init__(self, device_type: str):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.on = self.world > 1
        if self.on:
            import torch.distributed as dist
            backend = "nccl" if device_type == "cuda" else "gloo"
            if device_type == "cuda":
                torch.cuda.set_device(self.local_rank)
            dist.init_process_group(backend=backend)
            self.dist = dist

    def barrier(self):
        if self.on:
            self.dist.barrier()

    def gather(self, obj):
        if not self.on:
            return [obj]
        out = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def close(self, together=True):
        if self.on:
            if together:  # every rank done: tear down together (see models/train.py)
                self.dist.barrier()
            self.dist.destroy_process_group()


def _pick_device(arg: str) -> torch.device:
    """--device -> a torch.device; under torchrun a GPU run uses GPU LOCAL_RANK."""
    import pcops
    if arg == "auto":
        arg = "cuda" if pcops.WITH_CUDA and torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(arg)
    except RuntimeError as e:
        _die(f"pcops.preprocess: --device {arg}: {e}")
    if dev.type == "cuda":
        if not (pcops.WITH_CUDA and torch.cuda.is_available()):
            _die(f"pcops.preprocess: --device {arg}: no CUDA GPU is available (or pcops was built without CUDA)")
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        elif dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        _die(f"pcops.preprocess: --device {arg}: expected auto, cpu or cuda[:i]")
    return dev


def _read_all(paths, nan, workers):
    """(path, Cloud or error message) in order, read ahead by a thread pool."""
    def read(path):
        try:
            cloud = pio.read_cloud(path, nan=nan)
            if len(cloud) == 0:
                return path, "no points" + (" (after dropping non-finite rows)" if nan == "drop" else "")
            return path, cloud
        except (pio.CloudReadError, OSError) as e:
            msg = str(e)
            return path, msg[len(path) + 2:] if msg.startswith(path + ": ") else msg

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        window = collections.deque()
        it = iter(paths)
        for p in it:
            window.append(pool.submit(read, p))
            if len(window) >= 4 * max(1, workers):
                break
        while window:
            yield window.popleft().result()
            nxt = next(it, None)
            if nxt is not None:
                window.append(pool.submit(read, nxt))


class _Writer:
    """Collects results and writes them: one .npz (merged with what it held) or shards."""

    def __init__(self, out, folder, settings, rank, shard_size, existing):
        self.out, self.folder, self.settings, self.rank = out, folder, settings, rank
        self.shard_size = max(1, shard_size)
        self.existing = existing  # the .npz cache read before (file mode), or None
        self.buf = {k: [] for k in _OUT_KEYS}
        self.sources = []
        self.written = 0
        if folder:
            ks = [int(os.path.basename(f).split("_")[2].split(".")[0]) for f in pio.cache_shards(out)
                  if os.path.basename(f).startswith(f"shard_{rank}_")]
            self.next_k = max(ks) + 1 if ks else 0

    def add(self, out, sources):
        arrays = {k: getattr(out, "point_lengths" if k == "num_points" else k) for k in _OUT_KEYS}
        for k, v in arrays.items():
            self.buf[k].append(v.cpu().numpy())
        self.sources.extend(sources)
        if self.folder and len(self.sources) >= self.shard_size:
            self.flush()

    def _take(self):
        cat = {k: np.concatenate(v) for k, v in self.buf.items() if v}
        n = len(self.sources)
        self.buf = {k: [] for k in _OUT_KEYS}
        src, self.sources = self.sources, []
        return cat, src, n

    def flush(self):
        if not self.sources:
            return
        cat, src, n = self._take()
        name = os.path.join(self.out, f"shard_{self.rank}_{self.next_k}.npz")
        self.next_k += 1
        self._write(name, cat, src)
        self.written += n

    def _write(self, path, cat, src):
        pio.write_cache(path, cat, src, self.settings)

    def close(self):
        if self.folder:
            self.flush()
            return
        if not self.sources:
            return
        cat, src, n = self._take()
        if self.existing is not None:
            old = self.existing
            cat = {k: np.concatenate([old[k], cat[k]]) for k in _OUT_KEYS}
            src = list(old["sources"]) + list(src)
        self._write(self.out, cat, src)
        self.written += n


def _read_existing(out, folder, settings, overwrite, dist):
    """The sources already in the cache (and, for a .npz, its arrays to merge with)."""
    if not os.path.exists(out) or (folder and not pio.cache_shards(out)):
        return set(), None
    try:
        if folder:
            old = pio.read_cache(out, sources_only=True)
            arrays = None
        else:
            with np.load(out, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            old_settings = json.loads(str(arrays["settings"]))
            old = pio.Cache(None, None, None, None, None, None, arrays["sources"], old_settings)
    except Exception as e:
        _die(f"pcops.preprocess: cannot read the existing cache {out}: {e}\n"
                         f"(remove it, or choose another -o)")
    if old.settings != settings:
        if not overwrite:
            _die(f"pcops.preprocess: {out} holds a cache made with other settings "
                             f"({json.dumps(old.settings, sort_keys=True)}); this run asks for "
                             f"{json.dumps(settings, sort_keys=True)}. Pass --overwrite to replace it, "
                             f"or choose another -o.")
        dist.barrier()
        if dist.rank == 0:
            if folder:
                for f in pio.cache_shards(out):
                    os.remove(f)
                if os.path.exists(os.path.join(out, pio.MANIFEST)):
                    os.remove(os.path.join(out, pio.MANIFEST))
            else:
                os.remove(out)
        dist.barrier()
        return set(), None
    if arrays is not None:
        missing = [k for k in _OUT_KEYS + ("sources",) if k not in arrays]
        if missing:
            _die(f"pcops.preprocess: {out} is not a pcops cache (no {', '.join(missing)})")
    return set(str(s) for s in old.sources), arrays


def _write_manifest(out, settings):
    shards = pio.cache_shards(out)
    counts = {}
    for f in shards:
        with np.load(f, allow_pickle=False) as z:
            counts[os.path.basename(f)] = int(z["lengths"].shape[0])
    manifest = {"format": pio.CACHE_FORMAT, "version": 1, "settings": settings,
                "shards": list(counts), "clouds": sum(counts.values())}
    tmp = os.path.join(out, pio.MANIFEST + f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(out, pio.MANIFEST))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("npoint", "nsample", "batch_size", "shard_size"):
        if getattr(args, name) < 1:
            _die(f"pcops.preprocess: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.radius is not None and not (args.radius > 0 and np.isfinite(args.radius)):
        _die(f"pcops.preprocess: --radius must be finite and > 0, got {args.radius}")

    device = _pick_device(args.device)
    dist = _Dist(device.type)
    try:
        rc = _run(args, dist, device)
    except BaseException:
        dist.close(together=False)  # the other ranks may be anywhere: no barrier
        raise
    dist.close()
    return rc


def _run(args, dist, device) -> int:
    out = os.path.abspath(args.out)
    folder = not out.lower().endswith(".npz")
    if dist.on and not folder:
        _die("pcops.preprocess: under torchrun every process writes its own shards: "
                         "give -o a folder, not a .npz file")
    settings = {"npoint": args.npoint, "nsample": args.nsample,
                "method": "knn" if args.radius is None else "ball_query", "radius": args.radius,
                "normalize": bool(args.normalize), "nan": args.nan}
    if folder and dist.rank == 0:
        os.makedirs(out, exist_ok=True)
    dist.barrier()

    files = [os.path.abspath(f) for f in pio.find_clouds(args.inputs, recursive=True)]
    # the cache itself is never an input: its shards (a folder) or its file (.npz) may lie
    # inside an input folder, and a re-run would otherwise read them back as clouds
    own = out + os.sep
    files = [f for f in files if f != out and not f.startswith(own)]
    if not files:
        _die(f"pcops.preprocess: no cloud files ({' '.join(pio.SUPPORTED_EXTENSIONS)}) in {' '.join(args.inputs)}")
    done, existing = _read_existing(out, folder, settings, args.overwrite, dist)
    dist.barrier()  # every process has the same view of the cache before any writes to it
    todo = [f for f in files if f not in done]
    mine = todo[dist.rank::dist.world]
    skipped = len(files) - len(todo)

    graph = None
    if args.graph and device.type == "cuda":
        graph = GraphedPreprocess(args.npoint, args.nsample, radius=args.radius,
                                  normalize=args.normalize, grouped=False, device=device)

    def run(clouds):
        if graph is not None:
            return graph(clouds)
        return preprocess(clouds, args.npoint, args.nsample, radius=args.radius,
                          normalize=args.normalize, device=device, grouped=False)

    writer = _Writer(out, folder, settings, dist.rank, args.shard_size, existing)
    failed, points, clouds_done = [], 0, 0
    try:
        from tqdm import tqdm
        bar = tqdm(total=len(mine), unit="cloud", disable=args.no_progress or dist.rank != 0,
                   desc=f"preprocess ({device})", dynamic_ncols=True)
    except ImportError:  # tqdm is a listed dependency, but the command must not need it
        bar = None

    def process(batch):
        nonlocal points, clouds_done
        try:
            res = run([c.xyz for c in batch])
            writer.add(res, [c.path for c in batch])
        except Exception as e:  # one bad cloud must not lose the batch: retry one by one
            if len(batch) == 1:
                failed.append((batch[0].path, f"preprocess failed ({type(e).__name__}: {e})"))
                return
            for c in batch:
                process([c])
            return
        points += sum(len(c) for c in batch)
        clouds_done += len(batch)

    t0 = time.perf_counter()
    batch = []
    for path, cloud in _read_all(mine, args.nan, args.workers):
        if isinstance(cloud, str):
            failed.append((path, cloud))
        else:
            batch.append(cloud)
            if len(batch) == args.batch_size:
                process(batch)
                batch = []
        if bar is not None:
            bar.update(1)
    if batch:
        process(batch)
    writer.close()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()

    # totals over the processes; rank 0 writes the manifest and prints the summary
    stats = dist.gather({"rank": dist.rank, "clouds": clouds_done, "points": points,
                         "elapsed": elapsed, "failed": failed})
    if folder and dist.rank == 0:
        _write_manifest(out, settings)
    n_failed = sum(len(s["failed"]) for s in stats)
    if dist.rank == 0:
        clouds = sum(s["clouds"] for s in stats)
        pts = sum(s["points"] for s in stats)
        wall = max(s["elapsed"] for s in stats) or 1e-9
        procs = f" on {dist.world} processes" if dist.on else ""
        print(f"pcops.preprocess: {clouds} clouds ({pts} points) in {wall:.2f} s on {device}{procs}: "
              f"{clouds / wall:.1f} clouds/s, {pts / wall:.3g} points/s; {skipped} already in the "
              f"cache, skipped; {n_failed} failed. Cache: {out}")
        if n_failed:
            print(f"pcops.preprocess: {n_failed} input(s) failed:", file=sys.stderr)
            for s in stats:
                for path, why in s["failed"]:
                    print(f"  {path}: {why}", file=sys.stderr)
    return 1 if n_failed else 0
