"""Point-cloud file readers and the preprocess cache (``pcops.io``).

Formats (by extension, case-insensitive):

    .npy            [N, 3+] numeric array (columns past 3 -> field "features"), or a
                    structured array with fields x, y, z (+ others); memory-mapped
    .npz            an array named xyz / points / pos / vertices / data (or the only array);
                    other arrays with N rows become fields
    .ply            ASCII, binary_little_endian, binary_big_endian; the "vertex" element's
                    x, y, z and every other property (intensity, nx/ny/nz, red, ...) as
                    fields; binary data memory-mapped. The header is parsed here (no
                    dependency).
    .bin            KITTI velodyne: float32 x, y, z, intensity per point; memory-mapped
    .pcd            PCL: DATA ascii and binary (memory-mapped); binary_compressed needs the
                    optional ``lzf`` module (pip install python-lzf), else a clear error
    .las / .laz     through the optional ``laspy`` package (LAZ also needs a laspy backend
                    such as lazrs), else a clear error

Every problem with a file (unknown format, truncated data, header/data size mismatch, no
x/y/z, non-finite rows when ``nan="raise"``, ...) raises :class:`CloudReadError` naming the
file and what is wrong; a cloud is returned whole or not at all.

Coordinates come back as float32 ``[N, 3]`` (float64 sources are rounded: move UTM-scale data
near the origin before if the centimetres matter); fields keep their stored dtype.
"""
import json
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = [
    "SUPPORTED_EXTENSIONS",
    "Cache",
    "Cloud",
    "CloudReadError",
    "find_clouds",
    "read_cache",
    "read_cloud",
    "write_cache",
]

SUPPORTED_EXTENSIONS: Tuple[str, ...] = (".npy", ".npz", ".ply", ".bin", ".pcd", ".las", ".laz")
"""Extensions (lower case) that :func:`read_cloud` and :func:`find_clouds` know."""


class CloudReadError(ValueError):
    """A point-cloud (or cache) file that cannot be read; the message names the file and the
    problem."""


@dataclass
class Cloud:
    """One point cloud read from a file.

    Attributes:
        path: the file it came from.
        xyz: float32 ``[N, 3]`` coordinates (C-contiguous).
        fields: extra per-point properties by name (``intensity``, ``nx``, ``ny``, ``nz``,
            ``red``, ...), each with N rows, in their stored dtype.
    """

    path: str
    xyz: np.ndarray
    fields: Dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.xyz.shape[0])


def _fail(path, what) -> None:
    raise CloudReadError(f"{path}: {what}")


# ---------------------------------------------------------------------------------------------
# common helpers

def _structured_to_cloud(path, arr: np.ndarray, what: str) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    """x, y, z of a structured array -> ([N,3] float32, other fields in native byte order)."""
    names = arr.dtype.names or ()
    missing = [c for c in ("x", "y", "z") if c not in names]
    if missing:
        _fail(path, f"no {'/'.join(missing)} in {what} (it has: {', '.join(names) or 'nothing'})")
    xyz = np.empty((arr.shape[0], 3), dtype=np.float32)
    for j, c in enumerate(("x", "y", "z")):
        if arr.dtype[c].shape != ():
            _fail(path, f"property '{c}' of {what} has {arr.dtype[c].shape} values per point, expected 1")
        xyz[:, j] = arr[c]
    fields = {}
    for name in names:
        if name in ("x", "y", "z"):
            continue
        col = np.asarray(arr[name])
        fields[name] = col.astype(col.dtype.newbyteorder("="), copy=True)
    return xyz, fields


def _apply_nan_policy(path, xyz, fields, nan):
    if nan == "keep":
        return xyz, fields
    finite = np.isfinite(xyz).all(axis=1)
    if finite.all():
        return xyz, fields
    bad = int((~finite).sum())
    if nan == "raise":
        first = int(np.argmin(finite))
        _fail(path, f"{bad} of {xyz.shape[0]} points have non-finite coordinates (NaN or inf; "
                    f"the first is row {first}); read with nan='drop' to drop them")
    return np.ascontiguousarray(xyz[finite]), {k: v[finite] for k, v in fields.items()}


def _file_size(path) -> int:
    try:
        return os.path.getsize(path)
    except OSError as e:
        _fail(path, f"cannot open: {e.strerror or e}")


def _read_header(path, first_line: bytes, end_line: bytes, limit=1 << 20) -> Tuple[List[str], int]:
    """The header lines (decoded, stripped) up to and including the line that starts with
    `end_line`, and the byte offset where the data begins."""
    try:
        with open(path, "rb") as f:
            head = f.read(limit)
    except OSError as e:
        _fail(path, f"cannot open: {e.strerror or e}")
    if first_line and not head.startswith(first_line):
        _fail(path, f"not a {first_line.decode().strip().upper()} file (the first bytes are {head[:16]!r})")
    lines, pos = [], 0
    while True:
        nl = head.find(b"\n", pos)
        if nl < 0:
            _fail(path, f"truncated header: no '{end_line.decode()}' line in the first "
                        f"{min(len(head), limit)} bytes")
        raw = head[pos:nl]
        pos = nl + 1
        try:
            line = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            _fail(path, f"header line {len(lines) + 1} is not ASCII text: {raw[:40]!r}")
        lines.append(line)
        if line.split(" ")[0] == end_line.decode():
            return lines, pos


def _memmap_records(path, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


def _check_size(path, have: int, need: int, what: str, exact: bool) -> None:
    if have < need:
        _fail(path, f"truncated data: {what} needs {need} bytes after the header, the file holds "
                    f"{have} ({need - have} missing)")
    if exact and have > need:
        _fail(path, f"header/data size mismatch: {what} needs {need} bytes after the header, the "
                    f"file holds {have} ({have - need} extra)")


def _parse_text_rows(path, lines: Sequence[str], ncols: int, what: str, first_line_no: int) -> np.ndarray:
    """Whitespace-separated numbers, `ncols` per line -> float64 [len(lines), ncols]."""
    rows = [ln.split() for ln in lines]
    for i, r in enumerate(rows):
        if len(r) != ncols:
            _fail(path, f"{what}: line {first_line_no + i} has {len(r)} values, expected {ncols}")
    try:
        return np.array(rows, dtype=np.float64).reshape(len(rows), ncols)
    except ValueError as e:
        _fail(path, f"{what}: not a number ({e})")


# ---------------------------------------------------------------------------------------------
# .npy / .npz

_NPZ_XYZ_KEYS = ("xyz", "points", "pos", "vertices", "data", "arr_0")


def _from_array(path, arr: np.ndarray, what: str):
    if arr.dtype.names:
        if arr.ndim != 1:
            _fail(path, f"{what}: a structured array must be 1-D, got shape {arr.shape}")
        return _structured_to_cloud(path, arr, what)
    if arr.ndim != 2 or arr.shape[1] < 3:
        _fail(path, f"{what}: expected an [N, 3] (or [N, 3+C]) array, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        _fail(path, f"{what}: expected a numeric array, got dtype {arr.dtype}")
    xyz = np.array(arr[:, :3], dtype=np.float32, order="C")  # a copy: never a view of the file
    fields = {}
    if arr.shape[1] > 3:
        fields["features"] = np.array(arr[:, 3:])
    return xyz, fields


def _read_npy(path):
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except OSError as e:
        _fail(path, f"cannot open: {e.strerror or e}")
    except Exception as e:  # bad magic, truncated data, pickled objects
        _fail(path, f"not a readable .npy file ({type(e).__name__}: {e})")
    return _from_array(path, arr, "the array")


def _read_npz(path):
    try:
        with np.load(path, allow_pickle=False) as z:
            names = list(z.files)
            if not names:
                _fail(path, "the archive holds no arrays")
            key = next((k for k in _NPZ_XYZ_KEYS if k in names), names[0] if len(names) == 1 else None)
            if key is None:
                _fail(path, f"no coordinate array: expected one of {', '.join(_NPZ_XYZ_KEYS)} "
                            f"(it has: {', '.join(names)})")
            xyz, fields = _from_array(path, z[key], f"array '{key}'")
            for k in names:
                if k == key:
                    continue
                a = z[k]
                if a.ndim >= 1 and a.shape[0] == xyz.shape[0] and not a.dtype.names:
                    fields[k] = a
    except CloudReadError:
        raise
    except OSError as e:
        _fail(path, f"cannot open: {e.strerror or e}")
    except Exception as e:  # bad zip, truncated member, pickled objects
        _fail(path, f"not a readable .npz file ({type(e).__name__}: {e})")
    return xyz, fields


# ---------------------------------------------------------------------------------------------
# PLY

_PLY_TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1",
    "short": "i2", "int16": "i2", "ushort": "u2", "uint16": "u2",
    "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8",
}


@dataclass
class _PlyElement:
    name: str
    count: int
    props: List[Tuple[str, str]] = field(default_factory=list)  # (name, numpy code)
    has_list: bool = False


def _parse_ply_header(path, lines):
    fmt, elements = None, []
    for no, line in enumerate(lines[1:-1], start=2):
        words = line.split()
        if not words or words[0] in ("comment", "obj_info"):
            continue
        if words[0] == "format":
            if len(words) < 2 or words[1] not in ("ascii", "binary_little_endian", "binary_big_endian"):
                _fail(path, f"unknown PLY format on header line {no}: {line!r}")
            fmt = words[1]
        elif words[0] == "element":
            if len(words) != 3 or not words[2].isdigit():
                _fail(path, f"bad element line {no} in the header: {line!r}")
            elements.append(_PlyElement(words[1], int(words[2])))
        elif words[0] == "property":
            if not elements:
                _fail(path, f"property before any element on header line {no}: {line!r}")
            el = elements[-1]
            if len(words) == 5 and words[1] == "list":
                if words[2] not in _PLY_TYPES or words[3] not in _PLY_TYPES:
                    _fail(path, f"unknown property type on header line {no}: {line!r}")
                el.has_list = True
                el.props.append((words[4], "list"))
            elif len(words) == 3:
                if words[1] not in _PLY_TYPES:
                    _fail(path, f"unknown property type '{words[1]}' on header line {no}")
                el.props.append((words[2], _PLY_TYPES[words[1]]))
            else:
                _fail(path, f"bad property line {no} in the header: {line!r}")
        else:
            _fail(path, f"unknown header line {no}: {line!r}")
    if fmt is None:
        _fail(path, "no 'format' line in the PLY header")
    return fmt, elements


def _read_ply(path):
    lines, offset = _read_header(path, b"ply", b"end_header")
    fmt, elements = _parse_ply_header(path, lines)
    vi = next((i for i, e in enumerate(elements) if e.name == "vertex"), None)
    if vi is None:
        vi = next((i for i, e in enumerate(elements) if {"x", "y", "z"} <= {p for p, _ in e.props}), None)
    if vi is None:
        _fail(path, f"no 'vertex' element (elements: {', '.join(e.name for e in elements) or 'none'})")
    vertex = elements[vi]
    if vertex.has_list:
        _fail(path, "unsupported: list properties in the vertex element")
    names = [p for p, _ in vertex.props]
    if len(set(names)) != len(names):
        _fail(path, f"duplicate property names in the vertex element: {names}")
    what = f"element 'vertex' ({vertex.count} points)"

    if fmt == "ascii":
        body = _ascii_data_lines(path, offset, "PLY")
        before = sum(e.count for e in elements[:vi])
        total = sum(e.count for e in elements)
        if len(body) < before + vertex.count:
            _fail(path, f"truncated data: the header declares {total} data lines "
                        f"({vertex.count} vertices), the file holds {len(body)}")
        if len(body) > total:
            _fail(path, f"header/data size mismatch: the header declares {total} data lines, the "
                        f"file holds {len(body)}")
        vals = _parse_text_rows(path, body[before:before + vertex.count], len(names), what,
                                len(lines) + before + 1)
        arr = np.empty(vertex.count, dtype=[(n, c) for n, c in vertex.props])
        for j, n in enumerate(names):
            arr[n] = vals[:, j]
        return _structured_to_cloud(path, arr, what)

    order = "<" if fmt == "binary_little_endian" else ">"
    for e in elements[:vi]:
        if e.has_list:
            _fail(path, f"unsupported: element '{e.name}' with list properties before the vertex element")
    dtypes = [None if e.has_list else np.dtype([(n, order + c) for n, c in e.props]) for e in elements]
    skip = sum(dtypes[i].itemsize * elements[i].count for i in range(vi))
    need = skip + dtypes[vi].itemsize * vertex.count
    after_fixed = all(not e.has_list for e in elements[vi + 1:])
    if after_fixed:
        need_all = need + sum(dtypes[i].itemsize * elements[i].count for i in range(vi + 1, len(elements)))
    have = _file_size(path) - offset
    _check_size(path, have, need, what, exact=False)
    if after_fixed:
        _check_size(path, have, need_all, "the elements declared in the header", exact=True)
    arr = _memmap_records(path, dtypes[vi], offset + skip, vertex.count)
    return _structured_to_cloud(path, arr, what)


# ---------------------------------------------------------------------------------------------
# KITTI .bin

def _read_kitti_bin(path):
    size = _file_size(path)
    if size % 16:
        _fail(path, f"size {size} bytes is not a multiple of 16: not a KITTI velodyne scan "
                    f"(float32 x, y, z, intensity per point), or truncated")
    n = size // 16
    arr = _memmap_records(path, np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("intensity", "<f4")]), 0, n)
    return _structured_to_cloud(path, arr, "the scan")


# ---------------------------------------------------------------------------------------------
# PCD

_PCD_TYPES = {("F", 4): "f4", ("F", 8): "f8", ("I", 1): "i1", ("I", 2): "i2", ("I", 4): "i4",
              ("I", 8): "i8", ("U", 1): "u1", ("U", 2): "u2", ("U", 4): "u4", ("U", 8): "u8"}


def _parse_pcd_header(path, lines):
    h = {}
    for no, line in enumerate(lines, start=1):
        words = line.split()
        if not words or line.startswith("#"):
            continue
        key = words[0].upper()
        if key not in ("VERSION", "FIELDS", "SIZE", "TYPE", "COUNT", "WIDTH", "HEIGHT", "VIEWPOINT",
                       "POINTS", "DATA"):
            _fail(path, f"unknown PCD header line {no}: {line!r}")
        h[key] = words[1:]
    for key in ("FIELDS", "SIZE", "TYPE", "WIDTH", "DATA"):
        if key not in h:
            _fail(path, f"the PCD header has no {key} line")
    names = h["FIELDS"]
    counts = h.get("COUNT", ["1"] * len(names))
    if not (len(names) == len(h["SIZE"]) == len(h["TYPE"]) == len(counts)):
        _fail(path, f"PCD header: FIELDS ({len(names)}), SIZE ({len(h['SIZE'])}), TYPE "
                    f"({len(h['TYPE'])}) and COUNT ({len(counts)}) differ in length")
    try:
        sizes, counts = [int(s) for s in h["SIZE"]], [int(c) for c in counts]
        width = int(h["WIDTH"][0])
        height = int(h.get("HEIGHT", ["1"])[0])
        points = int(h["POINTS"][0]) if "POINTS" in h else width * height
    except (ValueError, IndexError):
        _fail(path, "PCD header: SIZE, COUNT, WIDTH, HEIGHT and POINTS must be integers")
    if points != width * height or points < 0:
        _fail(path, f"PCD header: POINTS {points} != WIDTH {width} x HEIGHT {height}")
    seen, fields = {}, []
    for n, s, t, c in zip(names, sizes, h["TYPE"], counts):
        code = _PCD_TYPES.get((t.upper(), s))
        if code is None or c < 1:
            _fail(path, f"PCD header: unsupported field '{n}' of TYPE {t} SIZE {s} COUNT {c}")
        if n in seen:  # PCL pads with repeated "_" fields
            seen[n] += 1
            n = f"{n}{seen[n]}"
        else:
            seen[n] = 0
        fields.append((n, "<" + code, c))
    data = h["DATA"][0].lower() if h["DATA"] else ""
    return fields, points, data


def _pcd_dtype(fields):
    return np.dtype([(n, c) if k == 1 else (n, c, (k,)) for n, c, k in fields])


def _ascii_data_lines(path, offset, fmt):
    """The non-blank lines of an ASCII body that starts `offset` bytes into the file."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("ascii")
    except UnicodeDecodeError:
        _fail(path, f"ASCII {fmt} data holds non-ASCII bytes")
    except OSError as e:
        _fail(path, f"cannot read: {e.strerror or e}")
    return [ln for ln in text.splitlines() if ln.strip()]


def _read_pcd(path):
    lines, offset = _read_header(path, b"", b"DATA")
    fields, points, data = _parse_pcd_header(path, lines)
    dtype = _pcd_dtype(fields)
    what = f"the {points} points of the header"
    if data == "ascii":
        body = _ascii_data_lines(path, offset, "PCD")
        if len(body) < points:
            _fail(path, f"truncated data: the header declares {points} points, the file holds {len(body)} lines")
        if len(body) > points:
            _fail(path, f"header/data size mismatch: the header declares {points} points, the file "
                        f"holds {len(body)} lines")
        ncols = sum(k for _, _, k in fields)
        vals = _parse_text_rows(path, body, ncols, what, len(lines) + 1)
        arr = np.empty(points, dtype=dtype)
        col = 0
        for n, _, k in fields:
            arr[n] = vals[:, col] if k == 1 else vals[:, col:col + k]
            col += k
        return _structured_to_cloud(path, arr, "the PCD fields")
    if data == "binary":
        have = _file_size(path) - offset
        _check_size(path, have, dtype.itemsize * points, what, exact=True)
        return _structured_to_cloud(path, _memmap_records(path, dtype, offset, points), "the PCD fields")
    if data == "binary_compressed":
        try:
            import lzf  # optional: the python-lzf package
        except ImportError:
            _fail(path, "unsupported: PCD DATA binary_compressed needs LZF decompression, which "
                        "needs the optional 'lzf' module (pip install python-lzf); or convert the "
                        "file to DATA binary (pcl_convert_pcd_ascii_binary <in> <out> 1)")
        with open(path, "rb") as f:
            f.seek(offset)
            blob = f.read()
        if len(blob) < 8:
            _fail(path, "truncated data: no compressed/uncompressed size words after the header")
        csize, usize = (int(v) for v in np.frombuffer(blob[:8], dtype="<u4"))
        if len(blob) - 8 < csize:
            _fail(path, f"truncated data: {csize} compressed bytes declared, {len(blob) - 8} present")
        if usize != dtype.itemsize * points:
            _fail(path, f"header/data size mismatch: {usize} uncompressed bytes declared, the "
                        f"fields need {dtype.itemsize * points}")
        try:
            raw = lzf.decompress(blob[8:8 + csize], usize) if usize else b""
        except Exception as e:
            _fail(path, f"corrupt LZF data ({e})")
        if raw is None or len(raw) != usize:
            _fail(path, f"corrupt LZF data: decompressed to {0 if raw is None else len(raw)} bytes, expected {usize}")
        # binary_compressed stores the fields one after another (all x, then all y, ...).
        arr = np.empty(points, dtype=dtype)
        pos = 0
        for n, c, k in fields:
            nbytes = np.dtype(c).itemsize * k * points
            col = np.frombuffer(raw, dtype=c, count=k * points, offset=pos)
            arr[n] = col if k == 1 else col.reshape(points, k)
            pos += nbytes
        return _structured_to_cloud(path, arr, "the PCD fields")
    _fail(path, f"unknown PCD DATA type {data!r} (expected ascii, binary or binary_compressed)")


# ---------------------------------------------------------------------------------------------
# LAS / LAZ

def _read_las(path):
    try:
        import laspy  # optional
    except ImportError:
        _fail(path, "unsupported: LAS/LAZ files need the optional 'laspy' package "
                    "(pip install 'laspy[lazrs]' for LAZ too)")
    try:
        las = laspy.read(path)
        xyz = np.stack([np.asarray(las.x), np.asarray(las.y), np.asarray(las.z)], 1).astype(np.float32)
        fields = {}
        for name in las.point_format.dimension_names:
            if name in ("X", "Y", "Z"):
                continue
            fields[name] = np.asarray(las[name])
    except OSError as e:
        _fail(path, f"cannot open: {e.strerror or e}")
    except Exception as e:  # laspy's own errors: bad signature, truncated points, no LAZ backend
        _fail(path, f"laspy cannot read it ({type(e).__name__}: {e})")
    return np.ascontiguousarray(xyz), fields


_READERS = {".npy": _read_npy, ".npz": _read_npz, ".ply": _read_ply, ".bin": _read_kitti_bin,
            ".pcd": _read_pcd, ".las": _read_las, ".laz": _read_las}


def read_cloud(path: Union[str, os.PathLike], *, nan: str = "keep") -> Cloud:
    """Reads one point cloud; the format follows the extension (see :data:`SUPPORTED_EXTENSIONS`).

    Args:
        path: the file.
        nan: what to do with points whose x, y or z is NaN or infinite: "keep" them, "drop"
            them (their fields too), or "raise" a :class:`CloudReadError` saying how many.

    Returns:
        a :class:`Cloud` with float32 ``xyz [N, 3]`` and the other per-point properties in
        ``fields``.

    Raises:
        CloudReadError: the file cannot be read whole (its message names the file and why).

    Example:
        >>> cloud = pcops.io.read_cloud("000000.bin")          # KITTI velodyne scan
        >>> cloud.xyz.shape, cloud.fields["intensity"].shape
        ((115384, 3), (115384,))
    """
    if nan not in ("keep", "drop", "raise"):
        raise ValueError(f"pcops.io.read_cloud: argument 'nan' must be 'keep', 'drop' or 'raise', got {nan!r}")
    path = os.fspath(path)
    if not os.path.exists(path):
        _fail(path, "no such file or folder")
    if os.path.isdir(path):
        _fail(path, "is a folder, not a file")
    ext = os.path.splitext(path)[1].lower()
    reader = _READERS.get(ext)
    if reader is None:
        _fail(path, f"unknown format '{ext or '(no extension)'}' (supported: {', '.join(SUPPORTED_EXTENSIONS)})")
    try:
        xyz, fields = reader(path)
    except CloudReadError:
        raise
    except MemoryError:
        raise
    except Exception as e:  # anything a reader did not foresee still names the file
        _fail(path, f"cannot read it ({type(e).__name__}: {e})")
    xyz, fields = _apply_nan_policy(path, xyz, fields, nan)
    return Cloud(path=path, xyz=xyz, fields=fields)


def find_clouds(inputs: Union[str, os.PathLike, Iterable[Union[str, os.PathLike]]],
                recursive: bool = True) -> List[str]:
    """The cloud files named by `inputs`, sorted and without duplicates.

    A folder contributes its files with a supported extension (case-insensitive), including
    those of its subfolders when `recursive`; a file named directly is always included (also
    with another extension or when missing, so that :func:`read_cloud` reports what is wrong
    with it).
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    found = set()
    for item in inputs:
        item = os.fspath(item)
        if os.path.isdir(item):
            if recursive:
                walk = ((d, fs) for d, _, fs in os.walk(item))
            else:
                walk = [(item, [f for f in os.listdir(item) if os.path.isfile(os.path.join(item, f))])]
            for d, files in walk:
                for f in files:
                    if os.path.splitext(f)[1].lower() in SUPPORTED_EXTENSIONS:
                        found.add(os.path.normpath(os.path.join(d, f)))
        else:
            found.add(os.path.normpath(item))
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# the preprocess cache

CACHE_FORMAT = "pcops-preprocess-cache"
MANIFEST = "manifest.json"
_SHARD_RE = re.compile(r"^shard_(\d+)_(\d+)\.npz$")
_CACHE_KEYS = ("centres", "idx", "lengths", "num_points", "shift", "scale", "sources", "settings")


@dataclass
class Cache:
    """What :func:`read_cache` returns (also readable as a mapping: ``cache["centres"]``).

    Attributes:
        centres: float32 ``[B, npoint, 3]`` FPS centres (normalised coordinates when the
            settings say ``normalize``); rows past ``lengths[b]`` are zeros.
        idx: int64 ``[B, npoint, nsample]`` neighbour indices into cloud b's points (as read,
            after dropping non-finite rows); -1 where there is none.
        lengths: int64 ``[B]``: valid centres per cloud (``min(npoint, num_points)``).
        num_points: int64 ``[B]``: points of each cloud.
        shift: float32 ``[B, 3]`` and scale: float32 ``[B]``: the normalisation,
            ``centres = (xyz - shift) / scale`` (zeros and ones without ``normalize``).
        sources: ``[B]`` str array: the absolute path each cloud was read from.
        settings: dict: the preprocess settings (npoint, nsample, method, radius, normalize, nan).
    """

    centres: np.ndarray
    idx: np.ndarray
    lengths: np.ndarray
    num_points: np.ndarray
    shift: np.ndarray
    scale: np.ndarray
    sources: np.ndarray
    settings: dict

    def __getitem__(self, key):
        if key not in _CACHE_KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def keys(self):
        return list(_CACHE_KEYS)

    def __len__(self) -> int:
        return int(self.lengths.shape[0])


def write_cache(path: str, arrays: Dict[str, np.ndarray], sources: Sequence[str], settings: dict) -> None:
    """Writes one cache file (.npz): `arrays` (centres, idx, lengths, num_points, shift, scale),
    the source paths and the settings (as a JSON string), atomically (a temporary file renamed
    into place, so an interrupted run never leaves half a file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays, sources=np.asarray(list(sources), dtype=np.str_),
                 settings=np.asarray(json.dumps(settings, sort_keys=True)))
    os.replace(tmp, path)


def _read_cache_file(path, *, sources_only=False):
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in _CACHE_KEYS if k not in z.files]
            if missing:
                _fail(path, f"not a pcops preprocess cache: no {', '.join(missing)}")
            settings = json.loads(str(z["settings"]))
            if sources_only:
                return {"sources": z["sources"], "settings": settings}
            out = {k: z[k] for k in _CACHE_KEYS if k != "settings"}
            out["settings"] = settings
    except CloudReadError:
        raise
    except OSError as e:
        _fail(path, f"cannot open: {e.strerror or e}")
    except Exception as e:
        _fail(path, f"not a readable cache file ({type(e).__name__}: {e})")
    B = out["lengths"].shape[0]
    for k in ("centres", "idx", "num_points", "sources"):
        if out[k].shape[0] != B:
            _fail(path, f"corrupt cache: '{k}' has {out[k].shape[0]} rows, 'lengths' has {B}")
    return out


def cache_shards(folder: str) -> List[str]:
    """The shard files of a cache folder, ordered by (rank, k)."""
    names = []
    for f in os.listdir(folder):
        m = _SHARD_RE.match(f)
        if m:
            names.append(((int(m.group(1)), int(m.group(2))), f))
    return [os.path.join(folder, f) for _, f in sorted(names)]


def read_cache(path: Union[str, os.PathLike], *, sources_only: bool = False) -> Cache:
    """Reads a preprocess cache written by ``python -m pcops.preprocess``: one .npz, or a folder
    of shards ``shard_<rank>_<k>.npz`` (+ manifest.json), concatenated in (rank, k) order.

    With ``sources_only`` only ``sources`` and ``settings`` are read (the other arrays are
    None): what a re-run needs to skip the inputs done.

    Raises:
        CloudReadError: a missing or unreadable file, shards with different settings.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        files = cache_shards(path)
        if not files:
            _fail(path, "no shard_<rank>_<k>.npz files in the cache folder")
    elif os.path.exists(path):
        files = [path]
    else:
        _fail(path, "no such cache file or folder")
    parts = [_read_cache_file(f, sources_only=sources_only) for f in files]
    settings = parts[0]["settings"]
    for f, p in zip(files, parts):
        if p["settings"] != settings:
            _fail(f, f"shard written with other settings ({p['settings']}) than {files[0]} ({settings})")
    if sources_only:
        return Cache(None, None, None, None, None, None, np.concatenate([p["sources"] for p in parts]), settings)
    cat = {k: np.concatenate([p[k] for p in parts]) for k in _CACHE_KEYS if k != "settings"}
    return Cache(settings=settings, **cat)
