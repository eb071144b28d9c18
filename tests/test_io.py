"""pcops.io: every reader on small files written here (writers independent of the readers),
malformed files (each must raise CloudReadError naming the file and the problem), the NaN
policy, find_clouds, the preprocess cache, and the real scans."""
import glob
import os
import sys
import types

import numpy as np
import pytest

from pcops import io as pio


@pytest.fixture
def cloud(seed):
    """A random cloud with extra properties: xyz [N,3] float32 (some float64-exact values),
    intensity float32, normals float32, red uint8."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    xyz = (rng.standard_normal((n, 3)) * 10).astype(np.float32)
    return {
        "xyz": xyz,
        "intensity": rng.random(n).astype(np.float32),
        "normals": rng.standard_normal((n, 3)).astype(np.float32),
        "red": rng.integers(0, 256, n).astype(np.uint8),
    }


# ---------------------------------------------------------------------------------------------
# writers (written for these tests from the format descriptions)

def write_ply(path, c, fmt, *, faces=True, drop=None, count=None, extra=b""):
    n = c["xyz"].shape[0]
    props = [("x", "float", "f4"), ("y", "float", "f4"), ("z", "float", "f4"),
             ("intensity", "float", "f4"), ("nx", "float", "f4"), ("ny", "float", "f4"),
             ("nz", "float", "f4"), ("red", "uchar", "u1")]
    if drop:
        props = [p for p in props if p[0] not in drop]
    cols = {"x": c["xyz"][:, 0], "y": c["xyz"][:, 1], "z": c["xyz"][:, 2], "intensity": c["intensity"],
            "nx": c["normals"][:, 0], "ny": c["normals"][:, 1], "nz": c["normals"][:, 2], "red": c["red"]}
    tris = np.array([[0, 0, 0], [0, 0, 0]], dtype=np.int32)
    head = ["ply", f"format {fmt} 1.0", "comment written by test_io", f"element vertex {count if count is not None else n}"]
    head += [f"property {t} {name}" for name, t, _ in props]
    if faces:
        head += [f"element face {len(tris)}", "property list uchar int vertex_indices"]
    head.append("end_header")
    with open(path, "wb") as f:
        f.write(("\n".join(head) + "\n").encode())
        if fmt == "ascii":
            for i in range(n):
                f.write((" ".join(repr(float(cols[p][i])) if t != "uchar" else str(int(cols[p][i]))
                                  for p, t, _ in props) + "\n").encode())
            if faces:
                for t in tris:
                    f.write(("3 " + " ".join(map(str, t)) + "\n").encode())
        else:
            e = "<" if fmt == "binary_little_endian" else ">"
            rec = np.empty(n, dtype=[(p, e + code) for p, _, code in props])
            for p, _, _ in props:
                rec[p] = cols[p]
            f.write(rec.tobytes())
            if faces:
                for t in tris:
                    f.write(np.uint8(3).tobytes() + t.astype(e + "i4").tobytes())
        f.write(extra)


def write_pcd(path, c, data, *, points=None, compressed_raw=False):
    n = c["xyz"].shape[0]
    names = ["x", "y", "z", "intensity", "normal_x", "normal_y", "normal_z", "red"]
    cols = [c["xyz"][:, 0], c["xyz"][:, 1], c["xyz"][:, 2], c["intensity"], c["normals"][:, 0],
            c["normals"][:, 1], c["normals"][:, 2], c["red"]]
    head = ["# .PCD v0.7 - Point Cloud Data file format", "VERSION 0.7", "FIELDS " + " ".join(names),
            "SIZE 4 4 4 4 4 4 4 1", "TYPE F F F F F F F U", "COUNT 1 1 1 1 1 1 1 1",
            f"WIDTH {n}", "HEIGHT 1", "VIEWPOINT 0 0 0 1 0 0 0", f"POINTS {points if points is not None else n}",
            f"DATA {data}"]
    with open(path, "wb") as f:
        f.write(("\n".join(head) + "\n").encode())
        if data == "ascii":
            for i in range(n):
                f.write((" ".join(repr(float(col[i])) if col.dtype != np.uint8 else str(int(col[i]))
                                  for col in cols) + "\n").encode())
        elif data == "binary":
            rec = np.empty(n, dtype=[(nm, "<f4") for nm in names[:-1]] + [("red", "u1")])
            for nm, col in zip(names, cols):
                rec[nm] = col
            f.write(rec.tobytes())
        else:  # binary_compressed with a stand-in "compression" (see the fake lzf module below)
            raw = b"".join(col.astype("<f4" if col.dtype != np.uint8 else "u1").tobytes() for col in cols)
            f.write(np.array([len(raw), len(raw)], dtype="<u4").tobytes() + raw)


def check_cloud(got, c, *, names=("intensity", "nx", "ny", "nz", "red")):
    assert got.xyz.dtype == np.float32 and got.xyz.shape == c["xyz"].shape and got.xyz.flags.c_contiguous
    np.testing.assert_array_equal(got.xyz, c["xyz"])
    want = {"intensity": c["intensity"], "nx": c["normals"][:, 0], "ny": c["normals"][:, 1],
            "nz": c["normals"][:, 2], "red": c["red"], "normal_x": c["normals"][:, 0],
            "normal_y": c["normals"][:, 1], "normal_z": c["normals"][:, 2]}
    assert set(got.fields) == set(names), sorted(got.fields)
    for k in names:
        np.testing.assert_array_equal(got.fields[k], want[k], err_msg=k)
        assert got.fields[k].dtype == want[k].dtype, k


def expect_error(path, *words, **kw):
    with pytest.raises(pio.CloudReadError) as e:
        pio.read_cloud(path, **kw)
    msg = str(e.value)
    assert str(path) in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


# ---------------------------------------------------------------------------------------------
# good files

@pytest.mark.parametrize("fmt", ["ascii", "binary_little_endian", "binary_big_endian"])
@pytest.mark.parametrize("faces", [False, True])
def test_ply(tmp_path, cloud, fmt, faces):
    p = tmp_path / "c.ply"
    write_ply(p, cloud, fmt, faces=faces)
    check_cloud(pio.read_cloud(p), cloud)


def test_ply_binary_is_memory_mapped_and_copied_out(tmp_path, cloud):
    # The reader memory-maps; what it returns must not depend on the file after the call.
    p = tmp_path / "c.ply"
    write_ply(p, cloud, "binary_little_endian", faces=False)
    got = pio.read_cloud(p)
    os.remove(p)
    check_cloud(got, cloud)
    assert got.xyz.flags.writeable and all(v.flags.writeable for v in got.fields.values())


@pytest.mark.parametrize("data", ["ascii", "binary"])
def test_pcd(tmp_path, cloud, data):
    p = tmp_path / "c.pcd"
    write_pcd(p, cloud, data)
    check_cloud(pio.read_cloud(p), cloud, names=("intensity", "normal_x", "normal_y", "normal_z", "red"))


def test_pcd_binary_compressed_without_lzf_is_a_clear_error(tmp_path, cloud, monkeypatch):
    monkeypatch.setitem(sys.modules, "lzf", None)  # import lzf -> ImportError
    p = tmp_path / "c.pcd"
    write_pcd(p, cloud, "binary_compressed")
    expect_error(p, "unsupported", "binary_compressed", "python-lzf")


def test_pcd_binary_compressed_layout(tmp_path, cloud, monkeypatch):
    # A stand-in lzf whose "compressed" data is the raw bytes: checks the column-major layout.
    fake = types.ModuleType("lzf")
    fake.decompress = lambda data, size: bytes(data[:size])
    monkeypatch.setitem(sys.modules, "lzf", fake)
    p = tmp_path / "c.pcd"
    write_pcd(p, cloud, "binary_compressed")
    check_cloud(pio.read_cloud(p), cloud, names=("intensity", "normal_x", "normal_y", "normal_z", "red"))


def test_kitti_bin(tmp_path, cloud):
    p = tmp_path / "000000.bin"
    np.concatenate([cloud["xyz"], cloud["intensity"][:, None]], 1).astype("<f4").tofile(p)
    check_cloud(pio.read_cloud(p), cloud, names=("intensity",))


def test_npy_plain_and_with_features(tmp_path, cloud):
    p = tmp_path / "a.npy"
    np.save(p, cloud["xyz"].astype(np.float64))
    got = pio.read_cloud(p)
    np.testing.assert_array_equal(got.xyz, cloud["xyz"])
    assert got.fields == {}
    q = tmp_path / "b.NPY"  # extensions are case-insensitive
    with open(q, "wb") as f:  # np.save would append ".npy" to this name
        np.save(f, np.concatenate([cloud["xyz"], cloud["normals"]], 1))
    got = pio.read_cloud(q)
    np.testing.assert_array_equal(got.xyz, cloud["xyz"])
    np.testing.assert_array_equal(got.fields["features"], cloud["normals"])


def test_npy_structured(tmp_path, cloud):
    n = cloud["xyz"].shape[0]
    rec = np.empty(n, dtype=[("x", ">f8"), ("y", ">f8"), ("z", ">f8"), ("intensity", "<f4")])
    for j, c in enumerate("xyz"):
        rec[c] = cloud["xyz"][:, j]
    rec["intensity"] = cloud["intensity"]
    p = tmp_path / "s.npy"
    np.save(p, rec)
    got = pio.read_cloud(p)
    np.testing.assert_array_equal(got.xyz, cloud["xyz"])
    np.testing.assert_array_equal(got.fields["intensity"], cloud["intensity"])


def test_npz(tmp_path, cloud):
    p = tmp_path / "a.npz"
    np.savez(p, points=cloud["xyz"], intensity=cloud["intensity"], label=np.int64(3))
    got = pio.read_cloud(p)
    np.testing.assert_array_equal(got.xyz, cloud["xyz"])
    assert set(got.fields) == {"intensity"}  # the scalar label has no N rows
    q = tmp_path / "only.npz"
    np.savez(q, cloud["xyz"])
    np.testing.assert_array_equal(pio.read_cloud(q).xyz, cloud["xyz"])


def test_las(tmp_path, cloud):
    laspy = pytest.importorskip("laspy")
    header = laspy.LasHeader(point_format=3, version="1.2")
    header.scales = np.array([1e-3, 1e-3, 1e-3])
    las = laspy.LasData(header)
    xyz = np.round(cloud["xyz"].astype(np.float64), 3)
    las.x, las.y, las.z = xyz[:, 0], xyz[:, 1], xyz[:, 2]
    las.intensity = (cloud["intensity"] * 1000).astype(np.uint16)
    p = tmp_path / "c.las"
    las.write(p)
    got = pio.read_cloud(p)
    np.testing.assert_allclose(got.xyz, xyz.astype(np.float32), atol=1e-3)
    np.testing.assert_array_equal(got.fields["intensity"], (cloud["intensity"] * 1000).astype(np.uint16))
    p.write_bytes(p.read_bytes()[:-7])  # truncated
    expect_error(p)


def test_las_without_laspy_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "laspy", None)
    p = tmp_path / "c.laz"
    p.write_bytes(b"LASF" + bytes(300))
    expect_error(p, "laspy")


def test_ply_vertex_after_another_element(tmp_path, cloud):
    # A fixed-size element before the vertices (binary): skipped by its size; ASCII: by its lines.
    n = cloud["xyz"].shape[0]
    for fmt in ("binary_little_endian", "ascii"):
        p = tmp_path / f"cam_{fmt}.ply"
        head = (f"ply\nformat {fmt} 1.0\nelement camera 2\nproperty double view\nproperty uchar id\n"
                f"element vertex {n}\nproperty float x\nproperty float y\nproperty float z\nend_header\n")
        with open(p, "wb") as f:
            f.write(head.encode())
            if fmt == "ascii":
                f.write(b"1.5 1\n2.5 2\n")
                f.write("".join(" ".join(repr(float(v)) for v in r) + "\n" for r in cloud["xyz"]).encode())
            else:
                cam = np.array([(1.5, 1), (2.5, 2)], dtype=[("view", "<f8"), ("id", "u1")])
                f.write(cam.tobytes() + cloud["xyz"].astype("<f4").tobytes())
        got = pio.read_cloud(p)
        np.testing.assert_array_equal(got.xyz, cloud["xyz"])
        assert got.fields == {}


def test_empty_cloud_is_read_whole(tmp_path):
    p = tmp_path / "e.ply"
    p.write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 0\nproperty float x\n"
                  b"property float y\nproperty float z\nend_header\n")
    assert pio.read_cloud(p).xyz.shape == (0, 3)


# ---------------------------------------------------------------------------------------------
# the NaN policy

@pytest.mark.parametrize("ext", [".ply", ".npy", ".bin", ".pcd"])
def test_nan_policy(tmp_path, cloud, ext):
    if cloud["xyz"].shape[0] < 3:
        cloud = {k: np.concatenate([v, v, v]) for k, v in cloud.items()}
    cloud["xyz"][1, 2] = np.nan
    cloud["xyz"][-1, 0] = np.inf
    p = tmp_path / f"c{ext}"
    if ext == ".ply":
        write_ply(p, cloud, "binary_little_endian")
    elif ext == ".pcd":
        write_pcd(p, cloud, "ascii")
    elif ext == ".bin":
        np.concatenate([cloud["xyz"], cloud["intensity"][:, None]], 1).astype("<f4").tofile(p)
    else:
        np.save(p, np.concatenate([cloud["xyz"], cloud["intensity"][:, None]], 1))
    kept = pio.read_cloud(p)  # default: keep
    assert kept.xyz.shape[0] == cloud["xyz"].shape[0]
    np.testing.assert_array_equal(kept.xyz, cloud["xyz"])
    dropped = pio.read_cloud(p, nan="drop")
    keep = np.isfinite(cloud["xyz"]).all(1)
    np.testing.assert_array_equal(dropped.xyz, cloud["xyz"][keep])
    for k, v in dropped.fields.items():
        np.testing.assert_array_equal(v, kept.fields[k][keep], err_msg=k)
    expect_error(p, "2 of", "non-finite", "row 1", nan="raise")
    with pytest.raises(ValueError, match="nan"):
        pio.read_cloud(p, nan="zero")


# ---------------------------------------------------------------------------------------------
# bad files: a CloudReadError naming the file and the problem, never a partial cloud

def test_ply_truncated_binary(tmp_path, cloud):
    p = tmp_path / "t.ply"
    write_ply(p, cloud, "binary_little_endian", faces=False)
    p.write_bytes(p.read_bytes()[:-1])
    expect_error(p, "truncated", "1 missing")


def test_ply_declares_more_vertices_than_the_data(tmp_path, cloud):
    p = tmp_path / "t.ply"
    write_ply(p, cloud, "binary_big_endian", faces=False, count=cloud["xyz"].shape[0] + 1)
    expect_error(p, "truncated")
    q = tmp_path / "t2.ply"
    write_ply(q, cloud, "ascii", faces=False, count=cloud["xyz"].shape[0] + 1)
    expect_error(q, "truncated")


def test_ply_extra_bytes(tmp_path, cloud):
    p = tmp_path / "x.ply"
    write_ply(p, cloud, "binary_little_endian", faces=False, extra=b"\0" * 5)
    expect_error(p, "size mismatch", "5 extra")
    q = tmp_path / "x2.ply"
    write_ply(q, cloud, "ascii", faces=False, extra=b"1 2 3 4 5 6 7 8\n")
    expect_error(q, "size mismatch")


def test_ply_no_xyz(tmp_path, cloud):
    p = tmp_path / "n.ply"
    write_ply(p, cloud, "binary_little_endian", drop=("z",))
    expect_error(p, "no", "z")


def test_ply_ascii_bad_rows(tmp_path, cloud):
    p = tmp_path / "r.ply"
    write_ply(p, cloud, "ascii", faces=False)
    lines = p.read_bytes().split(b"\n")
    head = lines.index(b"end_header") + 1
    lines[head] = lines[head].rsplit(b" ", 1)[0]  # one value missing
    p.write_bytes(b"\n".join(lines))
    expect_error(p, "has 7 values, expected 8")
    lines[head] = b"1 2 3 4 5 6 7 seven"
    p.write_bytes(b"\n".join(lines))
    expect_error(p, "not a number")


@pytest.mark.parametrize("header,words", [
    (b"ply\nformat binary_middle_endian 1.0\nelement vertex 1\nproperty float x\nend_header\n", ["format"]),
    (b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float128 x\nend_header\n", ["float128"]),
    (b"ply\nformat ascii 1.0\nelement vertex one\nend_header\n", ["element"]),
    (b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\n", ["end_header"]),
    (b"ply\nelement vertex 1\nproperty float x\nend_header\n", ["format"]),
    (b"ply\nformat ascii 1.0\nelement face 1\nproperty list uchar int vertex_indices\nend_header\n3 0 0 0\n",
     ["no 'vertex'"]),
    (b"pcd\n", ["not a PLY"]),
    (b"", ["not a PLY"]),
])
def test_ply_bad_headers(tmp_path, header, words):
    p = tmp_path / "h.ply"
    p.write_bytes(header)
    expect_error(p, *words)


def test_bin_size_not_a_multiple_of_16(tmp_path, cloud):
    p = tmp_path / "t.bin"
    np.concatenate([cloud["xyz"], cloud["intensity"][:, None]], 1).astype("<f4").tofile(p)
    p.write_bytes(p.read_bytes()[:-4])
    expect_error(p, "multiple of 16")


def test_npy_bad(tmp_path, cloud):
    p = tmp_path / "t.npy"
    np.save(p, cloud["xyz"])
    p.write_bytes(p.read_bytes()[:-4])
    expect_error(p, ".npy")
    q = tmp_path / "2d.npy"
    np.save(q, np.zeros((5, 2)))
    expect_error(q, "shape (5, 2)")
    r = tmp_path / "obj.npy"
    np.save(r, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    expect_error(r, ".npy")
    s = tmp_path / "txt.npy"
    s.write_bytes(b"hello")
    expect_error(s, ".npy")


def test_npz_bad(tmp_path, cloud):
    p = tmp_path / "k.npz"
    np.savez(p, a=cloud["xyz"], b=cloud["xyz"])
    expect_error(p, "no coordinate array", "a, b")
    q = tmp_path / "z.npz"
    np.savez(q, xyz=cloud["xyz"])
    q.write_bytes(q.read_bytes()[:-30])
    expect_error(q, ".npz")


def test_pcd_bad(tmp_path, cloud):
    n = cloud["xyz"].shape[0]
    p = tmp_path / "p.pcd"
    write_pcd(p, cloud, "binary", points=n + 1)
    expect_error(p, "POINTS")
    write_pcd(p, cloud, "binary")
    p.write_bytes(p.read_bytes()[:-3])
    expect_error(p, "truncated")
    write_pcd(p, cloud, "binary")
    p.write_bytes(p.read_bytes() + b"\0")
    expect_error(p, "size mismatch")
    write_pcd(p, cloud, "ascii")
    p.write_bytes(p.read_bytes().rsplit(b"\n", 2)[0] + b"\n")  # last line gone
    expect_error(p, "truncated")
    text = p.read_bytes().replace(b"DATA ascii", b"DATA zipped")
    p.write_bytes(text)
    expect_error(p, "DATA", "zipped")
    p.write_bytes(b"VERSION 0.7\nFIELDS a b c\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\nWIDTH 1\nHEIGHT 1\n"
                  b"POINTS 1\nDATA ascii\n1 2 3\n")
    expect_error(p, "no x/y/z")
    p.write_bytes(b"VERSION 0.7\nFIELDS x y z\nSIZE 4 4\nTYPE F F F\nWIDTH 1\nPOINTS 1\nDATA ascii\n1 2 3\n")
    expect_error(p, "differ in length")


def test_unknown_missing_and_folder(tmp_path):
    p = tmp_path / "c.xyz"
    p.write_text("1 2 3\n")
    expect_error(p, "unknown format '.xyz'", ".ply")
    expect_error(tmp_path / "none.ply", "no such file")
    expect_error(tmp_path / "typo_folder", "no such file")
    d = tmp_path / "dir.ply"
    d.mkdir()
    expect_error(d, "folder")


# ---------------------------------------------------------------------------------------------
# find_clouds

def test_find_clouds(tmp_path):
    for name in ["b.ply", "a.NPY", "sub/c.bin", "sub/deeper/d.pcd", "notes.txt", "sub/e.las"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    got = pio.find_clouds([tmp_path])
    rel = [os.path.relpath(f, tmp_path) for f in got]
    assert rel == sorted(rel) == ["a.NPY", "b.ply", "sub/c.bin", "sub/deeper/d.pcd", "sub/e.las"]
    top = [os.path.relpath(f, tmp_path) for f in pio.find_clouds(str(tmp_path), recursive=False)]
    assert top == ["a.NPY", "b.ply"]
    # a file named directly is kept (the reader reports what is wrong), duplicates once
    both = pio.find_clouds([tmp_path / "notes.txt", tmp_path / "b.ply", str(tmp_path / "b.ply")])
    assert [os.path.basename(f) for f in both] == ["b.ply", "notes.txt"]
    assert set(pio.SUPPORTED_EXTENSIONS) >= {".npy", ".npz", ".ply", ".bin", ".pcd", ".las", ".laz"}


# ---------------------------------------------------------------------------------------------
# the preprocess cache

def _cache_arrays(rng, B, npoint=4, nsample=2):
    return {"centres": rng.random((B, npoint, 3)).astype(np.float32),
            "idx": rng.integers(-1, 9, (B, npoint, nsample)), "lengths": rng.integers(0, npoint + 1, B),
            "num_points": rng.integers(1, 99, B), "shift": np.zeros((B, 3), np.float32),
            "scale": np.ones(B, np.float32)}


def test_cache_file_and_shards(tmp_path, seed):
    rng = np.random.default_rng(seed)
    settings = {"npoint": 4, "nsample": 2, "method": "knn"}
    a, b, c = _cache_arrays(rng, 3), _cache_arrays(rng, 2), _cache_arrays(rng, 1)
    pio.write_cache(str(tmp_path / "one.npz"), a, ["p0", "p1", "p2"], settings)
    got = pio.read_cache(tmp_path / "one.npz")
    assert got.settings == settings and list(got.sources) == ["p0", "p1", "p2"] and len(got) == 3
    for k, v in a.items():
        np.testing.assert_array_equal(got[k], v)
    d = tmp_path / "shards"
    d.mkdir()
    # written out of order; read in (rank, k) order, k compared as a number
    pio.write_cache(str(d / "shard_1_0.npz"), c, ["r1"], settings)
    pio.write_cache(str(d / "shard_0_10.npz"), b, ["r0k10a", "r0k10b"], settings)
    pio.write_cache(str(d / "shard_0_2.npz"), a, ["a", "b", "c"], settings)
    got = pio.read_cache(d)
    assert list(got.sources) == ["a", "b", "c", "r0k10a", "r0k10b", "r1"]
    np.testing.assert_array_equal(got.idx, np.concatenate([a["idx"], b["idx"], c["idx"]]))
    assert list(pio.read_cache(d, sources_only=True).sources) == list(got.sources)
    pio.write_cache(str(d / "shard_2_0.npz"), c, ["x"], {"npoint": 8})
    with pytest.raises(pio.CloudReadError, match="other settings"):
        pio.read_cache(d)
    with pytest.raises(pio.CloudReadError, match="no such"):
        pio.read_cache(tmp_path / "none.npz")
    np.savez(tmp_path / "foreign.npz", x=np.zeros(3))
    with pytest.raises(pio.CloudReadError, match="not a pcops preprocess cache"):
        pio.read_cache(tmp_path / "foreign.npz")


# ---------------------------------------------------------------------------------------------
# the real scans

_HERE = os.path.dirname(os.path.abspath(__file__))
SCAN_DIRS = [os.path.join(_HERE, "..", ".data", "scans"), os.path.join(_HERE, "..", "..", "shared", "data", "scans"),
             "/work/shared/data/scans"]


def real_scans():
    for d in SCAN_DIRS:
        files = sorted(glob.glob(os.path.join(d, "*.npy")))
        if files:
            return files
    return []


def test_real_scans_every_format(tmp_path):
    files = real_scans()
    if not files:
        pytest.skip("no real scans in .data/scans or ../shared/data/scans")
    for f in files:
        xyz = np.load(f)
        got = pio.read_cloud(f, nan="raise")
        np.testing.assert_array_equal(got.xyz, xyz.astype(np.float32))
        c = {"xyz": xyz.astype(np.float32), "intensity": np.linspace(0, 1, len(xyz), dtype=np.float32),
             "normals": np.zeros((len(xyz), 3), np.float32), "red": np.zeros(len(xyz), np.uint8)}
        write_ply(tmp_path / "s.ply", c, "binary_little_endian")
        check_cloud(pio.read_cloud(tmp_path / "s.ply"), c)
        write_pcd(tmp_path / "s.pcd", c, "binary")
        check_cloud(pio.read_cloud(tmp_path / "s.pcd"), c,
                    names=("intensity", "normal_x", "normal_y", "normal_z", "red"))
        np.concatenate([c["xyz"], c["intensity"][:, None]], 1).astype("<f4").tofile(tmp_path / "s.bin")
        check_cloud(pio.read_cloud(tmp_path / "s.bin"), c, names=("intensity",))
