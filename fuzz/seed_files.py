"""Writes the seed corpus of the `files` fuzz target (fuzz/corpus/files/): golden cases and the
hostile files of issue 15 in the target's input layout (u16 sidecar length, sidecar, npz)."""
import io, json, os, struct, sys, zipfile

here = os.path.dirname(os.path.abspath(__file__))
golden = os.path.join(here, "..", "tests", "data", "golden")
out = os.path.join(here, "corpus", "files")


def npy(header, data=b"", major=1):
    head = header.encode()
    size = struct.pack("<H", len(head)) if major == 1 else struct.pack("<I", len(head))
    return b"\x93NUMPY" + bytes([major, 0]) + size + head + data


def npz(members, method=zipfile.ZIP_STORED):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as z:
        for name, data in members:
            z.writestr(name + ".npy", data)
    return buf.getvalue()


def seed(name, sidecar, npz_bytes):
    text = sidecar.encode()
    with open(os.path.join(out, name), "wb") as f:
        f.write(struct.pack("<H", len(text)) + text + npz_bytes)


def f8(shape, n):
    return npy("{'descr': '<f8', 'fortran_order': False, 'shape': %s, }" % shape, b"\0" * 8 * n)


one = [("offset", f8("(1, 2, 1, 1)", 2)), ("weight", f8("(1, 1, 1, 1)", 1))]
for case in ["k1x1", "dil2_pad0_v1", "k3x5"]:
    with open(os.path.join(golden, case + ".npz"), "rb") as f:
        data = f.read()
    with open(os.path.join(golden, case + ".json")) as f:
        seed("golden_" + case, f.read(), data)
seed("valid_1x1", '{"padding": 0}', npz([("input", f8("(1, 1, 1, 1)", 1))] + one))
seed("d1_claims_64GiB", "{}", npz([("input", npy("{'descr': '<f8', 'fortran_order': False, 'shape': (8589934592,), }", b"\0" * 8))] + one))
seed("d1_v2_header_4GiB", "{}", npz([("input", b"\x93NUMPY\x02\x00\xff\xff\xff\xff")] + one))
seed("d2_overflowing_shape", "{}", npz([("input", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 9223372036854775808), }"))] + one))
seed("d3_nested_descr", "{}", npz([("input", npy("{'descr': " + "[('a', " * 20 + "'<f4'" + ")]" * 20 + ", 'fortran_order': False, 'shape': (1,), }", b"\0" * 4))] + one))
seed("compressed", "{}", npz([("input", f8("(1, 1, 1, 1)", 1))] + one, zipfile.ZIP_DEFLATED))
seed("duplicate_keys", '{"groups": 1, "groups": 2}', npz([("input", f8("(1, 1, 1, 1)", 1))] + one))
seed("fortran_big_endian", '{"convention": "mmcv", "padding": [0, 0, 0, 0]}', npz([("input", npy("{'descr': '>f8', 'fortran_order': True, 'shape': (1, 1, 1, 1), }", b"\0" * 8))] + one))
print("seeds in", out, file=sys.stderr)
