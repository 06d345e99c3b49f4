#!/usr/bin/env python3
"""tile_model.py - a first per-tile cost model for fp4moe's grouped-GEMM tiles,
fitted to bench/h200_fp4moe_tiles.csv (every tile's time of the third-session
full run) by random search on the mean |log(pred / measured)|, and the regret
of picking the model's fastest tile at each measured point (natural X: mma
tiles + natural-X wgmma; mma only; packed X: wgmma). A probe towards the
planner ranking the fp4moe tiles (issue 4), not used by the library:
    python3 bench/probe/tile_model.py        (from the repository root)
Model: CTAs per SM from the shared-memory model and the launch-bounds hint;
per CTA a prologue plus, per stage, the largest of its bytes at the chip's
bandwidth shared by the SM's CTAs, its instructions at a fitted issue rate, and
its tensor work; waves = CTAs / (SMs x CTAs per SM)."""
import csv, math, random, collections
rows=[r for r in csv.reader(l for l in open('bench/h200_fp4moe_tiles.csv') if not l.startswith('#'))]
hdr=rows[0]; D=[dict(zip(hdr,r)) for r in rows[1:]]
for d in D:
    for k in ('experts','n','k','rows_per_expert','warps','mt','nt','kc','stages','default'): d[k]=int(d[k])
    d['us']=float(d['us'])
SMS=132; SMEM=233472
def minb(W,MT,NT,KC,S):
    sm=S*(W*MT*(KC//64)*576+8*NT*(2*KC+16))+1024
    b=1 if NT>2 else 225*1024//sm
    r=65536//(W*32*64); b=min(b,r); return max(1,min(8,b))
def smem_sw(W,MT,NT,KC,S): return S*(W*MT*(KC//64)*576+8*NT*(2*KC+16))
def smem_wg(W,MT,NT,KC,S):
    chunks=W*MT*(KC//64)
    a=chunks*576+16*NT*KC
    a=(a+1023)//1024*1024
    return S*(a+16)
def model(d,P):
    E,N,K,m=d['experts'],d['n'],d['k'],d['rows_per_expert']
    W,MT,NT,KC,S=d['warps'],d['mt'],d['nt'],d['kc'],d['stages']
    TOK=8*NT; passes=math.ceil(m/TOK); F=16*W*MT
    B=math.ceil(N/F); nks=math.ceil(K/KC)
    wst=F*KC*(0.5+1/16); xst=TOK*KC*2
    if d['family']=='mma':
        sm=smem_sw(W,MT,NT,KC,S); O=min(minb(W,MT,NT,KC,S), SMEM//(sm+1024))
        if NT>2: O=min(SMEM//(sm+1024), max(1,65536//(240*W*32)))
        O=max(O,1)
        nb=1
        if d['variant']=='auto' and K<=512 and NT==1 and (W,MT,KC,S) in [(8,1,64,4),(4,1,128,8),(4,1,128,4),(4,2,128,8),(4,1,256,3),(4,2,256,3),(4,2,128,4),(4,4,128,3)]:
            c=B*E/(16*132); nb=8 if c>=8 else (int(c) if c>=2 else 1)
        if d['variant']=='feature_blocks_4': nb=4
        ctas=E*math.ceil(B/nb)
        # per stage per CTA
        bands=W*MT; chunks=bands*(KC//64)
        iss=W*( MT*(KC//64)*(4*P['dec']+4*NT*P['mma']) + (KC//64)*2*NT + P['stg'])  # warp-instr per stage
        tc=chunks*4*NT*4096*2/P['rmma']   # tensor seconds at SM rate
        per_stage=lambda O: max((wst+xst)*O*SMS/P['bw'], iss*O/(4*1.9e9*P['u']), tc*O)
        t_cta=P['L0']+nb*passes*(nks*per_stage(O)+P['epi']*TOK*F*2*O*SMS/P['bw'])
        waves=ctas/(SMS*O)
        return (max(1.0,waves)*t_cta)*1e6+P['launch']
    else:
        sm=smem_wg(W,MT,NT,KC,S); O=max(1,min(SMEM//(sm+1024), 2048//((W+4)*32)))
        ctas=E*B*passes
        iss=W*(MT*(KC//64)*(4*P['dec']+P['wgi']*4)+P['stg'])
        if d['variant']=='natural_x': iss+=TOK*KC*2/16/32*P['natx']*W/ W*4
        tc=F*TOK*KC*2/P['rwg']
        per_stage=lambda O: max((wst+xst)*O*SMS/P['bw'], iss*O/(4*1.9e9*P['u']), tc*O)
        t_cta=P['L0w']+nks*per_stage(O)+P['epi']*TOK*F*2*O*SMS/P['bw']
        waves=ctas/(SMS*O)
        return (max(1.0,waves)*t_cta)*1e6+P['launch']
P=dict(bw=4.0e12,dec=13,mma=1.0,stg=60,u=0.7,rmma=1.5e12,L0=2e-6,epi=1.0,launch=3,wgi=2,natx=2,rwg=5.0e12,L0w=3e-6)
def loss(P):
    s=0
    for d in D:
        p=model(d,P); s+=abs(math.log(p/d['us']))
    return s/len(D)
pts=collections.defaultdict(list)
for d in D: pts[(d['shape'],d['rows_per_expert'])].append(d)
def regret(P, which):
    out=[]
    for k,l in pts.items():
        if which=='natural': c=[d for d in l if (d['family']=='mma' and d['variant']=='auto') or d['variant']=='natural_x']
        elif which=='mma': c=[d for d in l if d['family']=='mma' and d['variant']=='auto']
        else: c=[d for d in l if d['variant'] in ('packed_x',)]
        if not c: continue
        b=min(x['us'] for x in c); pk=min(c,key=lambda x:model(x,P)); out.append((pk['us']/b-1,k))
    out.sort(); return out
random.seed(2)
best=(loss(P),dict(P))
for it in range(4000):
    Q=dict(best[1]); k=random.choice(list(Q)); Q[k]*=math.exp(random.gauss(0,0.25))
    l=loss(Q)
    if l<best[0]: best=(l,Q)
print("mean |log err|",best[0]); print({k:round(v,4) if v<1e3 else '%.3g'%v for k,v in best[1].items()})
for w in ('natural','mma','packed'):
    r=regret(best[1],w); print(w, 'n',len(r),'median %.3f p90 %.3f max %.3f'%(r[len(r)//2][0], r[int(len(r)*0.9)][0], r[-1][0]), r[-3:])
