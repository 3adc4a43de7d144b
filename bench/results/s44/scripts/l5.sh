#!/bin/bash
# l5: what the list attention waits for: base with the stamps (ph), and the same without its table rows' copies
# (notab) or without its K and V rows' copies (nokv: zero-filled), scripts/l5-diag.diff; v2ph as in l4. Wrong
# outputs by construction: timings only. bench_kernels --list, two rounds.
source bench/gpu_pack_env.sh
for r in 1 2; do for v in ph notab nokv v2ph; do echo "== $v round $r"; $R/$v/bench_kernels --list 2>&1 | grep -v "^summary\|ceiling\|cuBLAS\|^device\|^kernel"; done; done > $O/list.txt 2>&1
grep -E "^==|graph" $O/list.txt
