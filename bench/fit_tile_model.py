#!/usr/bin/env python3
"""fit_tile_model.py - fit the planner's cost model of fp4moe's own GEMM tiles
(src/kernels/cost_fp4moe.c) to the per-tile timings of a full GPU run, and write
its parameters as C (src/kernels/fp4moe_cost_h200.inc).

    python3 bench/fit_tile_model.py [--csv bench/h200_fp4moe_tiles.csv [--csv MORE.csv ...]]
                                    [--out src/kernels/fp4moe_cost_h200.inc] [--cv]
    python3 bench/fit_tile_model.py --eval src/kernels/fp4moe_cost_h200.inc [--csv ...] [--miss 0.03]

Several --csv: one fit over all their timings (e.g. GLM-5's NVFP4 shapes on the H200 and
gpt-oss-120b's MXFP4 shapes, `bench_gemm --model gpt-oss-120b`, on an H100). Each timing is
modelled as the C model prices its GPU and format: the bandwidth scaled by the GPU's memory
rate over the H200's (cost_fp4moe.c FM_H200_GBS; the gpu column: h200, h100), the scale
bytes 1/16 of the FP4 bytes for NVFP4 and 1/32 for MXFP4 (the OSS shapes). The regret is
reported per CSV too, so that a fit which helps one model's shapes at another's cost shows.

The model (the C file says the same, and must compute the same): for a tile of
`warps` W, bands per warp MT, 8*NT tokens a pass, KC of K per stage, at rows m
per expert of E experts, [N x K] weights,
  CTAs per SM O   as the CUDA occupancy calculator counts them: shared memory
                  (the SM's 228 KB), registers (src/kernels/fp4moe_regs_sm90.inc,
                  bench/regs_table.py), threads, block slots;
  per stage       ps = max(bytes x O x SMs / bw, instructions x O / issue rate,
                       tensor FLOPs x O / tensor rate)   (the SM's O CTAs share
                  the chip's bandwidth and the SM's issue slots / tensor cores)
  per CTA         fixed latency + passes x pipeline fill + stages x ps + the
                  output tile's bytes (the mma.sync CTA loops over its expert's
                  passes and, multi-block, over nb feature blocks; a wgmma CTA
                  is one pass of one block)
  time            max(1, CTAs / (SMs x O)) x per-CTA time + launch
                  (the persistent wgmma kernel, one CTA per SM over all tiles: the
                  fixed latency once, then per tile l0pp + pov x (token rows + output)
                  + pps x stages; wgmma tiles pay lmt per m64 tile past the first)
and a per-tile efficiency factor (the median of measured / modelled over the
tile's timings): what the few global parameters cannot see (spills, the
instruction mix of one instantiation). The global parameters are fitted by
random search on the mean |log(model / measured)| plus the mean regret of the
model's pick over the launcher's candidate sets (the ranking is what the
launcher uses), alternating with the per-tile factors. --cv also fits on three shapes and reports the regret of the
model's pick on the fourth (how it generalises to a shape it has not seen).
--eval INC fits nothing: it reads the parameters and per-tile factors of INC (a .inc as
this script writes it), prints the same report over the --csv timings (the mean
|log(model / measured)| and the regret per candidate set, per CSV) and one line per point
whose regret is over --miss (3 %): the model's pick and the fastest tile, with their times.
A timed tile with no factor in INC is priced with factor 1.0, as cost_fp4moe.c's
efficiency() does for a kernel not in its table.
Regret = time of the tile the model ranks first / time of the fastest measured
tile at that point - 1, over the candidates the launcher chooses among:
natural X (mma tiles, with and without multi-block, and the natural-X wgmma
kernel) and packed X (the packed-X wgmma kernel)."""
import argparse, collections, csv, math, random, re, sys, datetime

# compiled multi-block mma tiles (gemm_mma.cuh FM_MMA_ENTRY_MB rows)
MB = {(8,1,1,64,4),(4,1,1,128,8),(4,1,1,128,4),(4,2,1,128,8),(4,1,1,256,3),(4,2,1,256,3),(4,2,1,128,4),(4,4,1,128,3)}
SMS, SMEM_SM, RES, REGS = 132, 228*1024, 1024, 65536     # the H200 (sm_90): fm_arch / fm_gpu tables
CLK_ISSUE = 4 * 1.9e9      # warp instructions per second per SM: 4 schedulers x ~1.9 GHz (H200 boost ~1.98)

def smem_sw(W,MT,NT,KC,S): return S*(W*MT*(KC//64)*576 + 8*NT*(2*KC+16))      # fm_smem_mma
def smem_wg(W,MT,NT,KC,S,persist=False):                                       # fm_smem_wgmma
    raw = W*MT*(KC//64)*576 + 16*NT*KC
    return S*((raw+1023)//1024*1024 + 16) + (8*NT*(32*W*MT + 16) if persist else 0)
def minb(W,MT,NT,KC,S):                      # gemm_mma.cuh mma_min_blocks (launch bounds)
    sm = smem_sw(W,MT,NT,KC,S) + 1024
    b = 1 if NT > 2 else 225*1024//sm
    b = min(b, 65536//(W*32*64))
    return max(1, min(8, b))
def auto_nb(t, N, K, E, sms=SMS):            # gemm_launch.c feature_blocks(), automatic
    if t not in MB or K > 512: return 1
    W,MT = t[0],t[1]
    c = ((N//16 + W*MT - 1)//(W*MT)) * E / (16.0*sms)
    return 8 if c >= 8 else (int(c) if c >= 2 else 1)
# the C enum fm_kernel_variant (include/fp4moe/kernels.h) <-> (family, flag) here: mma flag 1 = the
# multi-block kernel; wgmma flag 1 = packed X (warp-specialized), 2 = its persistent form
VARIANT = {('mma', 0): 'FM_VARIANT_MMA', ('mma', 1): 'FM_VARIANT_MMA_MULTI_BLOCK', ('wgmma', 0): 'FM_VARIANT_WGMMA_NATURAL_X',
           ('wgmma', 1): 'FM_VARIANT_WGMMA_PACKED_X', ('wgmma', 2): 'FM_VARIANT_WGMMA_PERSISTENT'}
FLAG = {v: k[1] for k, v in VARIANT.items()}
def load_regs(path='src/kernels/fp4moe_regs_sm90.inc'):   # bench/regs_table.py's ptxas counts
    r = {}
    for line in open(path):
        m = re.match(r'\s*\{FM_FAMILY_FP4MOE_(MMA|WGMMA), (\d+), (\d+), (\d+), (\d+), (\d+), (FM_VARIANT_\w+), (\d+)\},', line)
        if m:
            r[('mma' if m.group(1) == 'MMA' else 'wgmma', tuple(int(m.group(i)) for i in range(2, 7)), FLAG[m.group(7)])] = int(m.group(8))
    return r
REGTAB = {}
def occupancy(fam, t, flag):     # cost_fp4moe.c fm_fp4moe_occupancy (wgmma flag 2: the persistent kernel)
    W,MT,NT,KC,S = t
    warps = W + 4 if fam == 'wgmma' and flag else W
    o = SMEM_SM // ((smem_sw(*t) if fam == 'mma' else smem_wg(*t, flag == 2)) + RES)
    o = min(o, 2048//(warps*32), 32)
    regs = REGTAB.get((fam, t, int(flag)), 0)
    if regs:
        o = min(o, REGS // ((regs*32 + 255)//256*256) // warps)
    elif fam == 'mma':
        o = min(o, minb(*t) if NT <= 2 else REGS//(240*W*32))
    else:
        o = min(o, 1)
    return max(1, o)
def model(fam, t, nb, packed, E, N, K, m, P, sf=1/16, persist=False, bwr=1.0):
    W,MT,NT,KC,S = t
    bw = P['bw']*bwr   # the GPU's memory rate over the H200's (cost_fp4moe.c)
    TOK = 8*NT; passes = -(-m//TOK); F = 16*W*MT
    B = -(-N//F); nks = -(-K//KC)
    wst = F*KC*(0.5 + sf); xst = (m/passes)*KC*2   # X bytes a stage: the pass's valid rows (the rest is not read)
    O = occupancy(fam, t, nb > 1 if fam == 'mma' else (2 if persist else packed))
    if fam == 'mma':
        ctas = E * -(-B//nb)
        iss = W*(MT*(KC//64)*(4*P['dec'] + 4*NT*P['mma']) + (KC//64)*2*NT + P['stg'])
        tc = W*MT*(KC//64)*4*NT*4096*2 / P['rmma']
    else:
        ctas = E*B*passes
        iss = W*(MT*(KC//64)*(4*P['dec'] + 4*P['wgi']) + P['stg'])
        if not packed: iss += TOK*KC*2/16/32 * P['natx'] * 4
        tc = F*TOK*KC*2 / P['rwg']
    ps = max((wst+xst)*O*SMS/bw, iss*O/(CLK_ISSUE*P['u']), tc*O)
    if fam != 'mma' and not packed:  # natural X through registers, one stage ahead: latency per 16-byte load a thread
        ps = max(ps, P['xlat'] * xst / (W*32*16))
    out = P['epi']*TOK*F*2*O*SMS/bw
    if fam == 'mma':
        t_cta = (P['l0mb'] if nb > 1 else P['l0']) + passes*P['fill'] + \
                nb*passes*(1 + (P['mbp'] if nb > 1 and passes > 1 else 0))*(nks*ps + out)
    else:
        t_cta = (P['l0p'] if packed else P['l0w']) + P['ltok']*TOK*MT + P['lmt']*(MT - 1) + nks*ps + out
    if persist:   # one CTA per SM over all tiles: the fixed latency once, then per tile its own
                  # latency l0pp, the epilogue (token rows, output bytes) scaled by pov (the next
                  # tile's stages load under it) and the stages scaled by pps (its main loop is
                  # measured slower at long K: static tile assignment, the suspect)
        t_tile = P['l0pp'] + P['pov']*(P['ltok']*TOK*MT + out) + P['lmt']*(MT - 1) + P['pps']*nks*ps
        return (P['l0p'] + max(1.0, ctas/(SMS*O))*t_tile)*1e6 + P['launch']
    return max(1.0, ctas/(SMS*O))*t_cta*1e6 + P['launch']

def key(fam, t, nb, packed, persist=False):
    return (fam, t, 2 if persist else (nb > 1 if fam == 'mma' else packed))

# memory GB/s of the GPUs a CSV may come from: src/arch/gpu_table.c (the C model scales the H200's
# fitted bandwidth by mem_gbs / FM_H200_GBS; both have 132 SMs and the same BF16 rate)
GPU_GBS = {'h200': 4800.0, 'h100': 3350.0}   # h100: the SXM card (gpu_table's alias), 132 SMs like the H200
                                             # (SMS below); a PCIe H100 (114 SMs) would need SMS per GPU too
# gpt-oss-120b's shapes (bench/tiles_to_csv.py SHAPES) are MXFP4: a UE8M0 scale byte per 32 weights
def scale_frac(shape): return 1/32 if shape.startswith('OSS') else 1/16

def load(path):
    rows = [r for r in csv.reader(l for l in open(path) if not l.startswith('#'))]
    D = [dict(zip(rows[0], r)) for r in rows[1:]]
    for d in D:
        if d['gpu'] not in GPU_GBS: sys.exit('%s: gpu %r: not in GPU_GBS %s' % (path, d['gpu'], sorted(GPU_GBS)))
        d['bwr'] = GPU_GBS[d['gpu']] / GPU_GBS['h200']; d['sf'] = scale_frac(d['shape']); d['src'] = path
        for k in ('experts','n','k','rows_per_expert','warps','mt','nt','kc','stages'): d[k] = int(d[k])
        d['us'] = float(d['us'])
        d['fam'] = d['family']; d['t'] = (d['warps'],d['mt'],d['nt'],d['kc'],d['stages'])
        d['persist'] = d['variant'] == 'persistent'
        d['packed'] = d['variant'] in ('packed_x', 'persistent')
        nb = 1
        if d['fam'] == 'mma':
            if d['variant'] == 'auto': nb = auto_nb(d['t'], d['n'], d['k'], d['experts'])
            elif d['variant'].startswith('feature_blocks_'): nb = int(d['variant'].split('_')[-1])
        d['nb'] = nb; d['key'] = key(d['fam'], d['t'], nb, d['packed'], d['persist'])
    return D

P0 = dict(bw=4.3e12, dec=13, mma=1.0, stg=65, u=0.6, rmma=4.6e12, l0=7e-7, l0mb=7e-6, mbp=0.1, fill=3e-7,
          epi=1.5, launch=3.0, wgi=2, natx=2, rwg=3.8e12, l0w=4e-6, l0p=1e-5, ltok=2e-8, xlat=1e-7,
          l0pp=1e-6, pov=0.5, pps=1.1, lmt=1e-6)
FIXED = ('u',)   # issue efficiency: collinear with dec/stg, kept

def pred(d, P): return model(d['fam'], d['t'], d['nb'], d['packed'], d['experts'], d['n'], d['k'], d['rows_per_expert'], P,
                             sf=d['sf'], persist=d['persist'], bwr=d['bwr'])

def candidate_sets(D):
    """The launcher's choices per point: natural X (mma with and without multi-block,
    natural-X wgmma) and packed X (packed-X wgmma), as lists of indices into D."""
    pts = collections.defaultdict(lambda: ([], []))
    for i, d in enumerate(D):
        k = (d['gpu'], d['shape'], d['rows_per_expert'])
        if (d['fam'] == 'mma' and d['variant'] in ('auto', 'feature_blocks_1')) or d['variant'] == 'natural_x':
            pts[k][0].append(i)
        elif d['packed']: pts[k][1].append(i)
    return [c for a, b in pts.values() for c in (a, b) if c]

RANK_W = 1.0   # weight of the mean regret of the pick in the fit's objective

def fit(D, iters=1500, rounds=5, seed=1):
    """Objective: mean |log(model / measured)| + RANK_W x mean regret of the model's
    pick over the launcher's candidate sets (the ranking is what the launcher uses)."""
    rnd = random.Random(seed)
    P = dict(P0); eff = {}
    sets = candidate_sets(D)
    def loss(P):
        pr = [pred(d, P)*eff.get(d['key'], 1.0) for d in D]
        err = sum(abs(math.log(p/d['us'])) for p, d in zip(pr, D))/len(D)
        reg = 0.0
        for c in sets:
            pick = min(c, key=lambda i: pr[i])
            reg += D[pick]['us']/min(D[i]['us'] for i in c) - 1
        return err + RANK_W*reg/len(sets)
    for _ in range(rounds):
        g = collections.defaultdict(list)
        for d in D: g[d['key']].append(math.log(d['us']/pred(d, P)))
        eff = {k: math.exp(sorted(v)[len(v)//2]) for k, v in g.items()}
        best = loss(P)
        for _ in range(iters):
            Q = dict(P); k = rnd.choice([x for x in Q if x not in FIXED]); Q[k] *= math.exp(rnd.gauss(0, 0.2))
            l = loss(Q)
            if l < best: best, P = l, Q
    return P, eff, best

def picks(D, P, eff):
    """Per candidate set ('natural', 'packed') and point (gpu, shape, rows per expert): the
    model's pick and the fastest measured candidate, as {which: [(point, pick, fastest)]}."""
    pts = collections.defaultdict(list)
    for d in D: pts[(d['gpu'], d['shape'], d['rows_per_expert'])].append(d)
    res = {}
    for which in ('natural', 'packed'):
        out = []
        for k, l in sorted(pts.items()):
            if which == 'natural':
                c = [d for d in l if (d['fam'] == 'mma' and d['variant'] in ('auto', 'feature_blocks_1')) or d['variant'] == 'natural_x']
            else: c = [d for d in l if d['packed']]
            if not c: continue
            fastest = min(c, key=lambda x: x['us'])
            pk = min(c, key=lambda x: pred(x, P)*eff.get(x['key'], 1.0))
            out.append((k, pk, fastest))
        res[which] = out
    return res

def regret(D, P, eff):
    return {w: [(pk['us']/f['us'] - 1, k) for k, pk, f in l] for w, l in picks(D, P, eff).items()}

def log_err(D, P, eff):   # mean |log(model / measured)|
    return sum(abs(math.log(pred(d, P)*eff.get(d['key'], 1.0)/d['us'])) for d in D)/len(D)

def tile_name(d):   # e.g. mma_w4m2n2k128s4 auto, mma_w4m1n1k128s4 auto nb=8, wgmma_w8m2n8k64s8 persistent
    return '%s_w%dm%dn%dk%ds%d %s%s' % (d['fam'], *d['t'], d['variant'], ' nb=%d' % d['nb'] if d['nb'] > 1 and d['variant'] == 'auto' else '')

def load_inc(path):
    """The global parameters and per-tile efficiency factors of a .inc as main() writes it."""
    P, eff = {}, {}
    for line in open(path):
        m = re.match(r'\s*\.(\w+)\s*=\s*([-+0-9.eE]+),', line)
        if m: P[m.group(1)] = float(m.group(2)); continue
        m = re.match(r'\s*\{FM_FAMILY_FP4MOE_(MMA|WGMMA), (\d+), (\d+), (\d+), (\d+), (\d+), (FM_VARIANT_\w+), ([-+0-9.eE]+)\},', line)
        if m:
            if m.group(7) not in FLAG: sys.exit('%s: unknown variant %s' % (path, m.group(7)))
            eff[('mma' if m.group(1) == 'MMA' else 'wgmma', tuple(int(m.group(i)) for i in range(2, 7)), FLAG[m.group(7)])] = float(m.group(8))
    miss = [k for k in P0 if k not in P]
    if miss or not eff: sys.exit('%s: not a .inc as this script writes it (parameters missing: %s; %d factors)' % (path, miss, len(eff)))
    return P, eff

def evaluate(D, csvs, P, eff, inc, thr):
    """--eval: the fit's report for the parameters and factors of a .inc, and the misses."""
    sets = candidate_sets(D)
    reg = sum(D[min(c, key=lambda i: pred(D[i], P)*eff.get(D[i]['key'], 1.0))]['us']/min(D[i]['us'] for i in c) - 1 for c in sets)/len(sets)
    print('%s (no fit): mean |log(model / measured)| over %d timings: %.3f (+ mean regret %.3f: %.3f, the objective a fit prints)'
          % (inc, len(D), log_err(D, P, eff), reg, log_err(D, P, eff) + RANK_W*reg))
    for w, r in regret(D, P, eff).items(): print('regret of the pick, %s X, %d points: %s' % (w, len(r), summary(r)))
    if len(csvs) > 1:
        for c in csvs:
            Dc = [d for d in D if d['src'] == c]
            print('%s: mean |log(model / measured)| over %d timings: %.3f' % (c, len(Dc), log_err(Dc, P, eff)))
            for w, r in regret(Dc, P, eff).items():
                if r: print('%s: regret of the pick, %s X, %d points: %s' % (c, w, len(r), summary(r)))
    nof = collections.Counter('%s_w%dm%dn%dk%ds%d %s' % (d['fam'], *d['t'], VARIANT[(d['fam'], int(d['key'][2]))]) for d in D if d['key'] not in eff)
    for n, cnt in sorted(nof.items()):
        print('no factor in %s (priced with 1.0, as cost_fp4moe.c efficiency() does): %s, %d timings' % (inc, n, cnt))
    print('points with regret > %.1f %% (gpu shape rows-per-expert set: the pick, measured us (model us); the fastest):' % (100*thr))
    for w, l in picks(D, P, eff).items():
        for k, pk, f in l:
            if pk['us']/f['us'] - 1 > thr:
                print('  %s %s %d %s X: pick %s %.1f us (%.1f); fastest %s %.1f us (%.1f); regret %.1f %%'
                      % (*k, w, tile_name(pk), pk['us'], pred(pk, P)*eff.get(pk['key'], 1.0),
                         tile_name(f), f['us'], pred(f, P)*eff.get(f['key'], 1.0), 100*(pk['us']/f['us'] - 1)))

def summary(r):
    v = sorted(x[0] for x in r)
    worst = max(r)
    return 'median %.1f %%, p90 %.1f %%, max %.1f %% (%s %s %d rows)' % (100*v[len(v)//2], 100*v[int(len(v)*0.9)], 100*worst[0], *worst[1])

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--csv', action='append', help='tile timings (bench/tiles_to_csv.py); repeat for several '
                    '(default: bench/h200_fp4moe_tiles.csv)')
    ap.add_argument('--out', default='src/kernels/fp4moe_cost_h200.inc')
    ap.add_argument('--cv', action='store_true')
    ap.add_argument('--eval', metavar='INC', help='fit nothing: report the parameters and factors of INC '
                    '(e.g. src/kernels/fp4moe_cost_h200.inc) over the --csv timings')
    ap.add_argument('--miss', type=float, default=0.03, help='--eval: list the points whose regret is over this (0.03)')
    a = ap.parse_args()
    REGTAB.update(load_regs())
    csvs = a.csv or ['bench/h200_fp4moe_tiles.csv']
    D = [d for c in csvs for d in load(c)]
    if a.eval:
        P, eff = load_inc(a.eval)
        evaluate(D, csvs, P, eff, a.eval, a.miss)
        return
    P, eff, l = fit(D)
    lines = ['mean |log(model / measured)| over %d timings: %.3f' % (len(D), l)]
    for w, r in regret(D, P, eff).items(): lines.append('regret of the pick, %s X, %d points: %s' % (w, len(r), summary(r)))
    if len(csvs) > 1:
        for c in csvs:
            for w, r in regret([d for d in D if d['src'] == c], P, eff).items():
                if r: lines.append('%s: regret of the pick, %s X, %d points: %s' % (c, w, len(r), summary(r)))
    if a.cv:
        for sh in sorted({(d['gpu'], d['shape']) for d in D}):   # one fit per shape left out: ~75 s each here
            P2, e2, _ = fit([d for d in D if (d['gpu'], d['shape']) != sh])
            for w, r in regret([d for d in D if (d['gpu'], d['shape']) == sh], P2, e2).items():
                lines.append('fitted without %s %s, regret there, %s X: %s' % (*sh, w, summary(r)))
    for s in lines: print(s)
    meta = [s[2:] for c in csvs for s in open(c).read().splitlines() if s.startswith('# ') and 'generated' not in s]
    o = ['/* fp4moe_cost_h200.inc - generated by bench/fit_tile_model.py from %s; do not edit by hand.' % ', '.join(csvs)]
    o += [' * %s' % s for s in meta]
    o += [' * %s' % s for s in lines]
    o += [' * Included by src/kernels/cost_fp4moe.c: the model there, its parameters here. */']
    o.append('static const fm_cost_params k_cost_h200 = {')
    for k in P0: o.append('    .%s = %.9g,' % (k, P[k]))  # 9 digits: the C model's ranking must equal the fit's (near ties)
    o.append('};')
    o.append('/* family, warps, mt, nt, kc, stages, multi-block (mma) or packed X (wgmma; 2: persistent), efficiency */')
    o.append('static const fm_cost_eff k_eff_h200[] = {')
    for (fam, t, flag), v in sorted(eff.items()):
        o.append('    {%s, %d, %d, %d, %d, %d, %s, %.6f},' % ('FM_FAMILY_FP4MOE_MMA' if fam == 'mma' else 'FM_FAMILY_FP4MOE_WGMMA', *t, VARIANT[(fam, int(flag))], v))  # 6 decimals: see the parameters
    o.append('};')
    open(a.out, 'w').write('\n'.join(o) + '\n')
    print('wrote', a.out)

if __name__ == '__main__':
    main()
