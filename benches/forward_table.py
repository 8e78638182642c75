"""Prints the forward bench table (medians, GFLOP/s, in-run ratios) from target/criterion:
python3 benches/forward_table.py [target/criterion]"""
import json, os, sys

root = sys.argv[1] if len(sys.argv) > 1 else 'target/criterion'
flops = {'W1': 2*64*16*8*9*144, 'W2': 2*16*512*512*9*49, 'W2s': 2*16*512*512*9*49,
         'W3-5x5': 2*32*64*30*25*4096, 'W3-3x3': 2*32*64*30*9*4096, 'W3-3x3d2': 2*32*64*30*9*4096,
         'W4': 2*2*256*256*9*4096}
order = ['W1', 'W2', 'W2s', 'W3-5x5', 'W3-3x3', 'W3-3x3d2', 'W4']
cols = ['deform', 'dense', 'gemm', 'gemm_mm']


def median_ms(wl, bench):
    f = os.path.join(root, wl, bench, 'new', 'estimates.json')
    return json.load(open(f))['median']['point_estimate'] / 1e6 if os.path.exists(f) else None


def fmt(v, spec='%.2f'):
    return '-' if v is None else spec % v


print('| workload | deform ms | dense ms | our GEMM alone ms | matrixmultiply ms | deform GFLOP/s | dense GFLOP/s | deform / dense | deform speed / GEMM speed |')
print('|---|---|---|---|---|---|---|---|---|')
for w in order:
    r = {c: median_ms(w, c) for c in cols}
    if all(v is None for v in r.values()):
        continue
    gf = lambda ms: None if ms is None else flops[w] / (ms / 1e3) / 1e9
    ratio = lambda a, b: None if a is None or b is None else a / b
    print('| %s | %s | %s | %s | %s | %s | %s | %s | %s |' % (
        w, fmt(r['deform']), fmt(r['dense']), fmt(r['gemm']), fmt(r['gemm_mm']),
        fmt(gf(r['deform']), '%.0f'), fmt(gf(r['dense']), '%.0f'),
        fmt(ratio(r['deform'], r['dense'])), fmt(ratio(r['gemm'], r['deform']))))
