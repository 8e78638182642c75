"""Prints the backward bench table (medians, 3x-forward GFLOP/s, in-run ratios) from target/criterion: python3 benches/backward_table.py"""
import json, os, sys
root = sys.argv[1] if len(sys.argv) > 1 else 'target/criterion'
flops = {'W1': 2*64*16*8*9*144, 'W2': 2*16*512*512*9*49, 'W2s': 2*16*512*512*9*49,
         'W3-5x5': 2*32*64*30*25*4096, 'W3-3x3': 2*32*64*30*9*4096, 'W3-3x3d2': 2*32*64*30*9*4096,
         'W4': 2*2*256*256*9*4096}
rows = {}
for wl in sorted(os.listdir(root)):
    if not wl.startswith('bwd_'): continue
    name = wl[4:]
    for b in sorted(os.listdir(os.path.join(root, wl))):
        f = os.path.join(root, wl, b, 'new', 'estimates.json')
        if os.path.exists(f):
            rows.setdefault(name, {})[b] = json.load(open(f))['median']['point_estimate'] / 1e6
order = ['W1', 'W2', 'W2s', 'W3-5x5', 'W3-3x3', 'W3-3x3d2', 'W4']
cols = ['grad_input', 'grad_offset', 'grad_mask', 'grad_weight', 'backward_full', 'forward', 'fwd+bwd', 'dense_fwd+bwd']
print('| workload | ' + ' | '.join(cols) + ' | fwd+bwd GFLOP/s (3x) | fwd+bwd / dense | bwd / fwd | input / full | weight / full |')
print('|' + '---|' * (len(cols) + 6))
for w in order:
    r = rows.get(w, {})
    if not r: continue
    cells = [('%.2f' % r[c]) if c in r else '-' for c in cols]
    g = ('%.0f' % (3 * flops[w] / (r['fwd+bwd'] / 1e3) / 1e9)) if 'fwd+bwd' in r else '-'
    rd = ('%.2f' % (r['fwd+bwd'] / r['dense_fwd+bwd'])) if 'fwd+bwd' in r else '-'
    bf = ('%.2f' % (r['backward_full'] / r['forward'])) if 'forward' in r else '-'
    ri = ('%.2f' % (r['grad_input'] / r['backward_full'])) if 'grad_input' in r else '-'
    rw = ('%.2f' % (r['grad_weight'] / r['backward_full'])) if 'grad_weight' in r else '-'
    print('| %s | %s | %s | %s | %s | %s | %s |' % (w, ' | '.join(cells), g, rd, bf, ri, rw))
