import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
tot = collections.Counter(); n_exec = 0; samples = 0
seq = []
for r in data:
    if len(r) < len(hdr): continue
    s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
    e = int(r[ix["Instructions Executed"]] or 0)
    samples += s; n_exec += e
    for h in stalls: tot[h] += int(r[ix[h]] or 0)
    seq.append((r[ix["Address"]], r[ix["Source"]].strip(), s, e, {h: int(r[ix[h]] or 0) for h in stalls}))
print("instructions", len(seq), "executed warp-instr", n_exec, "samples", samples)
print("stalls:", ", ".join(f"{k[6:]}={v}" for k, v in tot.most_common(10)))
# per region: chunk the sass into 40 segments by cumulative samples
print("top instructions by samples:")
for a, src, s, e, st in sorted(seq, key=lambda x: -x[2])[:25]:
    top = max(st, key=st.get)
    print(f"{a[-5:]} {s:5d} exec={e:6d} {top[6:]:12s} {src[:70]}")
# cumulative profile over address order, 30 bins
N = len(seq); B = 30
for b in range(B):
    part = seq[b*N//B:(b+1)*N//B]
    s = sum(x[2] for x in part); e = sum(x[3] for x in part)
    c = collections.Counter()
    for x in part: c.update(x[4])
    print(f"bin {b:2d} [{part[0][0][-5:]}..] samples={s:5d} exec={e:7d} " + " ".join(f"{k[6:]}={v}" for k, v in c.most_common(3)) + " | " + part[0][1][:40])
